"""Verified device statuses into the registry table, a batch per fleet-loop tick: the changed devices' rows read
in one query per 500, each status checked for shape (docschema), its indexed columns (agent.controlplane.cohort)
set with it, one transaction. And the fleet loop's registry kept in step with the table one device at a time
(an accepted, rejected or re-keyed device), never reloaded whole."""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, defer, sessionmaker

from agent.controlplane import cohort
from agent.controlplane.db import write
from agent.controlplane.models import ACCEPTED, Device
from agent.controlplane.releases import note_status

log = logging.getLogger("edge_agent.controlplane")
BATCH = 500


def unfit(doc: dict, limits) -> str | None:
    """Why a verified status cannot be kept (too deep, a field of the wrong type or size), else None."""
    from agent.controlplane.docschema import DocumentInvalid, check
    from agent.controlplane.limits import depth

    if depth(doc, limits.json_depth) > limits.json_depth:
        return f"nested deeper than {limits.json_depth} levels"
    try:
        check("status", doc, limits.hardware_bytes)
    except DocumentInvalid as exc:
        return str(exc)
    return None


def ingest(factory: sessionmaker[Session], limits, statuses: dict[str, dict], on_kept=None) -> int:
    """Keep each verified status of an accepted device (one write transaction); returns how many were kept.
    `on_kept(session, {device_id: status})` runs in the same transaction for each batch of statuses kept
    (alerts: one read of the batch's alerts, not one per status)."""
    verified = {d: doc for d, doc in statuses.items() if doc.get("trust") == "verified"}
    if not verified:
        return 0  # only verified reports change anything
    kept = 0
    ids = sorted(verified)
    with write(factory) as s, s.no_autoflush:  # one flush per batch, not one per device's alert lookup
        for i in range(0, len(ids), BATCH):
            stmt = select(Device).where(Device.device_id.in_(ids[i : i + BATCH]), Device.state == ACCEPTED)
            rows = s.scalars(stmt.options(defer(Device.status), defer(Device.public_key))).all()
            batch = {row.device_id: row.status for row in rows if _keep(row, verified[row.device_id], limits)}
            kept += len(batch)
            if on_kept is not None and batch:
                on_kept(s, batch)
            s.flush()
    return kept


def _keep(row: Device, doc: dict, limits) -> int:
    why = unfit(doc, limits)
    if why:  # verified, but not of the status's shape: nothing of it is kept
        log.warning("fleet loop: status of %s not kept: %s", row.device_id, why)
        return 0
    providers: list = doc["providers"] if isinstance(doc.get("providers"), list) else []
    models: dict = doc["models"] if isinstance(doc.get("models"), dict) else {}
    serving = [m.get("provider") for m in models.values() if isinstance(m, dict) and m.get("provider")]
    row.status = {k: v for k, v in doc.items() if k != "sig"}
    row.status_ts = float(doc["ts"]) if isinstance(doc.get("ts"), (int, float)) else time.time()
    row.online = bool(doc.get("online"))
    row.target = doc.get("target") if isinstance(doc.get("target"), str) else row.target
    row.provider = (serving or providers or [row.provider])[0]
    if isinstance(doc.get("hardware"), dict):
        row.hardware = doc["hardware"]
    for name, value in cohort.columns(doc).items():
        setattr(row, name, value)
    row.models_summary = cohort.summary(doc)
    note_status(row, doc)  # its agent release and last trial (issue 40)
    return 1


def entries(factory: sessionmaker[Session], device_ids: set[str], key_ids: set[str]) -> dict[str, Any]:
    """{device_id: registry entry or None (not accepted: out of the registry)} for the named devices and every
    device holding one of `key_ids` (a key moved to another device revokes the old binding)."""
    out: dict[str, Any] = dict.fromkeys(device_ids)
    with factory() as s:
        cond = [Device.device_id.in_(sorted(device_ids))] + ([Device.key_id.in_(sorted(key_ids))] if key_ids else [])
        rows = s.execute(
            select(Device.device_id, Device.state, Device.public_key, Device.key_id, Device.groups).where(or_(*cond))
        ).all()
    for dev, state, pem, kid, groups in rows:
        out[dev] = {"public_key": pem, "key_id": kid, "groups": list(groups or [])} if state == ACCEPTED else None
    return out
