"""StatusWriter and Reporter (agent.services.status_writer, agent.services.report) on a real tmp state_dir: status.json
written 0600 and published, nothing written after close(); transitions published and retries kept for status
until the deployment moves on; a rejection rewrites status once, on the next tick."""

from __future__ import annotations

import json
import stat

from agent.lifecycle.status_doc import status_path
from agent.services.report import Reporter
from agent.services.status_writer import StatusWriter


def test_written_published_and_nothing_after_close(tmp_path):
    published, notified, n = [], [], [0]

    def document():
        n[0] += 1
        return {"n": n[0]}

    w = StatusWriter(tmp_path, document, lambda e: None, publish=published.append, notify=lambda: notified.append(1))
    assert w.write() == {"n": 1}
    path = status_path(tmp_path)
    assert json.loads(path.read_text()) == {"n": 1} and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert published == [{"n": 1}] and notified == [1] and w.disk_full is None
    w.close()
    assert w.write() == {"n": 2}  # still answered, no longer written or published
    assert json.loads(path.read_text()) == {"n": 1} and len(published) == 1 and len(notified) == 1


def test_transitions_retries_and_rejections(tmp_path):
    events, published, writes = [], [], []
    r = Reporter(events.append, lambda: writes.append(dict(r.retrying)), publish_event=published.append)
    r.on_transition({"model": "m", "progress": "chunk", "done": 3})
    assert events[-1]["event"] == "progress" and writes == [] and published == []
    retry = {"model": "m", "progress": "retry", "deployment_id": "d1", "version": "2", "attempt": 1}
    r.on_transition({**retry, "wait_s": 2.0, "reason": "broker gone", "ts": 1.0, "extra": "x"})
    kept = {"deployment_id": "d1", "version": "2", "attempt": 1, "wait_s": 2.0, "reason": "broker gone", "ts": 1.0}
    assert r.retrying == {"m": kept} and writes == [{"m": kept}] and published == []
    r.on_transition({"model": "m", "state": "verifying", "deployment_id": "d1"})
    assert r.retrying == {} and published == [{"model": "m", "state": "verifying", "deployment_id": "d1"}]
    assert events[-1]["event"] == "transition" and len(writes) == 2
    r.on_rejected({"model": "m", "reason": "bad_signature: x"})
    r.on_rejected({"model": "n", "reason": "expired: y"})
    assert events[-1] == {"event": "rejected", "model": "n", "reason": "expired: y"} and len(writes) == 2
    r.tick()
    r.tick()
    assert len(writes) == 3  # once for both rejections
