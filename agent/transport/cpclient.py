"""HTTP client of the control plane's API (stdlib urllib): the fleet CLI's --control-plane mode and the
device side (the signed enrollment request and signed decision records), which `edge-agent control-plane
enroll|report` and the daemon's agent.services.cpsync share. Nothing here imports the service's packages."""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ConfigError, TransportError

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ENROLL_KIND = "enroll"


class HttpError(ConfigError):
    """The control plane answered with an HTTP error; `code` is its status (403: refused, 409: conflict...)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def call(url: str, method: str, path: str, body: Any = None, token: str | None = None, timeout: float = 30.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    return _send(url, method, path, data, "application/json", token, timeout)


def _send(
    url: str, method: str, path: str, data: bytes | None, content_type: str, token: str | None, timeout: float
) -> Any:
    """One request to the API: the JSON answer, or ConfigError (HTTP error, with the service's reason) or
    TransportError (not reachable)."""
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            why = json.loads(exc.read()).get("error")
        except ValueError:
            why = exc.reason
        raise HttpError(f"control plane {method} {path}: HTTP {exc.code}: {why}", exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        raise TransportError(f"control plane {url}: {exc}") from None


def post_json(url: str, path: str, body: Any, token: str | None = None) -> Any:
    return call(url, "POST", path, body, token)


def enroll_request(
    device_id: str,
    key: Ed25519PrivateKey,
    *,
    hardware: dict[str, Any] | None = None,
    target: str | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    """A signed enrollment request for `device_id` made with the device's own key (checked by
    agent.controlplane.enroll on the service's side)."""
    from agent.artifacts.keys import public_pem
    from agent.transport.signing import sign_doc

    doc: dict[str, Any] = {
        "kind": ENROLL_KIND,
        "device_id": device_id,
        "public_key": public_pem(key.public_key()),
        "nonce": secrets.token_hex(16),
        "ts": time.time(),
        "hardware": hardware or {},
        "target": target,
    }
    if token:
        doc["token"] = token
    return sign_doc(doc, key)


def enroll(url: str, device_id: str, key: Ed25519PrivateKey, **kw: Any) -> dict[str, Any]:
    """Ask the control plane at `url` to enroll this device: {"device_id", "state"} (pending or accepted)."""
    answer: dict[str, Any] = post_json(url, "/api/v1/enroll", enroll_request(device_id, key, **kw))
    return answer


def signed_decision(
    device_id: str,
    key: Ed25519PrivateKey,
    decision_file: Path,
    attestations: Path | None = None,
    seq: int | None = None,
) -> dict[str, Any]:
    """The decision record of one deployment, signed with the device key; with `attestations` (the device's
    state_dir/attestations), the signed in-toto envelopes of that deployment go along in `attestations`. `seq`:
    the device's next document number (agent.transport.docseq.take), signed with `ts` so the service refuses a
    replayed older copy; `artifact_sha256`: the artifact the deployment ran, as the decision file names it (the
    attestations must name the same)."""
    from agent.util.atomic import read_json

    decision = read_json(decision_file) or {}
    model: dict[str, Any] = decision["model"] if isinstance(decision.get("model"), dict) else {}
    doc = {
        "device_id": device_id,
        "deployment_id": decision_file.stem,
        "model": model.get("name"),
        "version": model.get("version"),
        "decision": decision,
    }
    if isinstance(decision.get("artifact_sha256"), str):
        doc["artifact_sha256"] = decision["artifact_sha256"]
    if attestations is not None:
        found = {}
        for f in sorted(attestations.glob(f"{decision_file.stem}.*.intoto.json")):
            envelope = read_json(f)
            if isinstance(envelope, dict):
                found[f.name.removeprefix(decision_file.stem + ".").removesuffix(".intoto.json")] = envelope
        if found:
            doc["attestations"] = found
    return signed_document(device_id, key, doc, seq)


def signed_document(
    device_id: str, key: Ed25519PrivateKey, doc: dict[str, Any], seq: int | None = None
) -> dict[str, Any]:
    """`doc` (a decision record, a conformance report) with `device_id`, `ts` now and `seq` when given, signed
    with the device key (agent.transport.signing)."""
    from agent.transport.signing import sign_doc

    out = {**doc, "device_id": device_id, "ts": time.time()}
    if seq is not None:
        out["seq"] = seq
    return sign_doc(out, key)


def post_decision(url: str, device_id: str, doc: dict[str, Any]) -> Any:
    return post_json(url, f"/api/v1/devices/{device_id}/decisions", doc)


def upload_decisions(url: str, device_id: str, key: Ed25519PrivateKey, state_dir: Path) -> int | None:
    """Post every decision record of state_dir/decisions, each with the next number of the device's sequence."""
    from agent.transport.docseq import take

    files = sorted((state_dir / "decisions").glob("*.json"))
    if not files:
        return None
    for f in files:
        doc = signed_decision(device_id, key, f, state_dir / "attestations", seq=take(state_dir))
        post_decision(url, device_id, doc)
    return len(files)


def put_bytes(url: str, path: str, file: Path, token: str | None = None, timeout: float = 600.0) -> Any:
    return _send(url, "PUT", path, file.read_bytes(), "application/octet-stream", token, timeout)
