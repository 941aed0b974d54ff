"""What a device's verified status contributes to the indexed columns the whole-fleet views group by (hardware
class, provider, precision, model versions, model state) and to the small per-model summary a device list shows:
computed once when a status is ingested (and by migration 0003 from the stored documents), so no page view
reads a status document."""

from __future__ import annotations

from typing import Any

SUMMARY_KEYS = ("version", "provider", "precision", "state", "probation_ends", "sha256", "reason")
REASON_CHARS = 300  # a model's reason as the device list shows it (the device page has it whole)
NONE = "none"
WIDTH = 255  # the columns' length (String(255)): a longer value is cut and marked with "..."


def _cut(text: str) -> str:
    return text if len(text) <= WIDTH else text[: WIDTH - 3] + "..."


def models_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    models = status.get("models")
    return {m: v for m, v in sorted(models.items()) if isinstance(v, dict)} if isinstance(models, dict) else {}


def summary(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{model: {version, provider, precision, state, probation_ends, sha256, reason}} (only the keys present; the
    reason cut to REASON_CHARS)."""
    out = {m: {k: v[k] for k in SUMMARY_KEYS if k in v} for m, v in models_of(status).items()}
    for v in out.values():
        if isinstance(v.get("reason"), str):
            v["reason"] = v["reason"][:REASON_CHARS]
    return out


def columns(status: dict[str, Any]) -> dict[str, str]:
    """{"precision", "model_versions", "model_state"}: each model's value joined in model order ("none" when
    the device runs no model; a model without the field counts as "unknown")."""
    models = models_of(status)
    if not models:
        return {"precision": NONE, "model_versions": NONE, "model_state": NONE}

    def joined(key: str) -> str:
        return _cut(", ".join(sorted({str(v.get(key) or "unknown") for v in models.values()})))

    versions = _cut(", ".join(f"{m} {v.get('version')}" for m, v in models.items()))
    return {"precision": joined("precision"), "model_versions": versions, "model_state": joined("state")}
