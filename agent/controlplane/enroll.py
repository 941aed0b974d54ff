"""Enrollment: a device's request signed with its own key -> pending (or accepted with a pre-shared enrollment
token); operators accept or reject. One key, one device: a key bound to another device is refused, as is a
request for a device id enrolled with another key, a bad signature, a stale or replayed request."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from agent.controlplane import repo
from agent.controlplane.models import (
    ACCEPTED,
    DECOMMISSIONED,
    PENDING,
    REJECTED,
    Device,
    DeviceDocument,
    DeviceGroup,
    EnrollNonce,
    EnrollToken,
)
from agent.controlplane.obs_tables import EvidenceRow, ModelPoint, TelemetryHead, TelemetryPoint
from agent.controlplane.tokens import digest
from agent.errors import ConfigError
from agent.transport.cpclient import ENROLL_KIND as KIND

MAX_SKEW_S = 300.0


class EnrollRefused(ConfigError):
    """A request that is well formed but not believed (HTTP 403 at the edge); the refusal is audited."""


class LooksPending(EnrollRefused):
    """Refused, but answered as a new pending request is (202, "pending"), nothing stored: an id held by another
    key and not accepted must not tell an unauthenticated caller that it is pending rather than unknown."""


def check(doc: dict[str, Any], now: float | None = None) -> tuple[str, str, Any]:
    """Form and signature: (device_id, key_id, public key) or ConfigError / EnrollRefused naming the field."""
    from agent.artifacts.keys import key_id, parse_public_key
    from agent.names import check_name
    from agent.transport.signing import verify_doc

    if doc.get("kind") != KIND:
        raise ConfigError(f"kind: expected {KIND!r}")
    device_id = check_name(doc.get("device_id"), "device_id", ConfigError)
    pem = doc.get("public_key")
    if not isinstance(pem, str):
        raise ConfigError("public_key: expected a PEM string")
    pub = parse_public_key(pem, where="public_key")
    if verify_doc(doc, pub) != "verified":
        raise EnrollRefused(f"sig: the request for {device_id} is not signed by the key it presents")
    ts, now = doc.get("ts"), time.time() if now is None else now
    if not isinstance(ts, (int, float)) or abs(now - float(ts)) > MAX_SKEW_S:
        raise EnrollRefused(f"ts: the request is older or newer than {MAX_SKEW_S:g} s (replayed or clock wrong)")
    nonce = doc.get("nonce")
    if not isinstance(nonce, str) or not 16 <= len(nonce) <= 64:
        raise ConfigError("nonce: expected 16 to 64 characters")
    return device_id, key_id(pub), pub


def apply(session: Session, doc: dict[str, Any]) -> Device:
    """Record a checked request: pending, or accepted by a valid enrollment token."""
    device_id, kid, _ = check(doc)
    if session.get(EnrollNonce, doc["nonce"]) is not None:
        raise EnrollRefused(f"nonce: this request was seen before (replayed) for {device_id}")
    session.execute(delete(EnrollNonce).where(EnrollNonce.ts < time.time() - 2 * MAX_SKEW_S))  # replays are stale
    session.add(EnrollNonce(nonce=doc["nonce"], device_id=device_id, ts=time.time()))
    holder = session.scalar(select(Device).where(Device.key_id == kid))
    if holder is not None and holder.device_id != device_id:
        raise EnrollRefused(
            f"public_key: key {kid} is enrolled as device {holder.device_id} (one key, one device); "
            "decommission that device first"
        )
    row = session.get(Device, device_id)
    if row is not None and row.state in (PENDING, REJECTED) and row.key_id != kid:
        raise LooksPending(f"device_id: {device_id} is {row.state} with another key ({row.key_id}): refused")
    if row is not None and row.state != DECOMMISSIONED and row.key_id != kid:
        raise EnrollRefused(f"device_id: {device_id} is enrolled with another key ({row.key_id}): refused")
    hardware: dict[str, Any] = doc["hardware"] if isinstance(doc.get("hardware"), dict) else {}
    target = doc.get("target") if isinstance(doc.get("target"), str) else None
    if row is None:
        row = Device(device_id=device_id, groups=[], online=False, requested_at=time.time())
        session.add(row)
    elif row.state == REJECTED:
        return row  # an operator said no; asking again changes nothing
    if row.state in (None, DECOMMISSIONED):
        row.state, row.decided_at, row.decided_by = PENDING, None, None
    row.public_key, row.key_id, row.hardware = doc["public_key"], kid, hardware
    row.target = target or row.target
    token = doc.get("token")
    if token and row.state == PENDING:
        grant = session.get(EnrollToken, digest(str(token)))
        if grant is None or grant.uses_left < 1:
            raise EnrollRefused("token: unknown or used-up enrollment token")
        grant.uses_left -= 1
        session.flush()
        repo.set_groups(session, row, list(row.groups or []) + list(grant.groups or []))
        row.state, row.decided_at, row.decided_by = ACCEPTED, time.time(), f"token:{grant.name}"
    repo.audit(session, f"device:{device_id}", "enroll.request", device_id, key_id=kid, state=row.state)
    return row


def preregister(session: Session, device_id: str, pem: str, groups: list[str], actor: str) -> Device:
    """The operator's path (`fleet register --control-plane`): a device's public key and groups registered and
    accepted before the device asks. The same key for the same device is an accept with these groups; one key,
    one device otherwise (a conflict names who holds it)."""
    from agent.artifacts.keys import key_id, parse_public_key, public_pem

    pub = parse_public_key(pem, where="public_key")
    pem, kid = public_pem(pub), key_id(pub)
    holder = session.scalar(select(Device).where(Device.key_id == kid))
    if holder is not None and holder.device_id != device_id:
        raise repo.Conflict(f"public_key: key {kid} is enrolled as device {holder.device_id} (one key, one device)")
    row = session.get(Device, device_id)
    if row is not None and row.state in (PENDING, REJECTED) and row.key_id not in (None, kid):
        repo.audit(session, actor, "device.pending_dropped", device_id, key_id=row.key_id, why="pre-registered")
        remove(session, device_id)  # the operator's key wins over a request nobody accepted (a squatter's?)
        row = None
    if row is not None and row.state != DECOMMISSIONED and row.key_id not in (None, kid):
        raise repo.Conflict(
            f"device_id: {device_id} is enrolled with another key ({row.key_id}); decommission it first"
        )
    if row is None:
        row = Device(device_id=device_id, groups=[], online=False, requested_at=time.time(), hardware={})
        session.add(row)
    row.public_key, row.key_id = pem, kid
    row.state, row.decided_at, row.decided_by = ACCEPTED, time.time(), actor
    session.flush()
    repo.set_groups(session, row, groups)
    repo.audit(session, actor, "device.register", device_id, key_id=kid, groups=groups)
    return row


def decide(session: Session, device_id: str, accept: bool, actor: str, groups: list[str] | None = None) -> Device:
    row = repo.device(session, device_id)
    if row.state not in (PENDING, REJECTED, ACCEPTED):
        raise repo.Conflict(f"device_id: {device_id} is {row.state}")
    row.state = ACCEPTED if accept else REJECTED
    row.decided_at, row.decided_by = time.time(), actor
    if groups is not None:
        repo.set_groups(session, row, groups)
    repo.audit(session, actor, "device.accept" if accept else "device.reject", device_id, groups=groups)
    return row


def decommission(session: Session, device_id: str, actor: str) -> Device:
    row = repo.device(session, device_id)
    row.state, row.key_id, row.online = DECOMMISSIONED, None, False
    row.decided_at, row.decided_by = time.time(), actor
    repo.set_groups(session, row, [])
    repo.audit(session, actor, "device.decommission", device_id)
    return row


def remove(session: Session, device_id: str) -> dict[str, int]:
    """Delete a device's row and everything kept for it (groups, documents, enrollment nonces, telemetry, evidence
    rows): {table: rows}. Its alerts are cleared by the next check and listed as cleared."""
    counts: dict[str, int] = {}
    for table, column in (
        (DeviceDocument, DeviceDocument.device_id),
        (EvidenceRow, EvidenceRow.device_id),
        (TelemetryPoint, TelemetryPoint.device_id),
        (ModelPoint, ModelPoint.device_id),
        (TelemetryHead, TelemetryHead.device_id),
        (DeviceGroup, DeviceGroup.device_id),
        (EnrollNonce, EnrollNonce.device_id),
    ):
        done: Any = session.execute(delete(table).where(column == device_id))
        counts[str(table.__tablename__)] = int(done.rowcount or 0)
    row = session.get(Device, device_id)
    if row is not None:  # through the session, so the overview's counts follow (agent.controlplane.fleetcounts)
        session.delete(row)
    counts[Device.__tablename__] = int(row is not None)
    session.flush()
    return counts


def delete_device(session: Session, device_id: str, actor: str) -> dict[str, int]:
    """The operator's delete (DELETE /api/v1/devices/{id}, admin): the device and its documents, audited."""
    repo.device(session, device_id)
    counts = remove(session, device_id)
    repo.audit(session, actor, "device.delete", device_id, **counts)
    return counts


def cap_pending(session: Session, keep: str, cap: int) -> int:
    """At most `cap` pending devices: the oldest ones (not `keep`) are dropped, each audited; how many were."""
    over = (session.scalar(select(func.count()).select_from(Device).where(Device.state == PENDING)) or 0) - cap
    if over <= 0:
        return 0
    oldest = session.scalars(
        select(Device.device_id)
        .where(Device.state == PENDING, Device.device_id != keep)
        .order_by(Device.requested_at, Device.device_id)
        .limit(over)
    ).all()
    for device_id in oldest:
        remove(session, device_id)
        repo.audit(session, "service", "device.pending_dropped", device_id, why=f"more than {cap} pending")
    return len(oldest)
