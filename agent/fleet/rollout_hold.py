"""A wave whose devices came back "not judged" waits for an operator's word (issue 36): their probation could
not tell whether the version is slower, so the rollout does not decide for the operator.

The cohort holds with `waiting: "waiting for operator: N devices not judged"` (held devices are marked `held`);
nothing of the next wave starts. The operator's word (a request, numbered like a roll back's) is one of:
- accept: the held devices keep the version (still counted `not_judged`, marked `operator`), the wave advances;
- rollback: the held devices alone are sent back to their previous version (signed rollback envelopes; results
  `rolled_back` or `rollback_failed`, never counted as failures) and the wave advances once they have answered.
The word applies to every device held when the rollout engine reads it. The answered request is kept in the
state as `unjudged: {request, action, devices, at}`. A rollout with halt_on_unjudged counts such devices as
failures instead and never holds.
"""

from __future__ import annotations

from typing import Any

from agent.fleet import rollout_state as rs

WAITING = "waiting for operator"
ACCEPT, ROLLBACK = "accept", "rollback"
ACTIONS = (ACCEPT, ROLLBACK)


def words(n: int) -> str:
    return f"{WAITING}: {n} device{'s' if n != 1 else ''} not judged"


def check(engine: Any, key: str, wave: int, statuses: dict[str, Any]) -> tuple[bool, bool]:
    """(held, changed) for a cohort whose wave has no device in flight: held while a device of the wave is not
    judged without an operator's word, or sent back by one and not answered yet."""
    if engine.spec.halt_on_unjudged:
        return False, False
    cohort, devices = engine.state["cohorts"][key], engine.state["devices"]
    changed = _answered(engine, key, statuses)
    waiting = []
    for dev in cohort["waves"][wave]:
        d = devices[dev]
        if d["result"] == rs.NOT_JUDGED and not d.get("operator"):
            changed |= not d.get("held")
            d["held"] = True
            waiting.append(dev)
    back = [dev for dev in cohort["waves"][wave] if devices[dev]["result"] == rs.ROLLBACK_PENDING]
    said = words(len(waiting)) if waiting else None
    if cohort.get("waiting") != said:
        cohort["waiting"] = said
        changed = True
        if said:
            engine.progress("cohort_waiting", cohort=key, wave=wave, reason=said, devices=waiting)
    return bool(waiting or back), changed


def _answered(engine: Any, key: str, statuses: dict[str, Any]) -> bool:
    """Devices an operator sent back: rolled back once their verified status says so, or failed past the
    rollout's deadline counted from the word."""
    changed, now = False, engine.clock()
    for dev, d in engine.state["devices"].items():
        if d["cohort"] != key or d["result"] != rs.ROLLBACK_PENDING or not d.get("operator"):
            continue
        result, reason = engine._rollback_outcome(d, statuses.get(dev))
        if result == rs.CANCELLED:  # it never installed: its status says so
            result, reason = rs.ROLLED_BACK, reason
        if result is None and now - float(d.get("asked") or now) > engine.spec.deadline_s:
            result, reason = rs.ROLLBACK_FAILED, f"no rollback confirmation within {engine.spec.deadline_s:g} s"
        if result is not None:
            d.update(result=result, reason=f"not judged; {d['operator']}: {reason}", finished=now)
            engine.progress("device", device_id=dev, cohort=key, result=result, reason=d["reason"])
            changed = True
    return changed


def decide(engine: Any, request: str) -> dict[str, Any]:
    """Apply an operator's word ("accept by X (request n)" or "rollback by X (request n)") to every held device;
    returns what was done (kept in the state as `unjudged`)."""
    action = request.split(" ", 1)[0]
    if action not in ACTIONS:
        raise ValueError(f"unknown operator word {request!r}")
    now, ids = engine.clock(), rs.held_devices(engine.state)
    for dev in ids:
        d = engine.state["devices"][dev]
        d.update(held=False, operator=_said(action, request))
        if action == ROLLBACK:
            back = f"back to {d['previous_version']}" if d["previous_version"] else "no earlier version"
            d.update(took=True, result=rs.ROLLBACK_PENDING, asked=now, reason=f"not judged; rolling back ({back})")
    for cohort in engine.state["cohorts"].values():
        cohort["waiting"] = None
    op = {"request": request, "action": action, "devices": ids, "at": now}
    engine.state["unjudged"] = op
    engine._save()  # persist before acting: a restart republishes the rollbacks (ROLLBACK_PENDING)
    if action == ROLLBACK:
        for dev in ids:
            engine._publish_rollback(dev)
    engine.progress("unjudged_decided", action=action, devices=ids, request=request)
    return op


def _said(action: str, request: str) -> str:
    who = request.split(" (request ", 1)[0]
    return who.replace("accept by", "accepted by", 1) if action == ACCEPT else who.replace("rollback", "rolled back", 1)
