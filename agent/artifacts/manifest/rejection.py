"""A refused manifest: `ManifestRejected` (its code, reason and best-effort names) and the status record of it."""

from __future__ import annotations

import time
from typing import Any

from agent.errors import ManifestError


class ManifestRejected(ManifestError):
    """A refused manifest. `code` is one of: malformed, unsigned, untrusted-key, bad-signature, invalid-name,
    expired, future-dated, not-targeted, downgrade, too-large, no-space. `model`/`version` are best-effort (unverified)."""

    def __init__(self, code: str, reason: str, model: str | None = None, version: str | None = None):
        super().__init__(f"manifest rejected ({code}): {reason}")
        self.code, self.reason, self.model, self.version = code, reason, model, version


def rejection_record(
    exc: ManifestRejected, deployment_id: str | None = None, ts: float | None = None
) -> dict[str, Any]:
    """The status document's deployments[model] entry for a rejection (what `fleet status` shows)."""
    return {
        "id": deployment_id or f"{exc.model or 'unknown'}-{exc.version or '?'}-rejected",
        "version": exc.version,
        "state": "rejected",
        "result": "rejected",
        "reason": exc.reason,
        "code": exc.code,
        "ts": time.time() if ts is None else ts,
    }
