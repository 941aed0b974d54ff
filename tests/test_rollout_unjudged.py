"""A wave with devices "not judged" does not advance without an operator's word (issue 36): the control plane's
engine (its state in a real SQLite database) holds the cohort, says how many wait, and the operator's word
accepts them (the next wave starts) or rolls them alone back (signed rollbacks; the wave advances once they
answered). A rollout with halt_on_unjudged counts them as failures instead and never holds."""

from __future__ import annotations

from test_controlplane_knobs import Clock
from test_rollout_plan import _Fleet, _fleet
from test_rollout_recall import _engine, _saved

from agent.fleet import rollout_hold as hold
from agent.fleet import rollout_state as rs


def _not_judged(fleet, dev, version="2"):
    fleet.report(dev, version)
    dep = fleet.st[dev]["deployments"]["m"]
    dep["probation"] = {"requests": 800, "not_judged": {"measured": 3, "needed": 64, "contended": 797}}


def _wave(eng, key="all"):
    cohort = eng.state["cohorts"][key]
    return cohort["waves"][cohort["wave"]]


def _canary_not_judged(tmp_path, wave_size="2", **spec):
    """A rollout (canary 1, deadline 60 s) whose canary has just reported its version "not judged", before the engine
    looked again: (database factory, fleet, clock, engine, canary)."""
    fleet, clock = _Fleet(_fleet()), Clock()
    factory, eng = _engine(tmp_path, fleet, clock, canary="1", wave_size=wave_size, deadline_s=60, **spec)
    eng.step()
    (canary,) = _wave(eng)
    _not_judged(fleet, canary)
    return factory, fleet, clock, eng, canary


def test_a_wave_with_devices_not_judged_waits_for_the_operators_word_then_advances(tmp_path):
    factory, fleet, _, eng, canary = _canary_not_judged(tmp_path)
    for _ in range(3):  # however often it looks: the next wave does not start
        eng.step()
    cohort = eng.state["cohorts"]["all"]
    assert cohort["wave"] == 0 and cohort["waiting"] == "waiting for operator: 1 device not judged"
    assert set(fleet.desired) == {canary}  # nobody else was told
    doc = rs.summary(_saved(factory).state)
    assert doc["waiting_for_operator"] == [canary] and doc["cohorts"]["all"]["waiting"] == cohort["waiting"]
    row = {d["device_id"]: d for d in doc["devices"]}[canary]
    assert row["result"] == rs.NOT_JUDGED and row["waiting_for"].startswith("an operator's word")

    op = eng.decide_unjudged("accept by operator:alice (request 1)")
    assert op["devices"] == [canary] and op["action"] == hold.ACCEPT
    eng.step()
    assert cohort["wave"] == 1 and cohort["waiting"] is None and len(fleet.desired) == 3  # the next wave started
    d = eng.state["devices"][canary]
    assert d["result"] == rs.NOT_JUDGED and d["operator"] == "accepted by operator:alice" and not d["held"]

    first, second = _wave(eng)
    fleet.report(first, "2")
    _not_judged(fleet, second)
    eng.step()
    assert cohort["wave"] == 1 and cohort["waiting"] == "waiting for operator: 1 device not judged"
    fleet.desired.clear()
    eng.decide_unjudged("rollback by operator:bob (request 2)")
    assert fleet.desired[second]["manifest"] == {"name": "m", "version": "1", "rollback": True}
    assert set(fleet.desired) == {second}  # only the device not judged goes back
    eng.step()
    assert cohort["wave"] == 1  # it waits for that device to answer
    assert rs.summary(eng.state)["devices"][sorted(eng.state["devices"]).index(second)]["waiting_for"].startswith(
        "a verified report that it runs 1 again"
    )
    fleet.report(second, "1")
    fleet.st[second]["models"]["m"]["previous"] = "2"
    eng.step()
    assert eng.state["devices"][second]["result"] == rs.ROLLED_BACK
    assert "rolled back by operator:bob" in eng.state["devices"][second]["reason"]
    assert cohort["wave"] == 2 and eng.state["state"] == rs.RUNNING  # not a failure: the rollout goes on
    assert _saved(factory).state["unjudged"]["request"] == "rollback by operator:bob (request 2)"


def test_an_unanswered_roll_back_of_a_device_not_judged_fails_at_the_deadline(tmp_path):
    _, _, clock, eng, canary = _canary_not_judged(tmp_path, wave_size="100%")
    eng.step()
    eng.decide_unjudged("rollback by operator:bob (request 1)")
    eng.step()
    assert eng.state["devices"][canary]["result"] == rs.ROLLBACK_PENDING
    clock.t += 61
    eng.step()
    assert eng.state["devices"][canary]["result"] == rs.ROLLBACK_FAILED
    assert eng.state["cohorts"]["all"]["wave"] == 1


def test_halt_on_unjudged_counts_them_as_failures_and_never_holds(tmp_path):
    _, _, _, eng, _ = _canary_not_judged(tmp_path, halt_on_unjudged=True)
    eng.step()
    cohort = eng.state["cohorts"]["all"]
    assert cohort.get("waiting") is None and cohort["state"] in (rs.ROLLING_BACK, rs.HALTED)
    assert "not_judged" in cohort["reason"]


def test_a_roll_back_of_the_whole_rollout_takes_the_held_devices_too(tmp_path):
    _, fleet, _, eng, canary = _canary_not_judged(tmp_path)
    eng.step()
    assert rs.held_devices(eng.state) == [canary]
    eng.operator_rollback("rolled back by operator:carol", "rolled back by operator:carol (request 1)")
    assert eng.state["devices"][canary]["result"] == rs.ROLLBACK_PENDING and rs.held_devices(eng.state) == []
    assert rs.progress_doc(eng.state)["cohorts"]["all"]["waiting"] is None
    assert fleet.desired[canary]["manifest"] == {"name": "m", "version": "1", "rollback": True}
