"""The signed envelope on the wire, {"manifest", "signature", "key_id"}: its shape checks and the canonical JSON
that the Ed25519 signature covers."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, NoReturn

from agent.artifacts.manifest.rejection import ManifestRejected

MAX_ENVELOPE_BYTES = 4 * 1024 * 1024
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8, no NaN/Infinity: the bytes the signature covers."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def parse_envelope(data: bytes | str) -> tuple[dict[str, Any], bytes, str]:
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
        raise ManifestRejected("unsigned", "manifest carries no signature", *names_of(env["manifest"]))
    if set(env) != {"manifest", "signature", "key_id"} or not isinstance(sig, str) or not isinstance(kid, str):
        raise ManifestRejected("malformed", "envelope must have exactly 'manifest', 'signature' (base64), 'key_id'")
    try:
        raw = base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        raise ManifestRejected("malformed", "signature is not base64", *names_of(env["manifest"])) from None
    if len(raw) != 64 or not _HEX16.fullmatch(kid):
        raise ManifestRejected(
            "malformed", "signature must be 64 bytes and key_id 16 hex digits", *names_of(env["manifest"])
        )
    return env["manifest"], raw, kid


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not allowed")


def names_of(m: object) -> tuple[str | None, str | None]:
    if not isinstance(m, dict):
        return None, None
    n, v = m.get("name"), m.get("version")
    return (n[:64] if isinstance(n, str) else None), (v[:32] if isinstance(v, str) else None)
