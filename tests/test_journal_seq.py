"""Deployments are ordered by the journal's own sequence, never by the wall clock (issue 29, item 7): after a
backward clock step the newest deployment is still the latest; journals written before the field still load."""

from __future__ import annotations

import json

from agent.lifecycle.journal import Journal
from agent.lifecycle.states import State
from agent.lifecycle.status_doc import build_status


def _set(journal: Journal, dep_id: str, **fields) -> None:
    path = journal.path(dep_id)
    doc = json.loads(path.read_bytes())
    doc.update(fields)
    path.write_text(json.dumps(doc))


def test_a_backward_clock_step_does_not_reorder_deployments(tmp_path):
    journal = Journal(tmp_path)
    v2 = journal.create("m", "2", {"kind": "inbox"})
    journal.apply(v2, "accept")
    # v2 was written before the clock stepped back by an hour: its wall-clock stamps are an hour ahead of v3's
    _set(journal, v2.id, created=v2.created + 3600, updated=v2.updated + 3600)
    journal = Journal(tmp_path)  # a restart: the sequence continues from the records
    v3 = journal.create("m", "3", {"kind": "inbox"})
    assert v3.seq > journal.load(v2.id).write_seq > 0
    assert journal.latest_per_model()["m"].version == "3"
    journal.apply(v3, "accept")
    doc = build_status(tmp_path, device_id="dev-1")  # what `edge-agent status` shows: v3, the newer one
    assert doc["deployments"]["m"]["version"] == "3" and doc["recent_deployments"][0]["version"] == "3"
    assert [d.version for d in journal.all()] == ["2", "3"]
    assert [d.version for d in journal.recent()] == ["3", "2"]
    journal.apply(journal.load(v2.id), "fail", reason="x")  # v2 written last: first in recent, v3 still latest
    assert [d.version for d in journal.recent()] == ["2", "3"]
    assert journal.latest_per_model()["m"].version == "3"


def test_old_journals_without_the_sequence_load_and_order_by_creation(tmp_path):
    journal = Journal(tmp_path)
    old = [journal.create("m", v, {"kind": "inbox"}) for v in ("1", "2")]
    for n, dep in enumerate(old):
        doc = json.loads(journal.path(dep.id).read_bytes())
        del doc["seq"], doc["write_seq"]
        doc["created"] = doc["updated"] = 1000.0 + n
        journal.path(dep.id).write_text(json.dumps(doc))
    journal = Journal(tmp_path)
    assert [(d.version, d.seq) for d in journal.all()] == [("1", 0), ("2", 0)]
    assert journal.latest_per_model()["m"].version == "2"
    new = journal.create("m", "3", {"kind": "inbox"})  # its wall clock is far later, but that is not why
    assert new.seq == 1 and journal.latest_per_model()["m"].version == "3"
    assert journal.load(new.id).state is State.RECEIVED
