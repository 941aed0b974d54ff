"""The release manifest: every wheel of a wheelhouse with its sha256 and size, signed by the fleet key
(agent.transport.signing: canonical JSON, Ed25519, key id). `verify` refuses a wheelhouse before anything
installs: a bad or foreign signature, a wheel missing, changed or unlisted by name, a path outside it."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError

MANIFEST_NAME = "release.json"
KIND = "agent-release"
FORMAT = 1
_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)(-[A-Za-z0-9_.]+){3,4}\.whl$")


class ReleaseRejected(EdgeAgentError):
    """A wheelhouse that must not be installed; `reason` is one word (bad-signature, unsigned, digest, ...)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"release refused ({reason}): {detail}")
        self.reason = reason


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_name(filename: str) -> tuple[str, str]:
    m = _WHEEL.match(filename)
    if not m:
        raise ReleaseRejected("malformed", f"{filename!r} is not a wheel file name")
    return m["name"].replace("_", "-").lower(), m["version"]


def make(wheelhouse: Path, version: str, *, dependencies: str, key) -> dict[str, Any]:
    """Write wheelhouse/release.json listing every *.whl there, signed with the fleet key; return it."""
    from agent.transport.signing import sign_doc
    from agent.util.atomic import atomic_write_json

    wheels = []
    for path in sorted(wheelhouse.glob("*.whl")):
        name, wversion = wheel_name(path.name)
        wheels.append(
            {
                "file": path.name,
                "name": name,
                "version": wversion,
                "sha256": sha256_file(path),
                "size": path.stat().st_size,
            }
        )
    if not any(w["name"] == "edge-agent" for w in wheels):
        raise EdgeAgentError(f"{wheelhouse} holds no edge-agent wheel")
    doc = {"kind": KIND, "format": FORMAT, "version": version, "dependencies": dependencies, "created": time.time()}
    signed = sign_doc({**doc, "wheels": wheels}, key)
    atomic_write_json(wheelhouse / MANIFEST_NAME, signed)
    return signed


def verify(wheelhouse: Path, trusted: dict[str, Any]) -> dict[str, Any]:
    """The manifest once its signature and every wheel check out; ReleaseRejected naming the first problem."""
    from agent.transport.signing import verify_doc
    from agent.util.atomic import read_json

    doc = read_json(wheelhouse / MANIFEST_NAME)
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ReleaseRejected("malformed", f"{wheelhouse / MANIFEST_NAME} is not an agent release manifest")
    kid = (doc.get("sig") or {}).get("key_id") if isinstance(doc.get("sig"), dict) else None
    if kid not in trusted:
        raise ReleaseRejected("untrusted" if kid else "unsigned", f"signed by key {kid!r}, trusted: {sorted(trusted)}")
    if verify_doc(doc, trusted[kid]) != "verified":
        raise ReleaseRejected("bad-signature", f"the signature of {MANIFEST_NAME} does not verify with key {kid}")
    if not isinstance(doc.get("format"), int) or doc["format"] > FORMAT:
        raise ReleaseRejected("format", f"release format {doc.get('format')!r}; this agent reads up to {FORMAT}")
    _check_wheels(wheelhouse, doc.get("wheels"))
    return doc


def _check_wheels(wheelhouse: Path, wheels: Any) -> None:
    if not isinstance(wheels, list) or not wheels:
        raise ReleaseRejected("malformed", "the manifest lists no wheels")
    listed = set()
    for w in wheels:
        name = str(w.get("file", "")) if isinstance(w, dict) else ""
        if not name or "/" in name or name.startswith(".") or not name.endswith(".whl"):
            raise ReleaseRejected("malformed", f"wheel entry {w!r} is not a plain wheel file name")
        path = wheelhouse / name
        if not path.is_file():
            raise ReleaseRejected("missing", f"{name} is listed but absent")
        if path.stat().st_size != w.get("size") or sha256_file(path) != w.get("sha256"):
            raise ReleaseRejected("digest", f"{name} does not match its sha256 in the manifest (corrupted or changed)")
        listed.add(name)
    extra = sorted(p.name for p in wheelhouse.glob("*.whl") if p.name not in listed)
    if extra:
        raise ReleaseRejected("unlisted", f"wheels the manifest does not list: {', '.join(extra)}")


def requirements(doc: dict[str, Any]) -> str:
    """pip's requirements with every hash pinned (`pip install --require-hashes`)."""
    lines = [f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}" for w in doc["wheels"]]
    return "\n".join(lines) + "\n"
