"""The in-toto Statements a device makes: what qualification measured, and what the trial (shadow/probation)
concluded. Pure builders: dicts in, dicts out.

Subject: the model package (name + the sha256 of the artifact the device verified and ran; where the package
carried an OpenSSF model signature, also that signature's manifest digest). Predicates:
- QUALIFICATION: the decision record (device profile, runtime and provider versions, per-provider rows with
  coverage, accuracy, latency and memory and the conditions they were measured under, the selection and why);
- TRIAL: the shadow and probation figures and the verdict (committed or rolled back, with the reason).
"""

from __future__ import annotations

import time
from typing import Any

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
QUALIFICATION = "https://edge-agent.dev/attestation/qualification/v1"
TRIAL = "https://edge-agent.dev/attestation/trial/v1"
KINDS = {"qualification": QUALIFICATION, "trial": TRIAL}


def subject(model: str, sha256: str, extra_digests: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return [{"name": model, "digest": {"sha256": sha256, **(extra_digests or {})}}]


def statement(subjects: list[dict[str, Any]], predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": predicate_type, "predicate": predicate}


def _device(device_id: str, key_id: str) -> dict[str, Any]:
    return {"id": device_id, "key_id": key_id}


def qualification_predicate(
    device_id: str, key_id: str, dep: dict[str, Any], decision: dict[str, Any], now: float | None = None
) -> dict[str, Any]:
    """dep: {"id", "model", "version"}; decision: the qualify decision record (Decision.to_dict())."""
    return {
        "device": _device(device_id, key_id),
        "deployment": dep,
        "decision": decision,
        "selected": decision.get("selected"),
        "why": decision.get("reason") or "",
        "attested_at": time.time() if now is None else now,
    }


def trial_predicate(
    device_id: str,
    key_id: str,
    dep: dict[str, Any],
    verdict: str,
    reason: str | None,
    figures: dict[str, Any],
    now: float | None = None,
) -> dict[str, Any]:
    """verdict: committed | rolled_back | failed; figures: {"shadow": {...}, "probation": {...}, "selected": ...}."""
    return {
        "device": _device(device_id, key_id),
        "deployment": dep,
        "verdict": verdict,
        "reason": reason,
        **figures,
        "attested_at": time.time() if now is None else now,
    }
