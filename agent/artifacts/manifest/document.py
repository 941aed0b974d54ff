"""The manifest document: `Manifest` (create, strict parse, canonical form, sign) and `receive`, which checks a
signed envelope (trusted key, signature, schema, then the device-side policy) before any download."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.artifacts.manifest.envelope import canonical_json, names_of, parse_envelope
from agent.artifacts.manifest.parts import (
    Artifact,
    Source,
    bounded_int,
    malformed,
    parse_artifact,
    parse_sources,
    parse_targeting,
)
from agent.artifacts.manifest.policy import check_policy
from agent.artifacts.manifest.rejection import ManifestRejected
from agent.artifacts.manifest.versions import parse_version
from agent.errors import ManifestError
from agent.names import is_valid_name

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SCHEMA = 1
MANIFEST_KEYS = {
    "schema",
    "name",
    "version",
    "artifact",
    "sources",
    "targeting",
    "qualification",
    "issued_at",
    "expires_at",
    "rollback",
}


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    artifact: Artifact
    sources: tuple[Source, ...]
    devices: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    qualification: Mapping[str, Any] = field(default_factory=dict)
    issued_at: int = 0
    expires_at: int = 0
    rollback: bool = False
    key_id: str | None = field(default=None, compare=False)

    # --- construction ---------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        *,
        name: str,
        version: str,
        sha256: str,
        size: int,
        chunk_size: int,
        chunks: Iterable[str],
        fmt: str = "onnx",
        sources: Iterable[Source | Mapping[str, Any]] = ({"type": "mqtt"},),
        devices: Iterable[str] = (),
        groups: Iterable[str] = (),
        qualification: Mapping[str, Any] | None = None,
        ttl_s: int = 30 * 86400,
        rollback: bool = False,
        now: float | None = None,
        recipe: Mapping[str, Any] | None = None,
    ) -> "Manifest":
        issued = int(time.time() if now is None else now)
        art: dict[str, Any] = {
            "sha256": sha256,
            "size": size,
            "chunk_size": chunk_size,
            "chunks": list(chunks),
            "format": fmt,
        }
        if recipe is not None:
            art["recipe"] = dict(recipe)
        return cls.from_dict(
            {
                "schema": SCHEMA,
                "name": name,
                "version": str(version),
                "artifact": art,
                "sources": [s.to_dict() if isinstance(s, Source) else dict(s) for s in sources],
                "targeting": {"devices": list(devices), "groups": list(groups)},
                "qualification": dict(qualification or {}),
                "issued_at": issued,
                "expires_at": issued + int(ttl_s),
                "rollback": bool(rollback),
            }
        )

    @classmethod
    def for_stored(cls, art: Mapping[str, Any], *, name: str, version: str, **kw: Any) -> "Manifest":
        """create() for an artifact as `fleet.push.store_package` stored it (its sha256, size, chunks, format
        and, unless `recipe` is given, its recipe)."""
        kw.setdefault("recipe", art.get("recipe"))
        return cls.create(
            name=name,
            version=version,
            sha256=art["sha256"],
            size=art["size"],
            chunk_size=art["chunk_size"],
            chunks=art["chunks"],
            fmt=art.get("format", "onnx"),
            **kw,
        )

    @classmethod
    def from_dict(cls, d: object, key_id: str | None = None) -> "Manifest":
        """Strict schema check; raises ManifestRejected('malformed' or 'invalid-name')."""
        return _parse_manifest(d, key_id)

    def to_dict(self) -> dict[str, Any]:
        a = self.artifact
        return {
            "schema": SCHEMA,
            "name": self.name,
            "version": self.version,
            "artifact": a.to_dict(),
            "sources": [s.to_dict() for s in self.sources],
            "targeting": {"devices": list(self.devices), "groups": list(self.groups)},
            "qualification": dict(self.qualification),
            "issued_at": self.issued_at,
            "expires_at": self.expires_at,
            "rollback": self.rollback,
        }

    def canonical(self) -> bytes:
        return canonical_json(self.to_dict())

    def sign(self, private_key: Ed25519PrivateKey) -> bytes:
        """The envelope bytes to publish: {"manifest", "signature", "key_id"}."""
        from agent.artifacts.keys import key_id

        sig = private_key.sign(self.canonical())
        env = {
            "manifest": self.to_dict(),
            "signature": base64.b64encode(sig).decode(),
            "key_id": key_id(private_key.public_key()),
        }
        return json.dumps(env, sort_keys=True, separators=(",", ":")).encode()

    # --- queries --------------------------------------------------------------------------------
    def targets(self, device_id: str, groups: Iterable[str] = ()) -> bool:
        return device_id in self.devices or bool(set(groups) & set(self.groups))

    def source(self, kind: str) -> Source | None:
        return next((s for s in self.sources if s.type == kind), None)

    @staticmethod
    def verify(
        envelope: bytes | str,
        trusted_keys: Mapping[str, Ed25519PublicKey],
        installed_version: str | None = None,
        **kw: Any,
    ) -> "Manifest":
        """Verify a signed envelope (same as `receive`); returns the Manifest or raises ManifestRejected."""
        return receive(envelope, trusted_keys, installed_version, **kw)


def _parse_manifest(d: object, key_id: str | None) -> Manifest:
    if not isinstance(d, dict):
        raise malformed("manifest must be a JSON object")
    if set(d) != MANIFEST_KEYS:
        extra, missing = sorted(set(d) - MANIFEST_KEYS), sorted(MANIFEST_KEYS - set(d))
        raise malformed(f"manifest keys: missing {missing}, unknown {[str(k)[:40] for k in extra][:5]}", d)
    if d["schema"] != SCHEMA or isinstance(d["schema"], bool):
        raise malformed(f"unsupported manifest schema {str(d['schema'])[:20]} (this agent reads schema {SCHEMA})", d)
    if not is_valid_name(d["name"]):
        raise ManifestRejected(
            "invalid-name", f"model name {str(d['name'])[:80]!r} is not a safe name (path traversal?)"
        )
    try:
        parse_version(d["version"])
    except ManifestError as exc:
        raise malformed(str(exc)[:200], d) from None
    artifact = parse_artifact(d["artifact"], d)
    sources = parse_sources(d["sources"], d)
    devices, groups = parse_targeting(d["targeting"], d)
    if not isinstance(d["qualification"], dict) or not all(isinstance(k, str) for k in d["qualification"]):
        raise malformed("qualification must be an object", d)
    issued = bounded_int(d, "issued_at", 0, 2**40, "", d)
    expires = bounded_int(d, "expires_at", 0, 2**40, "", d)
    if expires <= issued:
        raise malformed("expires_at must be after issued_at", d)
    if not isinstance(d["rollback"], bool):
        raise malformed("rollback must be true or false", d)
    return Manifest(
        d["name"],
        d["version"],
        artifact,
        sources,
        devices,
        groups,
        dict(d["qualification"]),
        issued,
        expires,
        d["rollback"],
        key_id,
    )


def receive(
    envelope: bytes | str,
    trusted_keys: Mapping[str, Ed25519PublicKey],
    installed_version: str | None = None,
    *,
    device_id: str | None = None,
    groups: Iterable[str] = (),
    now: float | None = None,
    max_artifact_bytes: int | None = None,
    free_bytes: int | None = None,
    max_skew_s: float | None = None,
) -> Manifest:
    """Verify an envelope before any download; return the Manifest or raise ManifestRejected.

    Checks, in order: JSON shape, signature present, key trusted, signature valid, schema and names,
    expiry, targeting (when device_id is given), downgrade (unless a signed rollback), size limits.
    """
    d, sig, kid = parse_envelope(envelope)
    model, version = names_of(d)
    pub = (trusted_keys or {}).get(kid)
    if pub is None:
        raise ManifestRejected(
            "untrusted-key", f"signed by key {kid}, which this device does not trust", model, version
        )
    from cryptography.exceptions import InvalidSignature

    try:
        pub.verify(sig, canonical_json(d))
    except InvalidSignature:
        raise ManifestRejected(
            "bad-signature", f"signature does not match the manifest (key {kid})", model, version
        ) from None
    except (TypeError, ValueError) as exc:
        raise ManifestRejected("malformed", f"manifest cannot be canonicalised: {exc}", model, version) from None
    m = _parse_manifest(d, kid)
    return check_policy(
        m,
        installed_version,
        device_id=device_id,
        groups=groups,
        now=now,
        max_artifact_bytes=max_artifact_bytes,
        free_bytes=free_bytes,
        max_skew_s=max_skew_s,
    )
