"""Repository functions over the registry tables: filters are bound parameters, never SQL text."""

from __future__ import annotations

import base64
import time
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, defer

from agent.controlplane.models import ACCEPTED, AuditEntry, Device, DeviceDocument, DeviceGroup, FleetCount
from agent.errors import ConfigError


class NotFound(ConfigError):
    """The named row does not exist (HTTP 404 at the edge)."""


class Conflict(ConfigError):
    """The change does not apply to the row's current state (HTTP 409 at the edge)."""


def audit(session: Session, actor: str, action: str, target: str | None = None, **detail: Any) -> None:
    session.add(AuditEntry(ts=time.time(), actor=actor, action=action, target=target, detail=detail))


def audit_entries(
    session: Session, actor: str = "", action: str = "", offset: int = 0, limit: int = 100
) -> tuple[int, list[dict[str, Any]]]:
    """(how many match, the page of them, newest first); `actor` and `action` match from their start
    (`operator:` every operator, `rollout.` every rollout action), as bound parameters."""
    stmt = select(AuditEntry)
    if actor:
        stmt = stmt.where(AuditEntry.actor.startswith(actor, autoescape=True))
    if action:
        stmt = stmt.where(AuditEntry.action.startswith(action, autoescape=True))
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    rows = session.scalars(stmt.order_by(AuditEntry.id.desc()).offset(offset).limit(limit)).all()
    entries = [{"ts": a.ts, "actor": a.actor, "action": a.action, "target": a.target, "detail": a.detail} for a in rows]
    return total, entries


def device(session: Session, device_id: str) -> Device:
    row = session.get(Device, device_id)
    if row is None:
        raise NotFound(f"device_id: no device {device_id!r}")
    return row


class BadCursor(ConfigError):
    """A paging cursor this service did not hand out (HTTP 400 at the edge)."""


CURSOR_PREFIX = "d1."  # a device list's keyset cursor, version 1: base64url of the last listed device's id


def cursor(device_id: str) -> str:
    """The opaque `after` cursor that continues a device list behind `device_id` (the lists are ordered by id)."""
    return CURSOR_PREFIX + base64.urlsafe_b64encode(device_id.encode()).decode().rstrip("=")


def after_id(token: str) -> str:
    """The device id a cursor from `cursor()` stands for; BadCursor for anything else."""
    body = token[len(CURSOR_PREFIX) :]
    try:
        if not token.startswith(CURSOR_PREFIX) or len(body) > 100:
            raise ValueError(token[:16])
        device_id = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise BadCursor("after: not a cursor this service handed out (take `next` from the previous page)") from None
    if not 0 < len(device_id) <= 64:
        raise BadCursor("after: not a cursor this service handed out (take `next` from the previous page)")
    return device_id


def list_devices(
    session: Session,
    *,
    state: str | None = None,
    group: str | None = None,
    target: str | None = None,
    provider: str | None = None,
    online: bool | None = None,
    q: str | None = None,
    offset: int = 0,
    limit: int | None = 50,
    after: str | None = None,
) -> tuple[int, list[Device]]:
    """(how many match, the page of them by device id; `limit` None: every one). `after` (a device id, from a
    cursor): the page starts behind it (keyset: an index seek, and a device enrolled meanwhile neither shifts
    the pages nor is listed twice), `offset` then counted from there."""
    stmt = select(Device)
    if state:
        stmt = stmt.where(Device.state == state)
    if group:
        stmt = stmt.join(DeviceGroup, DeviceGroup.device_id == Device.device_id).where(DeviceGroup.group == group)
    if target:
        stmt = stmt.where(Device.target == target)
    if provider:
        stmt = stmt.where(Device.provider == provider)
    if online is not None:
        stmt = stmt.where(Device.online == online)
    if q:
        stmt = stmt.where(Device.device_id.startswith(q, autoescape=True))
    total = session.scalar(select(func.count()).select_from(stmt.with_only_columns(Device.device_id).subquery())) or 0
    page = stmt.options(defer(Device.status), defer(Device.public_key)).order_by(Device.device_id)
    if after is not None:
        page = page.where(Device.device_id > after)
    rows = session.scalars(page.offset(offset).limit(limit)).all()
    return total, list(rows)


def set_groups(session: Session, row: Device, groups: list[str]) -> None:
    groups = sorted(set(groups))
    row.groups = groups
    for old in session.scalars(select(DeviceGroup).where(DeviceGroup.device_id == row.device_id)).all():
        session.delete(old)
    session.flush()
    for name in groups:
        session.add(DeviceGroup(device_id=row.device_id, group=name))


def groups(session: Session) -> list[dict[str, Any]]:
    rows = session.execute(
        select(DeviceGroup.group, func.count()).group_by(DeviceGroup.group).order_by(DeviceGroup.group)
    ).all()
    return [{"group": g, "devices": n} for g, n in rows]


def targets(session: Session) -> list[dict[str, Any]]:
    """Hardware classes of the accepted devices, each with how many."""
    stmt = select(Device.target, func.count()).where(Device.state == "accepted", Device.target.is_not(None))
    rows = session.execute(stmt.group_by(Device.target).order_by(Device.target)).all()
    return [{"target": t, "devices": n} for t, n in rows]


COHORT = ("target", "provider", "precision", "model_versions")
BREAKDOWNS = ("target", "provider", "precision", "model_versions", "model_state")


def overview(session: Session) -> dict[str, Any]:
    """Counts by state, and accepted devices by hardware cohort (target), provider, precision and model versions
    (with how many are online), plus one count per value of each of those and of the model state: sums over
    fleet_counts, the few rows agent.controlplane.fleetcounts keeps as devices change; neither the devices table
    nor a status document is read, so a view costs the same at 1,000 devices and at 100,000."""
    fc = FleetCount
    total = func.sum(fc.devices)
    states = dict(session.execute(select(fc.state, total).group_by(fc.state).having(total > 0)).all())
    cols = [getattr(fc, c) for c in COHORT]
    online = func.sum(case((fc.online.is_(True), fc.devices), else_=0))
    accepted = select(*cols, total, online).where(fc.state == ACCEPTED, fc.devices > 0)
    rows = session.execute(accepted.group_by(*cols).order_by(*cols)).all()
    names = ("target", "provider", "precision", "models")
    cohorts: list[dict[str, Any]] = [
        {**{k: r[i] or ("none" if k == "models" else "unknown") for i, k in enumerate(names)},
         "devices": int(r[4]), "online": int(r[5] or 0)}
        for r in rows
    ]  # fmt: skip
    by: dict[str, dict[str, int]] = {k: {} for k in BREAKDOWNS}
    for c in cohorts:  # the cohort columns' counts are sums over the cohorts: no query of their own
        for name, key in zip(BREAKDOWNS, (*names[:3], "models")):
            value, n = str(c[key]), int(c["devices"])
            by[name][value] = by[name].get(value, 0) + n
    col = fc.model_state
    got = session.execute(select(col, total).where(fc.state == ACCEPTED, fc.devices > 0).group_by(col)).all()
    by["model_state"] = {str(v) if v is not None else "unknown": int(n) for v, n in got}
    by = {k: dict(sorted(v.items())) for k, v in by.items()}
    return {"states": {s: int(n) for s, n in states.items()}, "cohorts": cohorts, "by": by}


def documents(session: Session, device_id: str, kind: str, limit: int = 20) -> list[DeviceDocument]:
    """The newest documents of a kind, each checked again as read (docschema.clean: a bad field is blanked and
    named under "invalid"; the stored row is not changed)."""
    from sqlalchemy.orm.attributes import set_committed_value

    from agent.controlplane.docschema import clean

    stmt = (
        select(DeviceDocument)
        .where(DeviceDocument.device_id == device_id, DeviceDocument.kind == kind)
        .order_by(DeviceDocument.ts.desc(), DeviceDocument.id.desc())
        .limit(limit)
    )
    rows = list(session.scalars(stmt).all())
    for d in rows:
        set_committed_value(d, "doc", clean(kind, d.doc))
    return rows


def device_dict(row: Device, full: bool = False) -> dict[str, Any]:
    """A device as listed and shown; what it supplied (hardware, status) is checked again as read, a bad field
    blanked and named under "invalid" (docschema)."""
    from agent.controlplane.docschema import INVALID, clean, hardware

    if full or (row.models_summary is None and row.status_ts is not None):
        status = clean("status", row.status) if row.status is not None else {}
    else:  # a list: the summary the intake kept (checked as read), never the status document
        status = clean("status", {"models": row.models_summary}) if row.models_summary is not None else {}
    hw, invalid = hardware(row.hardware)
    invalid += [f"status.{p}" for p in status.get(INVALID, [])]
    groups = row.groups if isinstance(row.groups, list) else []
    out = {
        "device_id": row.device_id,
        "state": row.state,
        "key_id": row.key_id,
        "groups": [g for g in groups if isinstance(g, str)],
        "target": row.target,
        "provider": row.provider,
        "online": bool(row.online),
        "hardware": hw,
        "models": status.get("models") or {},
        "status_ts": row.status_ts,
        "requested_at": row.requested_at,
        "decided_at": row.decided_at,
        "decided_by": row.decided_by,
        **agent_fields(row),
    }
    if invalid:
        out[INVALID] = invalid
    if full:
        out["status"] = status or None
    return out


def agent_fields(row: Device) -> dict[str, Any]:
    """{agent_version, agent_release: {current, previous, trial, installing} or None, agent_trial: one line} as the
    intake kept them from its last verified status (agent.controlplane.releases.note_status)."""
    from agent.fleet.agent_release import trial_words

    release = row.agent_release if isinstance(row.agent_release, dict) else None
    version = row.agent_version if isinstance(row.agent_version, str) else None
    return {"agent_version": version, "agent_release": release, "agent_trial": trial_words(release) or None}


def paired_timing(s: Session, device_ids: list[str], model: str) -> dict[str, str]:
    """{device: its last trial of `model` in words: paired ratio, A/A floor, verdict; "not measured" when its
    status carries none} (agent.fleet.paired), for the rollout page."""
    from agent.fleet import paired

    out = dict.fromkeys(device_ids, paired.NOT_MEASURED)
    for start in range(0, len(device_ids), 500):
        chunk = device_ids[start : start + 500]
        for dev, status in s.execute(select(Device.device_id, Device.status).where(Device.device_id.in_(chunk))):
            out[dev] = paired.status_words(status, model)
    return out
