"""The service's rollout knobs on agent.fleet's engine, state in a real SQLite database: a rate limit (devices per
minute; queued devices are never republished after a restart), a minimum number of finished devices before the
failure threshold applies, and an operator roll back through the engine's own halt."""

from __future__ import annotations

from cp_support import add_running_rollout
from test_rollout_plan import _Fleet, _fleet, _Issuer

from agent.controlplane import db
from agent.controlplane.models import Rollout
from agent.controlplane.runner import ServiceRolloutEngine, new_state
from agent.fleet import rollout_state as rs
from agent.fleet.rollout_plan import RolloutSpec


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _engine(tmp_path, fleet, knobs, clock, **spec_kw):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    db.migrate(engine)
    factory = db.sessions(engine)
    spec = RolloutSpec("m", "2", group="lab", **spec_kw)
    state = new_state(spec, fleet.statuses(), {"sha256": "ab" * 32}, lambda planned: {"manifests": {}})
    add_running_rollout(factory, state["rollout_id"], spec.to_dict(), knobs, state=state)
    return factory, ServiceRolloutEngine(factory, state, fleet, _Issuer(), knobs, clock=clock)


def _saved(factory, rid="m-2"):
    with factory() as s:
        row = s.get(Rollout, rid)
        assert row is not None
        return row


def test_rate_limit_publishes_at_most_n_a_minute_and_restart_keeps_the_queue(tmp_path):
    fleet, clock = _Fleet(_fleet()), Clock()
    factory, eng = _engine(tmp_path, fleet, {"rate_per_minute": 2}, clock, canary="0", wave_size="100%")
    eng.step()
    assert len(fleet.desired) == 1  # 10 devices in the wave, one released at once
    clock.t += 30
    eng.step()
    assert len(fleet.desired) == 2
    clock.t += 60
    eng.step()
    assert len(fleet.desired) == 4  # two a minute
    queued = {d for d, v in _saved(factory).state["devices"].items() if v.get("queued")}
    assert len(queued) == 6 and not queued & set(fleet.desired)
    # a restart from the database: nothing queued is published, nothing the broker took is published again (the
    # ledger of agent.controlplane.ledger), and what was recorded but never acknowledged goes out once more
    from sqlalchemy import update

    from agent.controlplane.shared_models import Publication

    lost = sorted(fleet.desired)[0]
    with db.write(factory) as s:
        s.execute(update(Publication).where(Publication.device_id == lost).values(sent_at=None))
    fleet2 = _Fleet(_fleet())
    again = ServiceRolloutEngine(factory, _saved(factory).state, fleet2, _Issuer(), {"rate_per_minute": 2}, clock=clock)
    again.republish()
    assert set(fleet2.desired) == {lost} and again.link.skipped == 3
    again.republish()  # and once only: now the four are all acknowledged
    assert set(fleet2.desired) == {lost} and again.link.skipped == 3 + 4


def test_min_devices_before_the_failure_threshold_applies(tmp_path):
    fleet, clock = _Fleet(_fleet()), Clock()
    factory, eng = _engine(tmp_path, fleet, {"min_devices": 3}, clock, canary="0", wave_size="100%", max_failures="0%")
    eng.step()
    devs = sorted(fleet.desired)
    fleet.report(devs[0], "2", ok=False)
    eng.step()
    assert eng.state["cohorts"]["all"]["state"] == rs.RUNNING  # 1 finished < 3: the threshold does not apply yet
    fleet.report(devs[1], "2")
    fleet.report(devs[2], "2")
    eng.step()
    cohort = _saved(factory).state["cohorts"]["all"]
    assert cohort["state"] in (rs.ROLLING_BACK, rs.HALTED) and cohort["reason"].startswith("1 of 10 devices failed")


def test_operator_roll_back_uses_the_engines_halt(tmp_path):
    fleet, clock = _Fleet(_fleet()), Clock()
    factory, eng = _engine(tmp_path, fleet, {}, clock, canary="1", wave_size="50%")
    eng.step()
    (canary,) = fleet.desired
    fleet.report(canary, "2")
    eng.step()
    eng.operator_rollback("rolled back by operator:alice")
    saved = _saved(factory)
    assert saved.state["cohorts"]["all"]["reason"] == "rolled back by operator:alice"
    assert fleet.desired[canary]["manifest"] == {"name": "m", "version": "1", "rollback": True}
    assert saved.phase == "running"
