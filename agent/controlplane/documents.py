"""Storing a device's signed document once its signature verified (the API checks that): freshness first
(agent.controlplane.freshness: a duplicate is answered with its row, a replay refused), then the embedded
attestations (verified, and bound to the record's deployment and artifact), then one row per deployment."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from agent.controlplane import attestations, freshness, matrix, repo
from agent.controlplane.models import Device, DeviceDocument

DECISION = "decision"


def doc_dict(d: DeviceDocument) -> dict[str, Any]:
    return {"kind": d.kind, "model": d.model, "version": d.version, "ts": d.ts, "seq": d.seq, "doc": d.doc}


def store(session: Session, device: Device, public_key, kind: str, doc: dict[str, Any]) -> tuple[bool, dict]:
    """(created, answer): created False for the exact same document again (its row, nothing stored). Raises
    freshness.Stale (409), freshness.BadStamp (422) or attestations.Mismatch (422): nothing stored."""
    now = time.time()
    sha = freshness.digest(doc)
    seq, ts = freshness.stamp(doc, now)  # a stored document's stamp stays valid: a duplicate passes it
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    version = doc.get("version") if isinstance(doc.get("version"), str) else None
    mark = freshness.lock(session, device, kind)
    same, older = _stored(session, device.device_id, kind, sha, (model, version, doc.get("deployment_id")))
    if same is not None:
        return False, _answer(device.device_id, kind, same, stored=False)
    freshness.check(device, kind, seq, mark)
    body = {k: v for k, v in doc.items() if k != "sig"}
    if kind == DECISION and "attestations" in body:  # kept with the verdict of each (docs/evidence.md)
        body["attestations"] = attestations.verify_embedded(public_key, device.device_id, body["attestations"])
        attestations.check_bound(body)
        for k, att in body["attestations"].items():
            if not att["verified"]:
                repo.audit(
                    session, f"device:{device.device_id}", "attestation.refused", device.device_id, kind=k,
                    reason=att["reason"],
                )  # fmt: skip
    for old in older:  # a deployment's record posted again as it grew: the newer copy replaces the older
        session.delete(old)
    row = DeviceDocument(
        device_id=device.device_id, kind=kind, model=model, version=version, doc=body, ts=now, seq=seq, digest=sha
    )
    session.add(row)
    freshness.advance(session, device, kind, (seq, sha, ts), now, mark)  # one flush with the row
    matrix.record(session, row)  # the row the fleet evidence matrix aggregates
    return True, _answer(device.device_id, kind, row, stored=True)


def _stored(
    session: Session, device_id: str, kind: str, sha: str, deployment: tuple[str | None, str | None, Any]
) -> tuple[DeviceDocument | None, list[DeviceDocument]]:
    """One read for both (after the mark's lock): the row stored from exactly this document (a duplicate), and the
    rows this one replaces: a device posts a deployment's record again when it grew (shadow, probation figures, the
    trial's attestation), and each deployment keeps one record (same model, version and deployment_id)."""
    model, version, dep = deployment
    match = DeviceDocument.digest == sha
    if isinstance(dep, str):
        match = or_(match, and_(DeviceDocument.model == model, DeviceDocument.version == version))
    rows = session.scalars(
        select(DeviceDocument).where(DeviceDocument.device_id == device_id, DeviceDocument.kind == kind, match)
    ).all()
    same = next((r for r in rows if r.digest == sha), None)
    older = [
        r
        for r in rows
        if isinstance(dep, str) and (r.model, r.version) == (model, version) and isinstance(r.doc, dict)
        and r.doc.get("deployment_id") == dep
    ]  # fmt: skip
    return same, older


def _answer(device_id: str, kind: str, row: DeviceDocument, stored: bool) -> dict[str, Any]:
    return {"device_id": device_id, "kind": kind, "stored": stored, "duplicate": not stored, "document": doc_dict(row)}
