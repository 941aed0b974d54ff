"""The device-side rules a manifest must pass that do not need its signature: expiry, issue time, targeting,
downgrade, size."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol, TypeVar

from agent.artifacts.manifest.parts import Artifact
from agent.artifacts.manifest.rejection import ManifestRejected
from agent.artifacts.manifest.versions import compare_versions


class Ruled(Protocol):
    """What the policy reads of a manifest (document.Manifest is one): the policy needs no import of it."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def artifact(self) -> Artifact: ...
    @property
    def issued_at(self) -> int: ...
    @property
    def expires_at(self) -> int: ...
    @property
    def rollback(self) -> bool: ...
    @property
    def devices(self) -> tuple[str, ...]: ...
    @property
    def groups(self) -> tuple[str, ...]: ...
    def targets(self, device_id: str, groups: Iterable[str] = ()) -> bool: ...


M = TypeVar("M", bound=Ruled)


def check_policy(
    m: M,
    installed_version: str | None = None,
    *,
    device_id: str | None = None,
    groups: Iterable[str] = (),
    now: float | None = None,
    max_artifact_bytes: int | None = None,
    free_bytes: int | None = None,
    max_skew_s: float | None = None,
) -> M:
    """The device-side rules that do not need the signature: expiry, issue time (at most `max_skew_s` ahead of
    the device clock, when given), targeting, downgrade, size."""
    now = time.time() if now is None else now
    if now >= m.expires_at:
        raise ManifestRejected(
            "expired", f"expired at {_iso(m.expires_at)} (device time {_iso(now)})", m.name, m.version
        )
    if max_skew_s is not None and m.issued_at > now + max_skew_s:
        raise ManifestRejected(
            "future-dated",
            f"issued at {_iso(m.issued_at)}, {m.issued_at - now:.0f} s ahead of the device clock ({_iso(now)}); "
            f"at most {max_skew_s:.0f} s of clock skew is accepted (fix the control plane's clock and push again)",
            m.name,
            m.version,
        )
    if device_id is not None and not m.targets(device_id, groups):
        raise ManifestRejected(
            "not-targeted",
            f"targets devices {list(m.devices)} and groups {list(m.groups)}, not {device_id} (groups {list(groups)})",
            m.name,
            m.version,
        )
    older = downgrade(m, installed_version)
    if older is not None:
        raise older
    if max_artifact_bytes is not None and m.artifact.size > max_artifact_bytes:
        raise ManifestRejected(
            "too-large",
            f"artifact is {m.artifact.size} bytes, above the limit of {max_artifact_bytes}",
            m.name,
            m.version,
        )
    if free_bytes is not None and m.artifact.size > free_bytes:
        raise ManifestRejected(
            "no-space", f"artifact is {m.artifact.size} bytes but only {free_bytes} are free", m.name, m.version
        )
    return m


def downgrade(m: Ruled, installed_version: str | None) -> ManifestRejected | None:
    """The one downgrade rule: a manifest must be newer than the installed version, unless it is a signed
    rollback. The rejection, or None when the manifest may go on."""
    if installed_version is None or m.rollback or compare_versions(m.version, installed_version) > 0:
        return None
    return ManifestRejected(
        "downgrade",
        f"version {m.version} is not newer than installed {installed_version} (push a signed rollback to go back)",
        m.name,
        m.version,
    )


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
