"""Recovery table: where each journaled state resumes after a restart."""

from __future__ import annotations

import pytest

from agent.lifecycle.journal import Journal
from agent.lifecycle.recovery import MAX_ATTEMPTS, plan, recover
from agent.lifecycle.slots import ModelSlots, SlotEntry
from agent.lifecycle.states import Event, State

PATH = [Event.ACCEPT, Event.FETCHED, Event.VERIFIED, Event.QUALIFIED, Event.ACTIVATED]
SHA = "a" * 64


def _at(j: Journal, state: State, model="m", version="2"):
    dep = j.create(model, version, {"kind": "inbox", "path": "/nowhere"}, sha256=SHA)
    for ev in PATH:
        if dep.state is state:
            break
        j.apply(dep, ev)
    assert dep.state is state
    return dep


@pytest.mark.parametrize("state", [State.RECEIVED, State.DOWNLOADING, State.VERIFYING, State.QUALIFYING])
def test_early_states_resume_in_place(tmp_path, state):
    j, slots = Journal(tmp_path), ModelSlots(tmp_path)
    dep = _at(j, state)
    resumed = recover(j, slots)
    assert [d.id for d in resumed] == [dep.id]
    assert j.load(dep.id).state is state


@pytest.mark.parametrize("state", [State.ACTIVATING, State.PROBATION])
def test_interrupted_activation_rolls_back_to_the_committed_slot(tmp_path, state):
    j, slots = Journal(tmp_path), ModelSlots(tmp_path)
    slots.commit(
        "m", SlotEntry.from_data({"version": "1", "sha256": "b" * 64, "provider": "cpu", "deployment_id": "old"})
    )
    dep = _at(j, state)
    assert recover(j, slots) == []
    done = j.load(dep.id)
    assert done.state is State.ROLLED_BACK and state.value in done.reason
    assert slots.committed("m").version == "1"


def test_a_commit_that_landed_before_the_crash_is_recognised(tmp_path):
    j, slots = Journal(tmp_path), ModelSlots(tmp_path)
    dep = _at(j, State.PROBATION)
    slots.commit("m", SlotEntry.from_data({"version": "2", "sha256": SHA, "provider": "cpu", "deployment_id": dep.id}))
    recover(j, slots)
    assert j.load(dep.id).state is State.COMMITTED


def test_a_crash_loop_gives_up_after_max_attempts(tmp_path):
    j, slots = Journal(tmp_path), ModelSlots(tmp_path)
    dep = _at(j, State.QUALIFYING)
    for _ in range(MAX_ATTEMPTS - 1):
        assert recover(j, slots)  # resumed: the daemon "crashes" again in the same state
    assert recover(j, slots) == []
    done = j.load(dep.id)
    assert done.state is State.FAILED and "crash loop" in done.reason


def test_only_the_newest_in_flight_deployment_of_a_model_resumes(tmp_path):
    j, slots = Journal(tmp_path), ModelSlots(tmp_path)
    old = _at(j, State.QUALIFYING, version="2")
    new = _at(j, State.RECEIVED, version="3")
    steps = {s.deployment.id: s.event for s in plan(j, slots)}
    assert steps == {old.id: Event.SUPERSEDE, new.id: Event.RESUME}
    recover(j, slots)
    assert j.load(old.id).state is State.FAILED and "superseded by version 3" in j.load(old.id).reason


def test_slots_keep_committed_and_previous(tmp_path):
    slots = ModelSlots(tmp_path)
    for v, sha in (("1", "1" * 64), ("2", "2" * 64), ("3", "3" * 64)):
        slots.commit("m", SlotEntry.from_data({"version": v, "sha256": sha, "provider": "cpu"}))
    s = slots.get("m")
    assert (s["committed"].version, s["previous"].version) == ("3", "2")
    slots.swap("m")
    s = slots.get("m")
    assert (s["committed"].version, s["previous"].version) == ("2", "3")
    assert slots.referenced() == {"2" * 64, "3" * 64}


def test_gc_keeps_what_slots_reference_and_drops_the_rest(tmp_path):
    from agent.artifacts.store import ContentStore
    from agent.lifecycle.slots import gc

    store = ContentStore(tmp_path)
    shas = [store.put_bytes(f"blob {i}".encode()) for i in range(3)]
    for sha in shas:
        (tmp_path / "packages" / sha).mkdir(parents=True)
    (tmp_path / "packages" / f".{shas[0]}.123.tmp").mkdir()  # an unpack in progress is left alone
    slots = ModelSlots(tmp_path)
    for i in (1, 2):
        slots.commit("m", SlotEntry.from_data({"version": str(i), "sha256": shas[i], "provider": "cpu"}))
    gc(tmp_path, store, slots.referenced())
    assert store.list() == sorted(shas[1:])
    assert sorted(p.name for p in (tmp_path / "packages").iterdir()) == sorted([*shas[1:], f".{shas[0]}.123.tmp"])


def test_fsck_reports_missing_and_corrupt_blobs(tmp_path):
    from agent.artifacts.store import ContentStore
    from agent.lifecycle.fsck import check_state_dir

    store = ContentStore(tmp_path)
    good = store.put_bytes(b"model one")
    slots = ModelSlots(tmp_path)
    slots.commit("m", SlotEntry.from_data({"version": "1", "sha256": good, "provider": "cpu"}))
    slots.commit("m", SlotEntry.from_data({"version": "2", "sha256": "c" * 64, "provider": "cpu"}))
    assert check_state_dir(tmp_path) == ["m committed (version 2): blob cccccccccccc is missing"]
    store.path(good).chmod(0o644)
    store.path(good).write_bytes(b"tampered")
    assert "does not match its sha256" in check_state_dir(tmp_path)[1]
