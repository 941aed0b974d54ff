"""Compiled-cache directories keyed by model hash, provider and runtime/driver versions.

Qualification builds the caches (OpenVINO CACHE_DIR, TensorRT engine/timing caches, EPContext) and the
serving side reuses the same directory. A runtime or driver upgrade changes the key, so a stale compiled
blob is never loaded (ORT does not invalidate TensorRT engines on upgrades by itself).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def runtime_key(provider: str, versions: dict[str, Any] | None) -> str:
    """`<provider>-<12 hex>`: a stable digest of every version that can change compiled output."""
    blob = json.dumps({k: str(v) for k, v in sorted((versions or {}).items())}, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    return f"{_SAFE.sub('_', provider)}-{digest}"


def cache_dir_for(root: str | Path, model_sha256: str, provider: str, versions: dict[str, Any] | None) -> Path:
    """root/<model-sha>/<provider>-<versions digest>/ (created). The same path for qualify and serving."""
    if not re.fullmatch(r"[0-9a-f]{16,64}", model_sha256 or ""):
        raise ValueError(f"model_sha256 must be lower-case hex, got {model_sha256!r}")
    path = Path(root) / model_sha256 / runtime_key(provider, versions)
    path.mkdir(parents=True, exist_ok=True)
    return path


def runtime_versions(profile: Any = None, probe_versions: dict[str, Any] | None = None) -> dict[str, str]:
    """Versions that key caches and decisions: onnxruntime, openvino, the probe's versions, L4T/JetPack."""
    versions: dict[str, str] = {}
    for key, dists in _DISTS.items():
        v = _dist_version(dists)
        if v:
            versions[key] = v
    for k, v in (probe_versions or {}).items():
        versions[str(k)] = str(v)
    software = getattr(profile, "software", None) or {}
    for k in _SOFTWARE_KEYS:
        if software.get(k):
            versions[k] = str(software[k])
    return versions


_SOFTWARE_KEYS = ("l4t", "jetpack", "tensorrt", "cuda", "qairt", "driver")


def version_drift(stored: dict[str, Any] | None, current: dict[str, Any]) -> dict[str, list[str | None]]:
    """{key: [then, now]} for every runtime, provider or driver version recorded with a decision that differs
    now (a runtime that is gone reads None). Only the keys runtime_versions() itself owns are compared."""
    owned = set(_DISTS) | set(_SOFTWARE_KEYS)
    return {
        k: [str(v), None if current.get(k) is None else str(current[k])]
        for k, v in sorted((stored or {}).items())
        if k in owned and str(v) != str(current.get(k))
    }


def drift_text(drift: dict[str, list[str | None]]) -> str:
    """'onnxruntime 1.31.0 -> 1.32.0, openvino (none) -> 2026.4.1'."""
    return ", ".join(f"{k} {a or '(none)'} -> {b or '(none)'}" for k, (a, b) in drift.items())


_DISTS: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml"),
    "onnxruntime-ep-openvino": ("onnxruntime-ep-openvino",),
    "onnxruntime-qnn": ("onnxruntime-qnn",),
    "openvino": ("openvino",),
    "onnx": ("onnx",),
}


def _dist_version(dists: tuple[str, ...]) -> str | None:
    from importlib import metadata

    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


MAX_REFERENCE_BYTES = 1 << 30  # a cached reference bigger than this is recomputed, not loaded


def _reference_path(root: str | Path, model_sha256: str, feeds: dict[str, Any]) -> Path:
    """root/<model-sha>/reference-<digest of the feeds and the ORT version>.npz"""
    import numpy as np

    h = hashlib.sha256()
    for name in sorted(feeds):
        arr = np.ascontiguousarray(feeds[name])
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    h.update(str(_dist_version(_DISTS["onnxruntime"])).encode())
    if not re.fullmatch(r"[0-9a-f]{16,64}", model_sha256 or ""):
        raise ValueError(f"model_sha256 must be lower-case hex, got {model_sha256!r}")
    return Path(root) / model_sha256 / f"reference-{h.hexdigest()[:24]}.npz"


def load_reference(root: str | Path, model_sha256: str, feeds: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """Reference outputs saved by save_reference for the same model, feeds and ORT version, else None."""
    import numpy as np

    path = _reference_path(root, model_sha256, feeds)
    try:
        if path.stat().st_size > MAX_REFERENCE_BYTES:
            return None
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["__meta__"]).decode())
            return {n: z[f"o{i}"] for i, n in enumerate(meta["names"])}, str(meta["source"])
    except (OSError, ValueError, KeyError):
        return None


def save_reference(
    root: str | Path, model_sha256: str, feeds: dict[str, Any], outputs: dict[str, Any], source: str
) -> None:
    """Keep reference outputs for reuse (plain numpy dtypes only; anything else is simply not cached)."""
    import io

    import numpy as np

    from agent.util.atomic import atomic_write_bytes

    arrays = {f"o{i}": np.asarray(v) for i, v in enumerate(outputs.values())}
    if any(a.dtype.kind not in "biufc?" or a.dtype.names for a in arrays.values()):
        return
    if sum(a.nbytes for a in arrays.values()) > MAX_REFERENCE_BYTES:
        return
    meta = json.dumps({"names": list(outputs), "source": source}).encode()
    buf = io.BytesIO()
    payload: dict[str, Any] = {"__meta__": np.frombuffer(meta, dtype=np.uint8), **arrays}
    np.savez(buf, **payload)
    try:
        atomic_write_bytes(_reference_path(root, model_sha256, feeds), buf.getvalue())
    except OSError:
        pass
