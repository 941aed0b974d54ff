"""Who made a package's golden outputs (issue 36): model.yaml `golden_made_by: {runtime, provider, version}`,
written by `edge-agent package` (onnxruntime's CPU provider) and declarable by hand. Qualification reads it to
say when a row's accuracy is that runtime and provider compared with themselves (agent.qualify.owngolden). A
package without it (made before, or by hand) reads as made by "unknown"."""

from __future__ import annotations

from typing import Any

UNKNOWN = "unknown"
KEYS = ("runtime", "provider", "version")
MAX_CHARS = 200


def validate(value: Any, bad: Any) -> None:
    """model.yaml golden_made_by: {runtime: STR, provider: STR, version: STR (optional)}."""
    if not isinstance(value, dict) or set(value) - set(KEYS) or not {"runtime", "provider"} <= set(value):
        raise bad("golden_made_by", "expected {runtime: NAME, provider: NAME, version: V} (version optional)")
    for key, v in value.items():
        if not isinstance(v, str) or not v.strip() or len(v) > MAX_CHARS:
            raise bad(f"golden_made_by.{key}", f"expected a non-empty string of at most {MAX_CHARS} characters")


def made_by(meta: dict[str, Any] | None) -> dict[str, str]:
    """{runtime, provider[, version]} of the golden outputs; runtime and provider "unknown" when not said."""
    value = (meta or {}).get("golden_made_by")
    if isinstance(value, dict) and value.get("runtime") and value.get("provider"):
        return {k: str(value[k]) for k in KEYS if k in value}
    return {"runtime": UNKNOWN, "provider": UNKNOWN}


def describe(m: dict[str, str]) -> str:
    """'onnxruntime 1.32.0 CPUExecutionProvider', or 'unknown'."""
    if m.get("runtime") == UNKNOWN:
        return UNKNOWN
    return " ".join(x for x in (m.get("runtime"), m.get("version"), m.get("provider")) if x)


def by_onnxruntime(version: str, provider: str) -> dict[str, str]:
    """What `edge-agent package` writes for its fp32 run."""
    return {"runtime": "onnxruntime", "version": version, "provider": provider}
