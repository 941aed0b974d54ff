"""Device attestations in the control plane: a DSSE envelope (docs/evidence.md) posted by a device is kept only
when it verifies against that accepted device's key and names that device; listed with its verified summary and
the envelope itself, so anyone can check it again offline (`edge-agent attestation verify`)."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy.orm import Session

from agent.controlplane import repo
from agent.controlplane.models import DeviceDocument
from agent.evidence.dsse import AttestationError

KIND = "attestation"


def store(session: Session, device_id: str, data: bytes) -> dict[str, Any]:
    """Verify and keep one envelope; AttestationError says why not (record it with `refused` in a transaction
    of its own), also when the device is not accepted: nothing it says counts yet."""
    from agent.artifacts.keys import parse_public_key
    from agent.evidence.verify import verify_attestation

    row = repo.device(session, device_id)
    if row.state != "accepted":
        raise AttestationError(f"device {device_id} is {row.state}, not accepted")
    summary = verify_attestation(data, parse_public_key(row.public_key, where=f"key of {device_id}"), device_id)
    summary.pop("statement")
    doc = {"summary": summary, "envelope": json.loads(data)}
    session.add(
        DeviceDocument(
            device_id=device_id,
            kind=KIND,
            model=str(summary["model"])[:64],
            version=str(summary["version"])[:64],
            doc=doc,
            ts=time.time(),
        )
    )
    return {"device_id": device_id, "kind": KIND, "stored": True, **{k: summary[k] for k in ("model", "version")}}


def refused(session: Session, device_id: str, exc: AttestationError) -> None:
    repo.audit(session, f"device:{device_id}", "attestation.refused", device_id, reason=str(exc)[:300])


def listing(session: Session, device_id: str, limit: int = 50) -> list[dict[str, Any]]:
    """The device's latest attestations, newest first: {received, summary, envelope}."""
    return [{"received": d.ts, **d.doc} for d in repo.documents(session, device_id, KIND, limit)]
