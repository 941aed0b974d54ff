"""The deployment journal: atomic records, legal histories, robust loading."""

from __future__ import annotations

import json
import os
import threading
import time

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
    old = j.root / f".{dep.id}.json.abc.tmp"
    old.write_text("{half")  # a crash before the rename, long ago
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    fresh = j.root / f".{dep.id}.json.def.tmp"
    fresh.write_text("{half")  # maybe a write in progress elsewhere: never touched
    (j.root / "broken.json").write_text("{not json")
    (j.root / "other.json").write_text(json.dumps({"id": "other"}))
    assert [d.id for d in j.all()] == [dep.id]
    assert j.clean_temp() == 1
    assert not old.exists() and fresh.exists()


def test_clean_temp_never_breaks_writes_in_progress(tmp_path):
    """The crash seen under load: start-up cleaning deleted another writer's temp file between mkstemp and
    chmod (FileNotFoundError in Journal.save). Writers and cleaners now run side by side without errors."""
    writer, cleaner = Journal(tmp_path), Journal(tmp_path)
    deps = [writer.create("m", str(i), {"kind": "inbox"}) for i in range(4)]
    errors, stop = [], threading.Event()

    def write():
        try:
            for _ in range(150):
                for d in deps:
                    writer.save(d)
        except Exception as exc:  # noqa: BLE001 - any failure is the bug
            errors.append(repr(exc))
        finally:
            stop.set()

    t = threading.Thread(target=write)
    t.start()
    cleaned = 0
    while not stop.is_set():
        cleaned += cleaner.clean_temp()
    t.join(120)
    assert errors == [] and cleaned == 0
    assert sorted(d.id for d in cleaner.all()) == sorted(d.id for d in deps)


def test_a_failed_write_leaves_the_record_as_it_was(tmp_path, monkeypatch):
    import agent.lifecycle.journal as jmod

    j = Journal(tmp_path)
    dep = j.create("m", "1", {"kind": "inbox"})

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jmod, "atomic_write_json", disk_full)
    with pytest.raises(OSError):
        j.apply(dep, Event.ACCEPT)
    assert dep.state is State.RECEIVED and len(dep.history) == 1 and dep.attempts == {}
    monkeypatch.undo()
    j.apply(dep, Event.ACCEPT)
    assert j.load(dep.id).state is State.DOWNLOADING and check_history(j.load(dep.id)) == []


def test_a_closed_journal_refuses_writes(tmp_path):
    j = Journal(tmp_path)
    dep = j.create("m", "1", {"kind": "inbox"})
    before = j.path(dep.id).read_bytes()
    j.close()
    with pytest.raises(LifecycleError, match="closed"):
        j.apply(dep, Event.ACCEPT)
    assert j.path(dep.id).read_bytes() == before and dep.state is State.RECEIVED
    assert [d.id for d in j.all()] == [dep.id]  # reading still works


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
