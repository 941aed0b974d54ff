"""Signed device documents: status, events and health carry {"sig": {"key_id", "signature"}} over the canonical
JSON of the rest of the document (sorted keys, no spaces), made with the device's own Ed25519 key."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIG = "sig"


def sign_doc(doc: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """A copy of `doc` with its signature (an existing "sig" is replaced)."""
    from agent.artifacts.keys import key_id
    from agent.artifacts.manifest import canonical_json

    body = {k: v for k, v in doc.items() if k != SIG}
    sig = key.sign(canonical_json(body))
    return {**body, SIG: {"key_id": key_id(key.public_key()), "signature": base64.b64encode(sig).decode()}}


def verify_doc(doc: dict[str, Any], public_key: Ed25519PublicKey) -> str:
    """ "verified", "unsigned" or "bad-signature" (also for a signature by another key)."""
    from cryptography.exceptions import InvalidSignature

    from agent.artifacts.keys import key_id
    from agent.artifacts.manifest import canonical_json

    sig = doc.get(SIG)
    if not isinstance(sig, dict) or not sig.get("signature"):
        return "unsigned"
    if sig.get("key_id") != key_id(public_key):
        return "bad-signature"
    try:
        raw = base64.b64decode(str(sig["signature"]), validate=True)
        public_key.verify(raw, canonical_json({k: v for k, v in doc.items() if k != SIG}))
    except (binascii.Error, ValueError, TypeError, InvalidSignature):
        return "bad-signature"
    return "verified"
