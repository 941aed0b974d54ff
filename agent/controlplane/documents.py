"""Storing a device's signed document once its signature verified (the API checks that): freshness first
(agent.controlplane.freshness: a duplicate is answered with its row, a replay refused), then the embedded
attestations (verified, and bound to the record's deployment and artifact), then one row per deployment."""

from __future__ import annotations

import time
from typing import Any

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
    same = freshness.duplicate(session, device.device_id, kind, sha)
    if same is not None:
        return False, _answer(device.device_id, kind, same, stored=False)
    seq, ts = freshness.stamp(doc, now)
    mark = freshness.check(session, device, kind, seq)
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
    model = body.get("model") if isinstance(body.get("model"), str) else None
    version = body.get("version") if isinstance(body.get("version"), str) else None
    repo.replace_document(session, device.device_id, kind, model, version, body.get("deployment_id"))
    row = DeviceDocument(
        device_id=device.device_id, kind=kind, model=model, version=version, doc=body, ts=now, seq=seq, digest=sha
    )
    session.add(row)
    freshness.advance(session, device, kind, (seq, sha, ts), now, mark)  # one flush with the row
    matrix.record(session, row)  # the row the fleet evidence matrix aggregates
    return True, _answer(device.device_id, kind, row, stored=True)


def _answer(device_id: str, kind: str, row: DeviceDocument, stored: bool) -> dict[str, Any]:
    return {"device_id": device_id, "kind": kind, "stored": stored, "duplicate": not stored, "document": doc_dict(row)}
