"""Device attestations in the control plane. A device sends them inside the decision record of their deployment
(`attestations`: {kind: DSSE envelope}, agent.transport.cpclient.signed_decision); the service verifies each one
against that accepted device's key (agent.evidence.verify: signed by it, naming it, and of the kind it is sent
as) and keeps, per kind, the verdict with the envelope itself, so anyone can check it again offline
(`edge-agent attestation verify`). A refused attestation is kept as refused, with the reason; the record it came
in is not refused for it (the record's own signature verified)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from agent.controlplane import repo

DECISION = "decision"


def verify_embedded(public_key, device_id: str, envelopes: object) -> dict[str, dict[str, Any]]:
    """{kind: {"verified": True, "summary": {...}, "envelope"} | {"verified": False, "reason", "envelope"}}."""
    from agent.evidence.dsse import AttestationError
    from agent.evidence.verify import verify_attestation

    out: dict[str, dict[str, Any]] = {}
    for kind, envelope in envelopes.items() if isinstance(envelopes, dict) else ():
        try:
            summary = verify_attestation(envelope, public_key, device_id)
            if summary["kind"] != kind:
                raise AttestationError(f"sent as the {kind} attestation, signed as the {summary['kind']}")
        except AttestationError as exc:
            out[str(kind)[:32]] = {"verified": False, "reason": str(exc)[:300], "envelope": envelope}
            continue
        summary.pop("statement")
        out[str(kind)[:32]] = {"verified": True, "summary": summary, "envelope": envelope}
    return out


def listing(session: Session, device_id: str, limit: int = 20) -> list[dict[str, Any]]:
    """The attestations in the device's latest decision records, newest record first: {deployment_id, kind,
    received, verified, summary | reason, envelope}."""
    rows = []
    for d in repo.documents(session, device_id, DECISION, limit):
        embedded = d.doc.get("attestations") if isinstance(d.doc, dict) else None
        for kind, att in sorted((embedded or {}).items()):
            if isinstance(att, dict) and "verified" in att:
                rows.append({"deployment_id": d.doc.get("deployment_id"), "kind": kind, "received": d.ts, **att})
    return rows
