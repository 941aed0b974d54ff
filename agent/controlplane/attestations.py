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
from agent.errors import EdgeAgentError

DECISION = "decision"


class Mismatch(EdgeAgentError):
    """A verified attestation of another deployment or artifact than the record it came in: HTTP 422."""


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


def check_bound(record: dict[str, Any]) -> None:
    """Each verified attestation must name the record's deployment (`deployment_id`) and, where the record names
    its artifact (`artifact_sha256`, sent by devices since freshness came), that artifact as its subject's
    sha256: else Mismatch, and the whole record is refused (an attestation of X is never listed under Y)."""
    dep_id, artifact = record.get("deployment_id"), record.get("artifact_sha256")
    for kind, att in (record.get("attestations") or {}).items():
        if not att.get("verified"):
            continue
        summary = att["summary"]
        if summary.get("deployment") != dep_id or not isinstance(dep_id, str):
            raise Mismatch(
                f"attestations.{kind}: attests deployment {str(summary.get('deployment'))[:140]!r}, sent in the "
                f"record of {str(dep_id)[:140]!r}: refused, nothing stored"
            )
        digest = summary.get("digest") if isinstance(summary.get("digest"), dict) else {}
        if isinstance(artifact, str) and digest.get("sha256") != artifact:
            raise Mismatch(
                f"attestations.{kind}: attests artifact sha256 {str(digest.get('sha256'))[:64]!r}, the record's "
                f"artifact is {artifact[:64]!r}: refused, nothing stored"
            )


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
