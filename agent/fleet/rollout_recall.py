"""An operator's roll back of a rollout as one tracked operation: every device that installed or is installing
the version goes back, whatever cohort or wave it was in and whatever state the rollout is in (running, halted,
finished); asked again, it rolls back whatever still runs the version (idempotent, repeatable until done).

The operation lives in the rollout state as `rollback`: request, reason, attempts, state (running | done |
incomplete), started, finished, result counts and the devices that still run the version."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.fleet import rollout_state as rs

if TYPE_CHECKING:  # pragma: no cover
    from agent.fleet.outcome import StatusDoc
    from agent.fleet.rollout import RolloutEngine

RUNNING, DONE, INCOMPLETE = "running", "done", "incomplete"


def _on_it(engine: RolloutEngine, d: rs.DeviceRow, doc: StatusDoc | None) -> bool:
    """Does this device run (or may it run) the rollout's version now?"""
    name, version = engine.spec.name, engine.spec.version
    if rs.holds(doc, name, version):
        return True
    if d["result"] in rs.TOOK or d["result"] == rs.IN_PROGRESS:
        return True
    return d["result"] == rs.ROLLBACK_FAILED and bool(d.get("took")) and doc is None


def recall(engine: RolloutEngine, request: str, reason: str) -> dict[str, Any]:
    """Start (or repeat) the roll back of every device that took or is taking the version; returns the
    operation. Running cohorts halt through the engine's own halt; finished ones reopen for the roll back."""
    state, now = engine.state, engine.clock()
    op = state.get("rollback") or {"attempts": 0}
    op.update(
        request=request,
        reason=reason,
        state=RUNNING,
        attempts=int(op.get("attempts") or 0) + 1,
        started=now,
        finished=None,
    )
    state["rollback"] = op
    for key, cohort in state["cohorts"].items():
        if cohort["state"] == rs.RUNNING:
            engine._halt(key, reason)  # pending: not reached; in flight or took: rolled back
    statuses = engine.link.statuses()
    again: list[str] = []
    for dev, d in state["devices"].items():
        if d["result"] == rs.ROLLBACK_PENDING:
            again.append(dev)  # still waiting from an earlier halt: asked again, with a fresh deadline
        elif _on_it(engine, d, statuses.get(dev)):
            back = f"back to {d['previous_version']}" if d["previous_version"] else "no earlier version"
            d.pop("rollback_unavailable", None)  # its artifact may be in the store by now
            d.update(took=True, result=rs.ROLLBACK_PENDING, reason=f"took {engine.spec.version}; rolling back ({back})")
            again.append(dev)
    for key in {state["devices"][dev]["cohort"] for dev in again}:
        cohort = state["cohorts"][key]
        cohort.update(state=rs.ROLLING_BACK, rollback_started=now, reason=cohort.get("reason") or reason)
    if again:
        state["state"] = rs.RUNNING
    else:
        finish(engine)
    engine._save()  # persist before acting: a restart republishes every pending rollback
    for dev in sorted(again):
        engine._publish_rollback(dev)
    engine.progress("rollback_requested", rollout_id=state["rollout_id"], devices=len(again), reason=reason)
    return op


def finish(engine: RolloutEngine) -> bool:
    """Close a running roll back once the rollout settled: its result and who still runs the version."""
    state = engine.state
    op = state.get("rollback")
    if not op or op.get("state") != RUNNING or state["state"] not in rs.ROLLOUT_FINAL:
        return False
    statuses = engine.link.statuses()
    remaining = sorted(
        dev
        for dev, d in state["devices"].items()
        if rs.holds(statuses.get(dev), engine.spec.name, engine.spec.version)
        or d["result"] in rs.TOOK
        or (d["result"] == rs.ROLLBACK_FAILED and d.get("took"))
    )
    op.update(
        state=INCOMPLETE if remaining else DONE,
        finished=engine.clock(),
        result=rs.totals(state),
        remaining=remaining,
    )
    engine.progress("rollback_finished", rollout_id=state["rollout_id"], state=op["state"], remaining=remaining)
    return True
