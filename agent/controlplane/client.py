"""HTTP client of the control plane's API (stdlib urllib): the fleet CLI's --control-plane mode and the
device side (enrollment request, signed decision records)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agent.errors import ConfigError, TransportError


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
        raise ConfigError(f"control plane {method} {path}: HTTP {exc.code}: {why}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise TransportError(f"control plane {url}: {exc}") from None


def post_json(url: str, path: str, body: Any, token: str | None = None) -> Any:
    return call(url, "POST", path, body, token)


def signed_decision(device_id: str, key, decision_file: Path) -> dict[str, Any]:
    from agent.transport.signing import sign_doc
    from agent.util.atomic import read_json

    decision = read_json(decision_file) or {}
    model: dict[str, Any] = decision["model"] if isinstance(decision.get("model"), dict) else {}
    doc = {
        "device_id": device_id,
        "deployment_id": decision_file.stem,
        "model": model.get("name"),
        "version": model.get("version"),
        "decision": decision,
        "ts": time.time(),
    }
    return sign_doc(doc, key)


def upload_decisions(url: str, device_id: str, key, state_dir: Path) -> int | None:
    files = sorted((state_dir / "decisions").glob("*.json"))
    if not files:
        return None
    for f in files:
        post_json(url, f"/api/v1/devices/{device_id}/decisions", signed_decision(device_id, key, f))
    return len(files)


def upload_attestations(url: str, device_id: str, state_dir: Path) -> int | None:
    """Post every attestation the device kept (state_dir/attestations/*.intoto.json, already signed) as is."""
    files = sorted((state_dir / "attestations").glob("*.intoto.json"))
    if not files:
        return None
    for f in files:
        _send(url, "POST", f"/api/v1/devices/{device_id}/attestations", f.read_bytes(), "application/json", None, 30)
    return len(files)


def put_bytes(url: str, path: str, file: Path, token: str | None = None, timeout: float = 600.0) -> Any:
    return _send(url, "PUT", path, file.read_bytes(), "application/octet-stream", token, timeout)
