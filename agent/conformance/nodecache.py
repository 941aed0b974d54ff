"""The ONNX node cases, generated once per installed onnx and kept on disk.

onnx generates its ~1,900 node cases by running its reference implementation when the case modules are imported:
10-20 s of CPU on a 2-core machine, on every conformance run, before the first case runs. What it generates depends
only on the installed onnx, numpy and ml_dtypes (and Python's minor version), so the first run keeps the result and
later runs read it (well under a second).

The file holds numpy arrays of every dtype onnx tests (strings, bfloat16, float8, int4, sequences), so it is a
pickle. It is only ever read from a directory this user owns and nobody else can write (0700), and only when the
file is this user's and not writable by others; anything else is ignored and the cases are generated again. The
cache is an optimisation: any failure to read or write it costs the generation time, never the run.

Where: $EDGE_AGENT_CACHE_DIR, else $XDG_CACHE_HOME/edge-agent, else ~/.cache/edge-agent.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = 1


def cache_dir() -> Path | None:
    if os.environ.get("EDGE_AGENT_CACHE_DIR"):
        return Path(os.environ["EDGE_AGENT_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "edge-agent"
    home = os.environ.get("HOME")
    return Path(home) / ".cache" / "edge-agent" if home else None


def cache_file() -> Path | None:
    """The cache file for the installed onnx/numpy/ml_dtypes and this Python's minor version (None: no cache
    directory known). Not the micro version nor the machine: the cases are the same data wherever they were
    generated, so an emulated Arm device given the host's file (a shared EDGE_AGENT_CACHE_DIR) runs the very
    inputs the host runs instead of generating them again under emulation."""
    import numpy
    import onnx

    try:
        import ml_dtypes

        mld = ml_dtypes.__version__
    except ImportError:  # pragma: no cover - onnx depends on it today
        mld = "-"
    py = f"{sys.implementation.name}{sys.version_info[0]}.{sys.version_info[1]}"
    key = f"{FORMAT}|{onnx.__version__}|{numpy.__version__}|{mld}|{py}"
    root = cache_dir()
    return (
        root / f"onnx-node-cases-{onnx.__version__}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.pickle"
        if root
        else None
    )


def _private(path: Path, is_dir: bool) -> bool:
    """Owned by this user and not writable by group or others (a directory also not readable by them)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    kind = stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)
    bad = 0o077 if is_dir else 0o022
    return kind and st.st_uid == os.getuid() and not st.st_mode & bad


def load_or_generate(generate: Callable[[], Any]) -> Any:
    """The cached value when a private cache file for these versions exists, else generate() (kept if it can)."""
    path = cache_file()
    if path is not None and _private(path.parent, True) and _private(path, False):
        try:
            with open(path, "rb") as f:
                doc = pickle.load(f)  # noqa: S301 - a private file this user wrote (checked above)
            if isinstance(doc, dict) and doc.get("format") == FORMAT:
                return doc["value"]
        except Exception:  # noqa: BLE001 - a damaged cache is generated again, never an error
            pass
    value = generate()
    if path is not None:
        _keep(path, value)
    return value


def _keep(path: Path, value: Any) -> None:
    from agent.util.atomic import atomic_write_bytes

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(path.parent, True):
            return
        atomic_write_bytes(path, pickle.dumps({"format": FORMAT, "value": value}, protocol=5), mode=0o600)
    except OSError:
        pass
