"""Verify attestations offline: one file against a device's public key, or many against the fleet registry.

`verify_attestation(data, public_key, device_id=None) -> dict` is the one check (the CLI and a control plane
both call it): the DSSE signature by exactly that key, an in-toto Statement v1 of a known predicate type, and
(when given) the device the predicate names. It returns a summary; AttestationError says why not.
"""

from __future__ import annotations

import json
from typing import Any

from agent.evidence import statement as st
from agent.evidence.dsse import AttestationError, verify_envelope


def verify_attestation(data: bytes | str | dict, public_key, device_id: str | None = None) -> dict[str, Any]:
    body = verify_envelope(data, public_key)
    try:
        stmt = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise AttestationError("signed payload is not JSON") from None
    if not isinstance(stmt, dict) or stmt.get("_type") != st.STATEMENT_TYPE:
        raise AttestationError(f"payload is not an in-toto Statement ({st.STATEMENT_TYPE})")
    kinds = {v: k for k, v in st.KINDS.items()}
    if stmt.get("predicateType") not in kinds:
        raise AttestationError(f"unknown predicateType {str(stmt.get('predicateType'))[:100]!r}")
    pred: dict[str, Any] = stmt["predicate"] if isinstance(stmt.get("predicate"), dict) else {}
    dev = pred["device"].get("id") if isinstance(pred.get("device"), dict) else None
    if device_id is not None and dev != device_id:
        raise AttestationError(f"attestation names device {dev!r}, expected {device_id!r}")
    subjects = stmt.get("subject")
    subj: dict[str, Any] = (
        subjects[0] if isinstance(subjects, list) and subjects and isinstance(subjects[0], dict) else {}
    )
    dep: dict[str, Any] = pred["deployment"] if isinstance(pred.get("deployment"), dict) else {}
    return {
        "verified": True,
        "kind": kinds[stmt["predicateType"]],
        "device": dev,
        "model": subj.get("name"),
        "version": dep.get("version"),
        "deployment": dep.get("id"),
        "digest": subj.get("digest"),
        "selected": pred.get("selected") if "selected" in pred else None,
        "verdict": pred.get("verdict"),
        "attested_at": pred.get("attested_at"),
        "statement": stmt,
    }


def verify_many(items, registry) -> list[dict[str, Any]]:
    """items: (device_id, model, kind, envelope bytes) as published; registry: agent.fleet.registry.DeviceRegistry
    (or anything with public_key(device_id)). One row each: the summary, or verified False with the reason (also
    when the signed statement is not the model and kind it was published as)."""
    rows = []
    for device, model, kind, data in items:
        row: dict[str, Any] = {"device": device, "model": model, "kind": kind}
        key = _device_key(registry, device)
        if key is None:
            rows.append({**row, "verified": False, "reason": f"device {device} is not in the registry"})
            continue
        try:
            summary = verify_attestation(data, key, device_id=device)
        except AttestationError as exc:
            rows.append({**row, "verified": False, "reason": str(exc)})
            continue
        summary.pop("statement")
        if (summary["model"], summary["kind"]) != (model, kind):  # listed (and filtered) under what it is
            why = f"published as the {kind} of {model}, signed as the {summary['kind']} of {summary['model']}"
            rows.append({**row, "verified": False, "reason": why})
            continue
        rows.append({**row, **summary})
    return rows


def _device_key(registry, device: str):
    """The device's public key from a DeviceRegistry (None when it is not registered)."""
    from agent.artifacts.keys import parse_public_key

    entry = registry.devices.get(device) if registry is not None else None
    if not entry or not entry.get("public_key"):
        return None
    return parse_public_key(entry["public_key"], where=f"registry key of {device}")
