"""Repository functions over the registry tables: filters are bound parameters, never SQL text."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, defer

from agent.controlplane.models import ACCEPTED, AuditEntry, Device, DeviceDocument, DeviceGroup
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
) -> tuple[int, list[Device]]:
    """(how many match, the page of them by device id; `limit` None: every one)."""
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
    (with how many are online), plus one count per value of each of those and of the model state: SQL GROUP BY
    over the indexed columns the status intake keeps (agent.controlplane.cohort); no status document is read."""
    states = dict(session.execute(select(Device.state, func.count()).group_by(Device.state)).all())
    cols = [getattr(Device, c) for c in COHORT]
    online = func.sum(case((Device.online.is_(True), 1), else_=0))
    rows = session.execute(
        select(*cols, func.count(), online).where(Device.state == ACCEPTED).group_by(*cols).order_by(*cols)
    ).all()
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
    col = Device.model_state
    got = session.execute(select(col, func.count()).where(Device.state == ACCEPTED).group_by(col)).all()
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


def replace_document(
    session: Session, device_id: str, kind: str, model: str | None, version: str | None, deployment_id: Any
) -> None:
    """A device posts a deployment's decision record again when it grew (shadow, probation figures, the trial's
    attestation): the newer copy replaces the one of the same deployment, so each deployment has one record."""
    if not isinstance(deployment_id, str):
        return
    same = select(DeviceDocument).where(
        DeviceDocument.device_id == device_id,
        DeviceDocument.kind == kind,
        DeviceDocument.model == model,
        DeviceDocument.version == version,
    )
    for old in session.scalars(same).all():
        if isinstance(old.doc, dict) and old.doc.get("deployment_id") == deployment_id:
            session.delete(old)


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
