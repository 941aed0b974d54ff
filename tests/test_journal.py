"""The deployment journal: atomic records, legal histories, robust loading."""
from __future__ import annotations

import json

import pytest

from agent.errors import LifecycleError
from agent.lifecycle.journal import Journal, check_history
from agent.lifecycle.states import Event, State


def test_records_follow_the_table_and_survive_a_reload(tmp_path):
    j = Journal(tmp_path)
    dep = j.create("resnet", "3", {"kind": "inbox", "path": "/x"})
    for ev in (Event.ACCEPT, Event.FETCHED):
        j.apply(dep, ev)
    j.apply(dep, Event.FAIL, reason="verifying: hash mismatch", sha256="ab" * 32)
    again = Journal(tmp_path).load(dep.id)
    assert again.state is State.FAILED and again.result == "failed"
    assert again.reason == "verifying: hash mismatch" and again.data["sha256"] == "ab" * 32
    assert [h["state"] for h in again.history] == ["received", "downloading", "verifying", "failed"]
    assert check_history(again) == []
    assert again.summary()["result"] == "failed"


def test_illegal_event_raises_and_leaves_the_record_unchanged(tmp_path):
    j = Journal(tmp_path)
    dep = j.create("m", "1", {"kind": "inbox"})
    before = j.path(dep.id).read_bytes()
    with pytest.raises(LifecycleError, match="illegal transition"):
        j.apply(dep, Event.PASSED)
    assert j.path(dep.id).read_bytes() == before


@pytest.mark.parametrize("name", ["../etc", "a/b", "", ".hidden", "x" * 65, "a+b", "a#"])
def test_unsafe_names_are_refused(tmp_path, name):
    with pytest.raises(LifecycleError, match="invalid model name"):
        Journal(tmp_path).create(name, "1", {})
    assert list((tmp_path / "deployments").iterdir()) == []


def test_stray_temp_files_and_garbage_are_ignored(tmp_path):
    j = Journal(tmp_path)
    dep = j.create("m", "1", {"kind": "inbox"})
    (j.root / f".{dep.id}.json.abc.tmp").write_text("{half")  # a crash before the rename
    (j.root / "broken.json").write_text("{not json")
    (j.root / "other.json").write_text(json.dumps({"id": "other"}))
    assert [d.id for d in j.all()] == [dep.id]
    assert j.clean_temp() == 1
    assert not any(p.name.endswith(".tmp") for p in j.root.iterdir())


def test_check_history_finds_a_forged_jump(tmp_path):
    j = Journal(tmp_path)
    dep = j.create("m", "1", {"kind": "inbox"})
    dep.history.append({"state": "committed", "event": "accept", "ts": 0})
    dep.state = State.COMMITTED
    problems = check_history(dep)
    assert problems and "not in the table" in problems[0]


def test_prune_keeps_the_newest_terminal_records(tmp_path):
    j = Journal(tmp_path)
    deps = []
    for v in range(5):
        d = j.create("m", str(v), {"kind": "inbox"})
        j.apply(d, Event.CANCEL, reason="x")
        deps.append(d)
    live = j.create("m", "9", {"kind": "inbox"})
    assert j.prune(keep_per_model=2) == 3
    assert {d.id for d in j.all()} == {deps[3].id, deps[4].id, live.id}
