"""DesiredBook: the retained desired state of each model per scope, verified before anything ranks or acts on it.

Every message is verified completely (signature, trusted key, schema, expiry, targeting, issue time within the
clock-skew bound) when it arrives; only verified candidates take part in device-vs-group precedence, which
therefore uses signed fields only. The version order against the committed version is checked on the winner.
An unverifiable message replaces its scope's candidate (it is what the broker now retains) but can never win.
"""

from __future__ import annotations

import collections
import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.artifacts.manifest import Manifest, ManifestRejected, parse_version, receive
from agent.artifacts.manifest.policy import downgrade

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

MAX_SKEW_S = 300.0  # default of trust.max_skew_s: an issue time further ahead of the device clock is refused
RECHECK_S = 60.0  # future-dated candidates are verified again this often (the clocks may agree later)
MAX_MODELS = 1024  # models with retained desired state tracked at once (a flood of topics cannot grow memory)


@dataclass
class Candidate:
    """One scope's retained message for a model, with its verification outcome."""

    scope: str  # "device" or "group:<name>"
    topic: str
    envelope: bytes
    digest: str
    manifest: Manifest | None = None
    rejection: ManifestRejected | None = None
    checked: float = 0.0


class DesiredBook:
    """Per model, per scope: the latest retained message, verified. Not thread-safe (the agent loop owns it)."""

    def __init__(
        self,
        keys: Callable[[], Mapping[str, Ed25519PublicKey]],
        device_id: str,
        groups: Iterable[str] = (),
        *,
        max_skew_s: float = MAX_SKEW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys, self.device_id, self.groups = keys, device_id, tuple(groups)
        self.max_skew_s, self.clock = max_skew_s, clock
        self._cands: collections.OrderedDict[str, dict[str, Candidate]] = collections.OrderedDict()

    def update(self, scope: str, model: str, payload: bytes, topic: str) -> list[Candidate]:
        """Record one message (b"" = withdrawn); returns the candidates it refused (to report)."""
        scopes = self._cands.setdefault(model, {})
        self._cands.move_to_end(model)
        if len(self._cands) > MAX_MODELS:
            self._evict(keep=model)
        if not payload:
            scopes.pop(scope, None)
            return []
        digest = hashlib.sha256(payload).hexdigest()
        old = scopes.get(scope)
        if old is not None and old.digest == digest:
            return []
        cand = Candidate(scope, topic, bytes(payload), digest)
        self._verify(cand, model)
        scopes[scope] = cand
        return [cand] if cand.rejection is not None else []

    def _evict(self, keep: str) -> None:
        """Over MAX_MODELS: drop the oldest model holding no verified candidate (a flood of refused topics never
        pushes out real desired state), else the oldest."""
        victim = next(
            (m for m, sc in self._cands.items() if m != keep and not any(c.manifest for c in sc.values())),
            next(m for m in self._cands if m != keep),
        )
        del self._cands[victim]

    def recheck(self) -> tuple[set[str], list[tuple[str, Candidate]]]:
        """Verify future-dated candidates again (RECHECK_S apart); returns (models whose outcome changed,
        (model, candidate) still refused for a new reason)."""
        changed: set[str] = set()
        refused: list[tuple[str, Candidate]] = []
        now = self.clock()
        for model, scopes in self._cands.items():
            for cand in scopes.values():
                if cand.rejection is None or cand.rejection.code != "future-dated" or now - cand.checked < RECHECK_S:
                    continue
                before = cand.rejection.code
                self._verify(cand, model)
                if cand.rejection is None:
                    changed.add(model)
                elif cand.rejection.code != before:
                    refused.append((model, cand))
        return changed, refused

    def models(self) -> list[str]:
        return list(self._cands)

    def resolve(self, model: str) -> Candidate | None:
        """The verified winner: among groups the highest version; the device's own beats the best group's unless
        the group's was issued later (all read from verified manifests)."""
        valid = [c for c in self._cands.get(model, {}).values() if c.manifest is not None]
        groups = [c for c in valid if c.scope != "device"]
        best = max(groups, key=lambda c: (parse_version(c.manifest.version), c.scope), default=None)  # type: ignore[union-attr]
        device = next((c for c in valid if c.scope == "device"), None)
        if device is not None and (best is None or device.manifest.issued_at >= best.manifest.issued_at):  # type: ignore[union-attr]
            return device
        return best

    def _verify(self, cand: Candidate, model: str) -> None:
        cand.checked = self.clock()
        try:
            m = receive(
                cand.envelope,
                self.keys(),
                None,
                device_id=self.device_id,
                groups=self.groups,
                now=cand.checked,
                max_skew_s=self.max_skew_s,
            )
        except ManifestRejected as exc:
            cand.manifest, cand.rejection = None, exc
            return
        if m.name != model:
            cand.manifest, cand.rejection = (
                None,
                ManifestRejected(
                    "malformed", f"manifest names model {m.name!r} but was published for {model!r}", m.name, m.version
                ),
            )
            return
        cand.manifest, cand.rejection = m, None


def version_order(m: Manifest, committed: str | None) -> ManifestRejected | None:
    """The downgrade rule (agent.artifacts.manifest.policy.downgrade) against the committed version."""
    try:
        return downgrade(m, committed)
    except Exception:  # noqa: BLE001 - an unparseable committed version does not block a verified manifest
        return None
