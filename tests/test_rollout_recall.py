"""An operator's roll back of a service rollout (agent.fleet.rollout_recall) on the engine, its state in a real
SQLite database: every device that took or is taking the version goes back, whatever cohort or wave (a cohort
that completed included), the roll back is a tracked operation with a result, and asking again rolls back
whatever still runs the version. Per device, `waiting_for` says what the rollout waits for."""

from __future__ import annotations

from test_controlplane_knobs import Clock, _saved
from test_controlplane_knobs import _engine as knobs_engine
from test_rollout_plan import _Fleet, _fleet

from agent.fleet import rollout_state as rs


def _engine(tmp_path, fleet, clock, **spec_kw):
    """A rollout of m 2 to the lab group with no knobs, running on the engine (test_controlplane_knobs's setup)."""
    return knobs_engine(tmp_path, fleet, {}, clock, **spec_kw)


def _on(fleet, version):
    return {d for d, doc in fleet.st.items() if (doc["models"].get("m") or {}).get("version") == version}


def test_roll_back_returns_a_completed_cohort_and_a_halted_one_and_can_be_repeated(tmp_path):
    fleet, clock = _Fleet(_fleet()), Clock()
    factory, eng = _engine(tmp_path, fleet, clock, cohort_by="target", canary="1", wave_size="100%", deadline_s=60)
    eng.step()
    fleet.report("nuc-0", "2")
    fleet.report("pi-0", "2")
    eng.step()  # both canaries took 2: the next waves start
    for dev in ("nuc-1", "nuc-2", "nuc-3"):
        fleet.report(dev, "2")
    fleet.report("pi-1", "2")
    eng.step()
    assert eng.state["cohorts"]["intel-nuc"]["state"] == rs.COMPLETED  # the nuc cohort finished on 2
    assert eng.state["cohorts"]["raspberry-pi-5"]["state"] == rs.RUNNING  # pi-2..5 are still installing
    took = _on(fleet, "2")
    assert took == {"nuc-0", "nuc-1", "nuc-2", "nuc-3", "pi-0", "pi-1"}

    op = eng.operator_rollback("rolled back by operator:alice", "rolled back by operator:alice (request 1)")
    assert op["state"] == "running" and op["attempts"] == 1
    devices = eng.state["devices"]
    # every device that took 2 or was installing it, in both cohorts, is told to go back to 1
    told = {d for d, env in fleet.desired.items() if env and env["manifest"]["rollback"]}
    assert took | {"pi-2", "pi-3", "pi-4", "pi-5"} <= told
    assert {d for d, v in devices.items() if v["result"] == rs.ROLLBACK_PENDING} == told
    summary = {d["device_id"]: d for d in rs.summary(eng.state)["devices"]}
    assert summary["nuc-0"]["waiting_for"].startswith("a verified report that it runs 1 again")

    for dev in took - {"nuc-3"}:  # every one but nuc-3 confirms 1; pi-2..5 never installed 2
        fleet.report(dev, "1")
    for dev in ("pi-2", "pi-3", "pi-4", "pi-5"):
        fleet.report(dev, "1")
    eng.step()
    assert eng.state["state"] not in rs.ROLLOUT_FINAL  # nuc-3 has not answered
    clock.t += 61  # its roll back deadline passes
    eng.step()
    saved = _saved(factory)
    assert saved.phase == "finished" and saved.state["state"] == rs.HALTED
    op = saved.state["rollback"]
    assert op["state"] == "incomplete" and op["remaining"] == ["nuc-3"], op
    assert saved.state["devices"]["nuc-3"]["result"] == rs.ROLLBACK_FAILED
    assert rs.summary(saved.state)["devices"][[d for d in sorted(devices)].index("nuc-3")]["waiting_for"]

    # asked again: only what still runs 2 is told again, and this time it goes back
    fleet.desired.clear()
    op = eng.operator_rollback("rolled back by operator:bob", "rolled back by operator:bob (request 2)")
    assert op["attempts"] == 2 and set(fleet.desired) == {"nuc-3"}
    fleet.report("nuc-3", "1")
    eng.step()
    saved = _saved(factory)
    assert saved.state["rollback"]["state"] == "done" and saved.state["rollback"]["remaining"] == []
    assert _on(fleet, "2") == set() and saved.phase == "finished"
    results = {v["result"] for v in saved.state["devices"].values()}
    assert results <= {rs.ROLLED_BACK, rs.CANCELLED}, results

    # once more with nothing left on 2: accepted, nothing published, done at once
    fleet.desired.clear()
    op = eng.operator_rollback("rolled back by operator:bob", "rolled back by operator:bob (request 3)")
    assert op["state"] == "done" and op["attempts"] == 3 and fleet.desired == {}


def test_waiting_for_names_the_wave_and_the_version(tmp_path):
    fleet, clock = _Fleet(_fleet()), Clock()
    factory, eng = _engine(tmp_path, fleet, clock, cohort_by=None, canary="1", wave_size="50%", deadline_s=100)
    eng.step()
    clock.t += 40
    rows = {d["device_id"]: d for d in rs.summary(eng.state)["devices"]}
    (canary,) = [d for d, r in rows.items() if r["result"] == rs.IN_PROGRESS]
    assert rows[canary]["waiting_for"].startswith("a verified report that it committed 2 after probation")
    waiting = [r["waiting_for"] for r in rows.values() if r["result"] == rs.PENDING]
    assert waiting and all(w.startswith("wave ") for w in waiting)
    fleet.report(canary, "2")
    eng.step()
    assert {d["device_id"]: d for d in rs.summary(eng.state)["devices"]}[canary]["waiting_for"] is None
