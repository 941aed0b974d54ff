"""Signed manifests: schema, canonical JSON, Ed25519 sign/verify, and every rejection rule.

A device calls `receive(envelope_bytes, trusted_keys, installed_version)` before downloading a byte; it returns
a verified `Manifest` or raises `ManifestRejected` (a ManifestError) whose `code` and message say why.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.errors import ManifestError
from agent.names import is_valid_name

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

SCHEMA = 1
FORMATS = ("onnx", "tar.gz")
MIN_CHUNK = 1024
MAX_CHUNK = 8 * 1024 * 1024
MAX_CHUNKS = 65536
MAX_ENVELOPE_BYTES = 4 * 1024 * 1024
VERSION_RE = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9}){0,7}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
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
ARTIFACT_KEYS = {"sha256", "size", "chunk_size", "chunks", "format"}
ARTIFACT_OPTIONAL = {"recipe"}  # content-defined chunks for delta pulls (agent.artifacts.recipe); older agents
# refuse a manifest with it, so `fleet push --no-delta` leaves it out


class ManifestRejected(ManifestError):
    """A refused manifest. `code` is one of: malformed, unsigned, untrusted-key, bad-signature, invalid-name,
    expired, future-dated, not-targeted, downgrade, too-large, no-space. `model`/`version` are best-effort (unverified)."""

    def __init__(self, code: str, reason: str, model: str | None = None, version: str | None = None):
        super().__init__(f"manifest rejected ({code}): {reason}")
        self.code, self.reason, self.model, self.version = code, reason, model, version


def parse_version(v: object) -> tuple[int, ...]:
    """'2.0.3' -> (2, 0, 3); trailing zeros do not matter for comparison ('1' == '1.0')."""
    if not isinstance(v, str) or not VERSION_RE.fullmatch(v):
        raise ManifestError(f"invalid version {v!r}: use dotted integers like 3 or 2.0.1")
    parts = [int(p) for p in v.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def compare_versions(a: str, b: str) -> int:
    pa, pb = parse_version(a), parse_version(b)
    n = max(len(pa), len(pb))
    pa, pb = pa + (0,) * (n - len(pa)), pb + (0,) * (n - len(pb))
    return (pa > pb) - (pa < pb)


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8, no NaN/Infinity: the bytes the signature covers."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


@dataclass(frozen=True)
class Artifact:
    sha256: str
    size: int
    chunk_size: int
    chunks: tuple[str, ...]
    format: str = "onnx"
    recipe: Mapping[str, Any] | None = None

    @property
    def count(self) -> int:
        return len(self.chunks)

    def chunk_len(self, index: int) -> int:
        return min(self.chunk_size, self.size - index * self.chunk_size)

    def offset(self, index: int) -> int:
        return index * self.chunk_size

    def to_dict(self) -> dict:
        out = {
            "sha256": self.sha256,
            "size": self.size,
            "chunk_size": self.chunk_size,
            "chunks": list(self.chunks),
            "format": self.format,
        }
        if self.recipe is not None:
            out["recipe"] = {"chunker": self.recipe["chunker"], "chunks": [list(c) for c in self.recipe["chunks"]]}
        return out


@dataclass(frozen=True)
class Source:
    type: str  # "mqtt" | "http"
    url: str | None = None

    def to_dict(self) -> dict:
        return {"type": self.type} if self.url is None else {"type": self.type, "url": self.url}


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
        chunks,
        fmt: str = "onnx",
        sources=({"type": "mqtt"},),
        devices=(),
        groups=(),
        qualification=None,
        ttl_s: int = 30 * 86400,
        rollback: bool = False,
        now: float | None = None,
        recipe: Mapping[str, Any] | None = None,
    ) -> "Manifest":
        issued = int(time.time() if now is None else now)
        art = {"sha256": sha256, "size": size, "chunk_size": chunk_size, "chunks": list(chunks), "format": fmt}
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
    def from_dict(cls, d: object, key_id: str | None = None) -> "Manifest":
        """Strict schema check; raises ManifestRejected('malformed' or 'invalid-name')."""
        return _parse_manifest(d, key_id)

    def to_dict(self) -> dict:
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

    def sign(self, private_key) -> bytes:
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
    def targets(self, device_id: str, groups=()) -> bool:
        return device_id in self.devices or bool(set(groups) & set(self.groups))

    def source(self, kind: str) -> Source | None:
        return next((s for s in self.sources if s.type == kind), None)

    @staticmethod
    def verify(envelope: bytes | str, trusted_keys, installed_version: str | None = None, **kw) -> "Manifest":
        """Verify a signed envelope (same as `receive`); returns the Manifest or raises ManifestRejected."""
        return receive(envelope, trusted_keys, installed_version, **kw)


def _bad(reason: str, d: object = None) -> ManifestRejected:
    name = d.get("name") if isinstance(d, dict) and isinstance(d.get("name"), str) else None
    version = d.get("version") if isinstance(d, dict) and isinstance(d.get("version"), str) else None
    return ManifestRejected("malformed", reason, (name or "")[:64] or None, (version or "")[:32] or None)


def _int(d: dict, key: str, lo: int, hi: int, where: str, whole: object) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(f"{where}{key} must be an integer in [{lo}, {hi}], got {v!r}"[:200], whole)
    return v


def _parse_artifact(a: object, whole: object) -> Artifact:
    if not isinstance(a, dict) or not ARTIFACT_KEYS <= set(a) <= ARTIFACT_KEYS | ARTIFACT_OPTIONAL:
        raise _bad(f"artifact must have the keys {sorted(ARTIFACT_KEYS)} (and optionally 'recipe')", whole)
    sha = a["sha256"]
    if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
        raise _bad("artifact.sha256 must be 64 lower-case hex digits", whole)
    size = _int(a, "size", 1, 2**50, "artifact.", whole)
    chunk = _int(a, "chunk_size", MIN_CHUNK, MAX_CHUNK, "artifact.", whole)
    chunks = a["chunks"]
    if not isinstance(chunks, list) or len(chunks) > MAX_CHUNKS:
        raise _bad(f"artifact.chunks must be a list of at most {MAX_CHUNKS} hashes", whole)
    if len(chunks) != math.ceil(size / chunk):
        raise _bad(f"artifact.chunks has {len(chunks)} hashes; size/chunk_size needs {math.ceil(size / chunk)}", whole)
    if not all(isinstance(c, str) and _HEX64.fullmatch(c) for c in chunks):
        raise _bad("artifact.chunks must hold 64 lower-case hex digits each", whole)
    if a["format"] not in FORMATS:
        raise _bad(f"artifact.format must be one of {list(FORMATS)}", whole)
    recipe = _parse_recipe(a["recipe"], size, whole) if "recipe" in a else None
    return Artifact(sha, size, chunk, tuple(chunks), a["format"], recipe)


def _parse_recipe(r: object, size: int, whole: object) -> dict:
    """{"chunker": str, "chunks": [[sha256, length], ...]} whose lengths add up to the artifact's size."""
    if not isinstance(r, dict) or set(r) != {"chunker", "chunks"} or not isinstance(r["chunker"], str):
        raise _bad("artifact.recipe must be {'chunker': str, 'chunks': [[sha256, length], ...]}", whole)
    items = r["chunks"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_CHUNKS:
        raise _bad(f"artifact.recipe.chunks must list 1-{MAX_CHUNKS} chunks", whole)
    total = 0
    for c in items:
        ok = isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and _HEX64.fullmatch(c[0])
        if not ok or isinstance(c[1], bool) or not isinstance(c[1], int) or not 1 <= c[1] <= MAX_CHUNK:
            raise _bad("artifact.recipe.chunks holds [64 hex digits, length 1..8 MiB] pairs", whole)
        total += c[1]
    if total != size:
        raise _bad(f"artifact.recipe covers {total} bytes; the artifact has {size}", whole)
    return {"chunker": r["chunker"][:64], "chunks": [tuple(c) for c in items]}


def _parse_sources(s: object, whole: object) -> tuple[Source, ...]:
    if not isinstance(s, list) or not 1 <= len(s) <= 8:
        raise _bad("sources must be a list of 1-8 sources", whole)
    out = []
    for src in s:
        if isinstance(src, dict) and src == {"type": "mqtt"}:
            out.append(Source("mqtt"))
        elif (
            isinstance(src, dict)
            and set(src) == {"type", "url"}
            and src["type"] == "http"
            and isinstance(src["url"], str)
            and re.fullmatch(r"https?://[^\s]{1,2000}", src["url"])
        ):
            out.append(Source("http", src["url"]))
        else:
            raise _bad(
                f"unknown source {str(src)[:100]}: use {{'type': 'mqtt'}} or {{'type': 'http', 'url': 'https://...'}}",
                whole,
            )
    return tuple(out)


def _parse_targeting(t: object, whole: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not isinstance(t, dict) or set(t) != {"devices", "groups"}:
        raise _bad("targeting must be {'devices': [...], 'groups': [...]}", whole)
    out = []
    for key in ("devices", "groups"):
        items = t[key]
        if not isinstance(items, list) or len(items) > 10000:
            raise _bad(f"targeting.{key} must be a list", whole)
        for item in items:
            if not is_valid_name(item):
                raise ManifestRejected("invalid-name", f"targeting.{key} holds an invalid name {str(item)[:80]!r}")
        out.append(tuple(items))
    if not out[0] and not out[1]:
        raise _bad("targeting names no device and no group", whole)
    return out[0], out[1]


def _parse_manifest(d: object, key_id: str | None) -> Manifest:
    if not isinstance(d, dict):
        raise _bad("manifest must be a JSON object")
    if set(d) != MANIFEST_KEYS:
        extra, missing = sorted(set(d) - MANIFEST_KEYS), sorted(MANIFEST_KEYS - set(d))
        raise _bad(f"manifest keys: missing {missing}, unknown {[str(k)[:40] for k in extra][:5]}", d)
    if d["schema"] != SCHEMA or isinstance(d["schema"], bool):
        raise _bad(f"unsupported manifest schema {str(d['schema'])[:20]} (this agent reads schema {SCHEMA})", d)
    if not is_valid_name(d["name"]):
        raise ManifestRejected(
            "invalid-name", f"model name {str(d['name'])[:80]!r} is not a safe name (path traversal?)"
        )
    try:
        parse_version(d["version"])
    except ManifestError as exc:
        raise _bad(str(exc)[:200], d) from None
    artifact = _parse_artifact(d["artifact"], d)
    sources = _parse_sources(d["sources"], d)
    devices, groups = _parse_targeting(d["targeting"], d)
    if not isinstance(d["qualification"], dict) or not all(isinstance(k, str) for k in d["qualification"]):
        raise _bad("qualification must be an object", d)
    issued = _int(d, "issued_at", 0, 2**40, "", d)
    expires = _int(d, "expires_at", 0, 2**40, "", d)
    if expires <= issued:
        raise _bad("expires_at must be after issued_at", d)
    if not isinstance(d["rollback"], bool):
        raise _bad("rollback must be true or false", d)
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


def parse_envelope(data: bytes | str) -> tuple[dict, bytes, str]:
    """Split an envelope into (manifest dict, signature bytes, key_id); ManifestRejected on any shape error."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_ENVELOPE_BYTES:
        raise ManifestRejected("malformed", f"envelope must be JSON bytes of at most {MAX_ENVELOPE_BYTES} bytes")
    try:
        env = json.loads(bytes(data).decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestRejected("malformed", f"envelope is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(env, dict) or "manifest" not in env:
        raise ManifestRejected("malformed", "envelope must be an object with 'manifest', 'signature', 'key_id'")
    sig, kid = env.get("signature"), env.get("key_id")
    if sig in (None, "") or kid in (None, ""):
        raise ManifestRejected("unsigned", "manifest carries no signature", *_names(env["manifest"]))
    if set(env) != {"manifest", "signature", "key_id"} or not isinstance(sig, str) or not isinstance(kid, str):
        raise ManifestRejected("malformed", "envelope must have exactly 'manifest', 'signature' (base64), 'key_id'")
    try:
        raw = base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        raise ManifestRejected("malformed", "signature is not base64", *_names(env["manifest"])) from None
    if len(raw) != 64 or not _HEX16.fullmatch(kid):
        raise ManifestRejected(
            "malformed", "signature must be 64 bytes and key_id 16 hex digits", *_names(env["manifest"])
        )
    return env["manifest"], raw, kid


def _no_constants(name: str):
    raise ValueError(f"{name} is not allowed")


def _names(m: object) -> tuple[str | None, str | None]:
    if not isinstance(m, dict):
        return None, None
    n, v = m.get("name"), m.get("version")
    return (n[:64] if isinstance(n, str) else None), (v[:32] if isinstance(v, str) else None)


def receive(
    envelope: bytes | str,
    trusted_keys: Mapping[str, Ed25519PublicKey],
    installed_version: str | None = None,
    *,
    device_id: str | None = None,
    groups=(),
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
    model, version = _names(d)
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


def check_policy(
    m: Manifest,
    installed_version: str | None = None,
    *,
    device_id: str | None = None,
    groups=(),
    now: float | None = None,
    max_artifact_bytes: int | None = None,
    free_bytes: int | None = None,
    max_skew_s: float | None = None,
) -> Manifest:
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
    if installed_version is not None and compare_versions(m.version, installed_version) <= 0 and not m.rollback:
        raise ManifestRejected(
            "downgrade",
            f"version {m.version} is not newer than installed {installed_version} (push a signed rollback to go back)",
            m.name,
            m.version,
        )
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


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def rejection_record(exc: ManifestRejected, deployment_id: str | None = None, ts: float | None = None) -> dict:
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
