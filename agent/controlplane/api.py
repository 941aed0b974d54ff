"""The JSON API (FastAPI; OpenAPI schema at /api/openapi.json). Domain errors map to HTTP here only."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from sqlalchemy import func, select
from sqlalchemy.orm import defer

from agent.controlplane import attestations, enroll, repo, tokens
from agent.controlplane.auth import Operator, need
from agent.controlplane.db import write
from agent.controlplane.intake import read_document
from agent.controlplane.models import DEVICE_STATES, Device, DeviceDocument, ModelVersion, Rollout
from agent.controlplane.rollouts import ACTIONS, rollout_dict, start_rollout, transition
from agent.controlplane.schemas import (
    NAME,
    Decide,
    Groups,
    NewDevice,
    NewEnrollToken,
    NewOperatorToken,
    NewRollout,
    Push,
)
from agent.fleet.agent_release import kind_of

router = APIRouter(prefix="/api/v1")
AsViewer = Annotated[Operator, Depends(need("viewer"))]
AsOperator = Annotated[Operator, Depends(need("operator"))]
AsAdmin = Annotated[Operator, Depends(need("admin"))]
MAX_OFFSET = 10**9  # a paging offset beyond is a 422 (the databases' integers end near 9.2e18)


def cp(request: Request):
    return request.app.state.cp


# -- devices -----------------------------------------------------------------------------------------------
@router.post("/enroll", status_code=202, tags=["enrollment"])
async def enroll_device(request: Request) -> dict[str, Any]:
    """A device's enrollment request, signed with its own key (no operator token)."""
    doc = await read_document(request, "enroll")
    ctx = cp(request)
    try:
        with write(ctx.factory) as s:
            row = enroll.apply(s, doc)
            out = {"device_id": row.device_id, "state": row.state}
            if row.state == "pending":
                ctx.guard.dropped(enroll.cap_pending(s, row.device_id, ctx.settings.limits.pending_max))
    except enroll.EnrollRefused as exc:
        with write(ctx.factory) as s:
            repo.audit(s, f"device:{str(doc.get('device_id'))[:64]}", "enroll.refused", None, reason=str(exc))
        if isinstance(exc, enroll.LooksPending):  # answered as an unknown id's request is: nothing stored
            return {"device_id": doc["device_id"], "state": "pending"}
        raise
    if out["state"] == "accepted":
        ctx.registry_changed(out["device_id"])
    return out


@router.get("/devices", tags=["devices"])
def list_devices(
    request: Request,
    _: AsViewer,
    state: str | None = Query(None, pattern="^(" + "|".join(DEVICE_STATES) + ")$"),
    group: str | None = Query(None, pattern=NAME),
    target: str | None = Query(None, max_length=64),
    provider: str | None = Query(None, max_length=64),
    online: bool | None = None,
    q: str | None = Query(None, max_length=64),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    limit: int = Query(50, ge=1, le=1000),
    after: str | None = Query(None, max_length=120),
) -> dict[str, Any]:
    """Devices by id, a page at a time: `after` (the previous page's `next`, an opaque cursor) continues behind
    its last device, each device listed once while others enroll; `offset` pages stay for older tools. `next`:
    the cursor of the page after this one, null on the last."""
    start = repo.after_id(after) if after else None
    with cp(request).factory() as s:
        total, rows = repo.list_devices(
            s,
            state=state,
            group=group,
            target=target,
            provider=provider,
            online=online,
            q=q,
            offset=offset,
            limit=limit + 1,  # one more: is there a next page
            after=start,
        )
        more, rows = len(rows) > limit, rows[:limit]
        return {"total": total, "offset": offset, "limit": limit, "after": after,
                "next": repo.cursor(rows[-1].device_id) if more else None,
                "devices": [repo.device_dict(r) for r in rows]}  # fmt: skip


@router.get("/overview", tags=["devices"])
def overview(request: Request, _: AsViewer) -> dict[str, Any]:
    """The dashboard overview's counts: devices by state; accepted devices by target, provider, precision and
    model versions (with how many are online); one count per value of each and of the model state. Counted by
    the database over columns kept as statuses arrive (no status document read)."""
    with cp(request).factory() as s:
        return repo.overview(s)


@router.post("/devices", status_code=201, tags=["devices"])
def register_device(request: Request, body: NewDevice, op: AsOperator) -> dict[str, Any]:
    """Pre-register a device's public key with groups (accepted at once: `fleet register --control-plane`)."""
    for g in body.groups:
        _name(g, "groups")
    with write(cp(request).factory) as s:
        out = repo.device_dict(enroll.preregister(s, body.device_id, body.public_key, body.groups, op.actor))
    cp(request).registry_changed(body.device_id)
    return out


@router.get("/devices/{device_id}", tags=["devices"])
def get_device(request: Request, device_id: str, _: AsViewer) -> dict[str, Any]:
    with cp(request).factory() as s:
        out = repo.device_dict(repo.device(s, device_id), full=True)
        out["decisions"] = [_doc(d) for d in repo.documents(s, device_id, "decision")]
        out["conformance"] = [_doc(d) for d in repo.documents(s, device_id, "conformance", 5)]
        out["attestations"] = attestations.listing(s, device_id, 10)
        return out


def _doc(d: DeviceDocument) -> dict[str, Any]:
    return {"kind": d.kind, "model": d.model, "version": d.version, "ts": d.ts, "seq": d.seq, "doc": d.doc}


def _decide(request: Request, device_id: str, accept: bool, body: Decide | None, op: Operator) -> dict[str, Any]:
    groups = body.groups if body else None
    for g in groups or []:
        _name(g, "groups")
    with write(cp(request).factory) as s:
        row = enroll.decide(s, device_id, accept, op.actor, groups)
        out = repo.device_dict(row)
    cp(request).registry_changed(device_id)
    return out


def _name(value: str, field: str) -> None:
    from agent.names import is_valid_name

    if not is_valid_name(value):
        raise HTTPException(422, f"{field}: invalid name {value!r}")


@router.post("/devices/{device_id}/accept", tags=["devices"])
def accept(request: Request, device_id: str, op: AsOperator, body: Decide | None = None):
    return _decide(request, device_id, True, body, op)


@router.post("/devices/{device_id}/reject", tags=["devices"])
def reject(request: Request, device_id: str, op: AsOperator):
    return _decide(request, device_id, False, None, op)


@router.post("/devices/{device_id}/decommission", tags=["devices"])
def decommission(request: Request, device_id: str, op: AsAdmin):
    with write(cp(request).factory) as s:
        out = repo.device_dict(enroll.decommission(s, device_id, op.actor))
    cp(request).registry_changed(device_id)
    return out


@router.delete("/devices/{device_id}", tags=["devices"])
def delete_device(request: Request, device_id: str, op: AsAdmin):
    """The device and everything kept for it (groups, decision records, conformance reports), audited."""
    with write(cp(request).factory) as s:
        deleted = enroll.delete_device(s, device_id, op.actor)
    cp(request).registry_changed(device_id)
    return {"device_id": device_id, "deleted": deleted}


@router.put("/devices/{device_id}/groups", tags=["groups"])
def set_groups(request: Request, device_id: str, body: Groups, op: AsOperator):
    for g in body.groups:
        _name(g, "groups")
    with write(cp(request).factory) as s:
        row = repo.device(s, device_id)
        repo.set_groups(s, row, body.groups)
        repo.audit(s, op.actor, "device.groups", device_id, groups=body.groups)
        out = repo.device_dict(row)
    cp(request).registry_changed(device_id)
    return out


@router.get("/groups", tags=["groups"])
def groups(request: Request, _: AsViewer):
    with cp(request).factory() as s:
        return {"groups": repo.groups(s)}


# -- signed device documents ---------------------------------------------------------------------------------
@router.post("/devices/{device_id}/decisions", status_code=201, tags=["decision records"])
async def post_decision(request: Request, response: Response, device_id: str):
    """A decision record signed by the device's key (kept only when the signature verifies and it is fresh:
    docs/control-plane.md, "Freshness of signed documents"; 200 with the existing row for the same one again)."""
    return await _signed_doc(request, response, device_id, "decision")


@router.post("/devices/{device_id}/conformance", status_code=201, tags=["conformance reports"])
async def post_conformance(request: Request, response: Response, device_id: str):
    return await _signed_doc(request, response, device_id, "conformance")


async def _signed_doc(request: Request, response: Response, device_id: str, kind: str) -> dict[str, Any]:
    from starlette.concurrency import run_in_threadpool

    from agent.controlplane import freshness

    doc = await read_document(request, kind)
    try:  # the database's round trips off the event loop: documents of many devices are stored side by side
        created, out = await run_in_threadpool(_store_signed, cp(request), device_id, kind, doc)
    except (HTTPException, freshness.Stale, freshness.BadStamp, attestations.Mismatch) as exc:
        why = str(exc.detail if isinstance(exc, HTTPException) else exc)[:300]
        if isinstance(exc, HTTPException) and not why.startswith("sig:"):
            raise  # not an accepted device: nothing of it is recorded
        with write(cp(request).factory) as s:  # the refusal's own transaction: the document's was rolled back
            repo.audit(s, f"device:{device_id}", f"{kind}.refused", device_id, reason=why)
        raise
    response.status_code = 201 if created else 200
    return out


_SQLITE_WRITER = threading.Lock()
_SIGNER_ONLY = [defer(Device.status), defer(Device.hardware)]  # a document's device: its key and state, built once


def _store_signed(ctx, device_id: str, kind: str, doc: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    from agent.artifacts.keys import parse_public_key
    from agent.controlplane import documents
    from agent.transport.signing import verify_doc

    one_writer = _SQLITE_WRITER if ctx.engine.dialect.name == "sqlite" else contextlib.nullcontext()
    with one_writer, write(ctx.factory) as s:  # SQLite: one writer at a time (no lock upgrade deadlock)
        row = s.get(Device, device_id, options=_SIGNER_ONLY)
        if row is None or row.state != "accepted":  # one answer: unknown and pending are not told apart
            raise HTTPException(403, f"device_id: {device_id} is not an accepted device")
        key = parse_public_key(row.public_key, where=f"key of {device_id}")
        trust = verify_doc(doc, key)
        if trust != "verified" or doc.get("device_id") != device_id:
            raise HTTPException(403, f"sig: {kind} document not verified against {device_id}'s key ({trust})")
        return documents.store(s, row, key, kind, doc)


@router.get("/devices/{device_id}/attestations", tags=["attestations"])
def list_attestations(request: Request, device_id: str, _: AsViewer):
    with cp(request).factory() as s:
        repo.device(s, device_id)
        return {"attestations": attestations.listing(s, device_id)}


@router.get("/devices/{device_id}/decisions", tags=["decision records"])
def decisions(request: Request, device_id: str, _: AsViewer):
    with cp(request).factory() as s:
        repo.device(s, device_id)
        return {"decisions": [_doc(d) for d in repo.documents(s, device_id, "decision")]}


@router.get("/devices/{device_id}/conformance", tags=["conformance reports"])
def conformance(request: Request, device_id: str, _: AsViewer):
    with cp(request).factory() as s:
        repo.device(s, device_id)
        return {"reports": [_doc(d) for d in repo.documents(s, device_id, "conformance")]}


# -- models ----------------------------------------------------------------------------------------------------
@router.get("/models", tags=["models"])
def models(request: Request, _: AsViewer):
    with cp(request).factory() as s:
        rows = s.scalars(select(ModelVersion).order_by(ModelVersion.name, ModelVersion.id)).all()
        return {
            "models": [
                {
                    "kind": kind_of(m.name),
                    "name": m.name,
                    "version": m.version,
                    "sha256": m.sha256,
                    "size": m.size,
                    "format": m.format,
                }
                for m in rows
            ]
        }


@router.put("/models/{name}/versions/{version}", status_code=201, tags=["models"])
async def upload_model(request: Request, name: str, version: str, op: AsOperator):
    """The package bytes (a bare .onnx or a .tar.gz) as the request body."""
    from agent.controlplane.packages import by_magic, check_names, save_version

    check_names(name, version)
    ctx = cp(request)
    ctx.settings.uploads_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ctx.settings.uploads_dir) as tmp:
        path = Path(tmp) / "upload"
        with open(path, "wb") as f:
            async for chunk in request.stream():  # at most max_body_bytes: limits.BodyLimit cuts it off (413)
                f.write(chunk)
        return save_version(ctx, name, version, by_magic(path), op.actor)


@router.post("/push", tags=["models"])
def push_model(request: Request, body: Push, op: AsOperator):
    """Sign an uploaded version and publish it as retained desired state for devices or groups."""
    from agent.controlplane.pushes import push_version

    if bool(body.devices) == bool(body.groups):
        raise HTTPException(422, "devices: give the targets as devices or as groups (one of the two)")
    for name in [*body.devices, *body.groups]:
        _name(name, "devices" if name in body.devices else "groups")
    return push_version(cp(request), body, op.actor)


# -- rollouts --------------------------------------------------------------------------------------------------
@router.get("/rollouts", tags=["rollouts"])
def rollouts(request: Request, _: AsViewer):
    with cp(request).factory() as s:
        rows = s.scalars(select(Rollout).options(defer(Rollout.state)).order_by(Rollout.created_at.desc())).all()
        return {"rollouts": [rollout_dict(r, brief=True) for r in rows]}


@router.post("/rollouts", status_code=202, tags=["rollouts"])
def new_rollout(request: Request, body: NewRollout, op: AsOperator):
    return start_rollout(cp(request), body, op.actor)


@router.get("/rollouts/{rollout_id}", tags=["rollouts"])
def get_rollout(request: Request, rollout_id: str, _: AsViewer):
    with cp(request).factory() as s:
        row = s.get(Rollout, rollout_id)
        if row is None:
            raise repo.NotFound(f"rollout_id: no rollout {rollout_id!r}")
        return rollout_dict(row)


@router.post("/rollouts/{rollout_id}/{action}", tags=["rollouts"])
def act_rollout(request: Request, rollout_id: str, action: str, op: AsOperator):
    """action: halt (no new wave starts, nothing judged), resume, rollback (halt + roll every device back), or the
    operator's word on the devices not judged that hold a wave: accept-unjudged (the wave advances) or
    rollback-unjudged (those devices alone go back)."""
    if action not in ACTIONS:
        raise HTTPException(404, f"action: expected one of {', '.join(ACTIONS)}, got {action!r}")
    return transition(cp(request), rollout_id, action, op.actor)


# -- tokens and audit ------------------------------------------------------------------------------------------
@router.post("/tokens", status_code=201, tags=["tokens"])
def new_token(request: Request, body: NewOperatorToken, op: AsAdmin):
    with write(cp(request).factory) as s:
        token = tokens.create_operator(s, body.name, body.role)
        repo.audit(s, op.actor, "token.create", body.name, role=body.role)
    return {"name": body.name, "role": body.role, "token": token}


@router.post("/enroll-tokens", status_code=201, tags=["enrollment"])
def new_enroll_token(request: Request, body: NewEnrollToken, op: AsAdmin):
    for g in body.groups:
        _name(g, "groups")
    with write(cp(request).factory) as s:
        token = tokens.create_enroll_token(s, body.name, body.groups, body.uses, op.actor)
        repo.audit(s, op.actor, "enroll_token.create", body.name, groups=body.groups, uses=body.uses)
    return {"name": body.name, "token": token, "uses": body.uses}


@router.get("/audit", tags=["audit"])
def audit_log(
    request: Request,
    _: AsAdmin,
    actor: str = Query("", max_length=80),
    action: str = Query("", max_length=64),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    limit: int = Query(100, ge=1, le=1000),
):
    """Newest first; `actor` and `action` match from their start (`operator:`, `rollout.`)."""
    with cp(request).factory() as s:
        total, entries = repo.audit_entries(s, actor, action, offset, limit)
    return {"total": total, "offset": offset, "limit": limit, "entries": entries}


@router.get("/health", tags=["service"])
def health(request: Request):
    ctx = cp(request)
    with ctx.factory() as s:
        devices = s.scalar(select(func.count()).select_from(Device)) or 0
        limits = ctx.guard.report(s)
    leader = ctx.leader_state()
    return {"ok": True, "devices": devices, "fleet_loop": ctx.loop_state(), "leader": leader, "limits": limits}
