"""Availability means a session opened: each provider a probe calls available opens a tiny model made in code
on each device it claims and runs it once. Results are cached per runtime version and profile (a JSON file),
so a restart does not pay it again. A capture's profile (`--sysroot`: another device's files, this host's
runtimes) is never "available": its providers are "expected, not opened here", with the reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.providers.base import ProbeResult

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile

EXPECTED = "expected, not opened here"
_FIX = "check the driver and the runtime's device list (edge-agent providers --verify shows the session error)"


def default_cache() -> Path:
    """$EDGE_AGENT_CACHE_DIR, else $XDG_CACHE_HOME/edge-agent, else ~/.cache/edge-agent: opened.json there."""
    root = os.environ.get("EDGE_AGENT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "edge-agent"
    )
    return Path(root) / "opened.json"


def _key(r: ProbeResult, profile: "HardwareProfile") -> str:
    cpu = getattr(profile, "cpu", None)
    fingerprint = {
        "provider": r.name,
        "versions": r.versions,
        "devices": list(r.devices),
        "options": r.options,
        "arch": getattr(profile, "arch", None),
        "cpu": [getattr(cpu, "model", None), sorted(getattr(cpu, "flags", ()) or ())],
        "accelerators": [dataclasses.asdict(a) for a in getattr(profile, "accelerators", ())],
    }
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()


def _load(path: Path | None) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path else {}
    except (OSError, ValueError):
        return {}


def _save(path: Path | None, cache: dict[str, Any]) -> None:
    if path is None:
        return
    try:
        from agent.util.atomic import atomic_write_json

        # 0700, as agent.conformance.nodecache makes it: that cache is read only from a private directory, and
        # whichever writes first creates the shared one (at 0755 here, the node cases were never kept).
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_json(path, cache)
    except OSError:  # a read-only home: no cache, the next start opens again
        pass


def open_each_device(r: ProbeResult, model_path: str) -> dict[str, str | None]:
    """{device: None when a session opened and ran y = x + 1 right, else the error}."""
    import numpy as np

    from agent.errors import EdgeAgentError
    from agent.providers import get

    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    devices: list[str | None] = list(r.devices) if get(r.name).runtime == "openvino" and r.devices else [None]
    found: dict[str, str | None] = {}
    for dev in devices:
        try:
            sess = get(r.name).open_session(model_path, options=dict(r.options), device=dev)
            try:
                y = sess.run({"x": x})["y"]
                ok = np.allclose(np.asarray(y, dtype=np.float32), x + 1.0, atol=1e-2)
                found[dev or sess.device or r.name] = None if ok else "the session ran but returned a wrong answer"
            finally:
                sess.close()
        except EdgeAgentError as exc:
            found[dev or r.name] = str(exc)
    return found


def confirm(results: list[ProbeResult], profile: "HardwareProfile", cache: Path | None = None) -> list[ProbeResult]:
    """Each available result, checked by opening sessions (cached); one that opens on no device is unavailable."""
    import onnx

    from agent.samples import tiny_model

    store = _load(cache)
    out: list[ProbeResult] = []
    with tempfile.TemporaryDirectory(prefix="edge-agent-open-") as tmp:
        path = os.path.join(tmp, "tiny.onnx")
        onnx.save(tiny_model(bias=1.0), path)
        for r in results:
            if not r.available:
                out.append(r)
                continue
            key = _key(r, profile)
            if key not in store:
                store[key] = open_each_device(r, path)
            out.append(_judge(r, store[key]))
    _save(cache, store)
    return out


def _judge(r: ProbeResult, opened: dict[str, str | None]) -> ProbeResult:
    good = [d for d, err in opened.items() if err is None]
    bad = {d: err for d, err in opened.items() if err is not None}
    if not good:
        why = "; ".join(f"{d}: {e}" for d, e in bad.items())
        return dataclasses.replace(
            r, available=False, reason=f"unavailable: no session opened ({why})", remedy=r.remedy or _FIX, opened=False
        )
    devices = tuple(d for d in r.devices if d in good) or r.devices
    reason = f"{r.reason}; session opened on {', '.join(good)}"
    if bad:
        reason += "; not on " + "; ".join(f"{d} ({e})" for d, e in bad.items())
    return dataclasses.replace(r, devices=devices, reason=reason, opened=True)


def expected(results: list[ProbeResult], where: str) -> list[ProbeResult]:
    """A capture's profile: what its device would offer, never "available" (nothing was opened on it)."""
    out = []
    for r in results:
        if not r.available:
            out.append(r)
            continue
        out.append(
            dataclasses.replace(
                r,
                available=False,
                expected=True,
                reason=f"{EXPECTED}: {r.reason} (the hardware is {where}'s; no session can open on it from this host)",
                remedy=r.remedy or "run edge-agent providers on the device itself",
            )
        )
    return out
