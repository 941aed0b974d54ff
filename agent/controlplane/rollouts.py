"""Rollout requests from operators: start (a row the fleet loop plans), halt, resume, roll back. Each change is
one conditional UPDATE, so two operators acting at once leave one consistent state (the loser gets a 409)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import update

from agent.controlplane import repo
from agent.controlplane.db import write
from agent.controlplane.models import Rollout
from agent.fleet import rollout_hold as hold
from agent.fleet import rollout_state as rs
from agent.fleet.agent_release import RELEASE_NAME, kind_of
from agent.fleet.rollout_plan import RolloutSpec, rollout_id


def start_rollout(ctx, body, actor: str) -> dict[str, Any]:
    from agent.controlplane.packages import BadName

    if (body.kind == "agent") == bool(body.model) or body.model == RELEASE_NAME:
        raise BadName("model: name the model of a rollout of kind model; none for kind agent (the agent release)")
    spec = RolloutSpec(
        name=RELEASE_NAME if body.kind == "agent" else body.model,
        version=body.version,
        group=body.group,
        cohort_by=body.cohort_by,
        canary=body.canary,
        wave_size=body.wave_size,
        max_failures=body.max_failures,
        deadline_s=body.deadline_s,
    ).validate()
    rid = rollout_id(spec.name, spec.version)
    knobs = {"rate_per_minute": body.rate_per_minute, "min_devices": body.min_devices}
    now = time.time()
    with write(ctx.factory) as s:
        if s.get(Rollout, rid) is not None:
            raise repo.Conflict(f"version: rollout {rid} exists already; publish a new version")
        s.add(
            Rollout(
                rollout_id=rid,
                spec=spec.to_dict(),
                knobs=knobs,
                phase="starting",
                paused=False,
                created_by=actor,
                created_at=now,
                updated_at=now,
            )
        )
        repo.audit(s, actor, "rollout.start", rid, spec=spec.to_dict(), knobs=knobs)
    ctx.wake()
    return {"rollout_id": rid, "phase": "starting"}


UNJUDGED_ACTIONS = {"accept-unjudged": "accept", "rollback-unjudged": "rollback"}  # agent.fleet.rollout_hold
ACTIONS = ("halt", "resume", "rollback", *UNJUDGED_ACTIONS)  # POST /rollouts/{id}/{action} (API and dashboard)


def transition(ctx, rid: str, action: str, actor: str) -> dict[str, Any]:
    if action == "rollback":
        return request_rollback(ctx, rid, actor)
    if action in UNJUDGED_ACTIONS:
        return request_unjudged(ctx, rid, UNJUDGED_ACTIONS[action], actor)
    with write(ctx.factory) as s:
        row = s.get(Rollout, rid)
        if row is None:
            raise repo.NotFound(f"rollout_id: no rollout {rid!r}")
        live = Rollout.phase.in_(("starting", "running"))
        stmt = update(Rollout).where(Rollout.rollout_id == rid, live, Rollout.rollback_requested.is_(None))
        if action == "halt":
            stmt = stmt.where(Rollout.paused.is_(False)).values(paused=True, updated_at=time.time())
        else:
            stmt = stmt.where(Rollout.paused.is_(True)).values(paused=False, updated_at=time.time())
        if getattr(s.execute(stmt), "rowcount", 0) != 1:
            s.refresh(row)
            raise repo.Conflict(f"action: cannot {action} rollout {rid} now ({_where(row)})")
        repo.audit(s, actor, f"rollout.{action}", rid)
    ctx.wake()
    with ctx.factory() as s:
        out = s.get(Rollout, rid)
        assert out is not None
        return rollout_dict(out, brief=True)


def request_rollback(ctx, rid: str, actor: str) -> dict[str, Any]:
    """Ask for a roll back of every device that took the version: accepted in any phase but `failed` (nothing
    was told), and again while one is under way or after it (each request is numbered; the fleet loop answers
    the latest once, rolling back whatever still runs the version)."""
    with write(ctx.factory) as s:
        row = s.get(Rollout, rid)
        if row is None:
            raise repo.NotFound(f"rollout_id: no rollout {rid!r}")
        if row.phase == "failed":
            raise repo.Conflict(f"action: rollout {rid} never started ({row.reason}): no device has to go back")
        before = row.rollback_requested
        n = _request_number(before) + 1
        request = f"rolled back by {actor} (request {n})"
        same = Rollout.rollback_requested.is_(None) if before is None else Rollout.rollback_requested == before
        stmt = (
            update(Rollout)
            .where(Rollout.rollout_id == rid, same)
            .values(
                rollback_requested=request,
                phase="running" if row.phase == "finished" and row.state else row.phase,
                updated_at=time.time(),
            )
        )
        if getattr(s.execute(stmt), "rowcount", 0) != 1:
            s.refresh(row)  # another operator asked at the same moment: theirs is the request, equally good
        repo.audit(s, actor, "rollout.rollback", rid, request=n)
    ctx.wake()
    with ctx.factory() as s:
        out = s.get(Rollout, rid)
        assert out is not None
        return rollout_dict(out, brief=True)


def request_unjudged(ctx, rid: str, word: str, actor: str) -> dict[str, Any]:
    """The operator's word on the devices not judged that hold a wave: accept (the wave advances) or rollback
    (those devices go back); a 409 when none waits, or the last word is not applied yet."""
    with write(ctx.factory) as s:
        row = s.get(Rollout, rid)
        if row is None:
            raise repo.NotFound(f"rollout_id: no rollout {rid!r}")
        answered = ((row.state or {}).get("unjudged") or {}).get("request")
        if row.unjudged_decision and row.unjudged_decision != answered:
            raise repo.Conflict(f"action: rollout {rid}: {row.unjudged_decision} is not applied yet")
        waiting = rs.held_devices(row.state) if row.state else []
        if row.phase != "running" or not waiting:
            raise repo.Conflict(f"action: no device of rollout {rid} waits for an operator's word ({_where(row)})")
        before = row.unjudged_decision
        request = f"{word} by {actor} (request {_request_number(before) + 1})"
        same = Rollout.unjudged_decision.is_(None) if before is None else Rollout.unjudged_decision == before
        stmt = (
            update(Rollout)
            .where(Rollout.rollout_id == rid, same)
            .values(unjudged_decision=request, updated_at=time.time())
        )
        if getattr(s.execute(stmt), "rowcount", 0) != 1:
            s.refresh(row)
            raise repo.Conflict(f"action: rollout {rid}: another operator's word came first ({row.unjudged_decision})")
        repo.audit(s, actor, f"rollout.{word}-unjudged", rid, devices=waiting)
    ctx.wake()
    with ctx.factory() as s:
        out = s.get(Rollout, rid)
        assert out is not None
        return rollout_dict(out, brief=True)


def _request_number(request: str | None) -> int:
    if not request:
        return 0
    tail = request.rsplit("(request ", 1)
    try:
        return int(tail[1].rstrip(")")) if len(tail) == 2 else 1
    except ValueError:
        return 1


def _where(row: Rollout) -> str:
    if row.rollback_requested:
        return f"{row.phase}, rollback requested"
    return f"{row.phase}{', halted' if row.paused else ''}"


def rollout_dict(row: Rollout, brief: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rollout_id": row.rollout_id,
        "kind": kind_of(row.spec.get("name")),  # model | agent (a release of edge-agent: model is "edge-agent")
        "model": row.spec.get("name"),
        "version": row.spec.get("version"),
        "group": row.spec.get("group"),
        "spec": row.spec,
        "knobs": row.knobs,
        "phase": row.phase,
        "halted": bool(row.paused),
        "rollback_requested": row.rollback_requested,
        "unjudged_decision": row.unjudged_decision,  # the operator's last word on devices not judged
        "reason": row.reason,
        "created_by": row.created_by,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }
    if brief and row.progress is not None:  # saved with the state: a list reads no device's entry
        out.update(state=row.progress.get("state"), progress=row.progress)
    elif row.state:
        doc = rs.summary(row.state) if not brief else rs.progress_doc(row.state)
        out.update(state=row.state["state"], progress=doc)
    else:
        out.update(state=None, progress=None)
    held = rs.held_devices(row.state) if row.state else []
    out["waiting_for_operator"] = hold.words(len(held)) if held else None  # the wave holds (rollout_hold)
    return out
