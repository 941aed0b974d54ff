"""DSSE envelopes (the in-toto attestation wrapper, secure-systems-lab/dsse v1) signed with Ed25519.

Signature over PAE(payloadType, payload) = b"DSSEv1 " + len(type) + b" " + type + b" " + len(body) + b" " + body.
Envelope: {"payloadType", "payload": base64, "signatures": [{"keyid", "sig": base64}]}. A verifier is given the
public key it expects (a device's, from the fleet registry); a signature by any other key is refused.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from agent.errors import EdgeAgentError

INTOTO_TYPE = "application/vnd.in-toto+json"
MAX_ENVELOPE = 4 * 1024 * 1024


class AttestationError(EdgeAgentError):
    """An attestation that does not verify (tampered, wrong key, malformed); the message says which."""


def pae(payload_type: str, body: bytes) -> bytes:
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def sign_envelope(body: bytes, key, payload_type: str = INTOTO_TYPE) -> dict[str, Any]:
    from agent.artifacts.keys import key_id

    sig = key.sign(pae(payload_type, body))
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(body).decode(),
        "signatures": [{"keyid": key_id(key.public_key()), "sig": base64.b64encode(sig).decode()}],
    }


def parse_envelope(data: bytes | str | dict) -> dict[str, Any]:
    if isinstance(data, dict):
        env = data
    else:
        if len(data) > MAX_ENVELOPE:
            raise AttestationError(f"attestation is larger than {MAX_ENVELOPE} bytes")
        try:
            env = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise AttestationError(f"attestation is not JSON: {str(exc)[:120]}") from None
    ok = isinstance(env, dict) and isinstance(env.get("payload"), str) and isinstance(env.get("payloadType"), str)
    if not ok or not isinstance(env.get("signatures"), list) or not env["signatures"]:
        raise AttestationError("not a DSSE envelope (payloadType, payload, signatures)")
    return env


def verify_envelope(data: bytes | str | dict, public_key) -> bytes:
    """The payload bytes when one signature verifies with `public_key`; AttestationError (why) otherwise."""
    from cryptography.exceptions import InvalidSignature

    from agent.artifacts.keys import key_id

    env = parse_envelope(data)
    body = _b64(env["payload"], "payload")
    want = key_id(public_key)
    keyids = [s.get("keyid") for s in env["signatures"] if isinstance(s, dict)]
    for s in env["signatures"]:
        if not isinstance(s, dict) or s.get("keyid") != want:
            continue
        try:
            public_key.verify(_b64(s.get("sig"), "signature"), pae(env["payloadType"], body))
        except (AttestationError, ValueError, TypeError, InvalidSignature):
            raise AttestationError(f"signature by key {want} does not match the attestation (altered)") from None
        if env["payloadType"] != INTOTO_TYPE:
            raise AttestationError(f"payloadType {env['payloadType']!r} is not {INTOTO_TYPE}")
        return body
    raise AttestationError(f"signed by key(s) {keyids}, not by the expected device key {want}")


def _b64(text: object, what: str) -> bytes:
    """Strict, canonical base64: a string that decodes but re-encodes differently (spare bits set) is refused."""
    try:
        raw = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        raise AttestationError(f"attestation {what} is not base64") from None
    if base64.b64encode(raw).decode() != text:
        raise AttestationError(f"attestation {what} is not canonical base64 (altered)")
    return raw
