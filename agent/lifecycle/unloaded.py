"""Models an operator unloaded (repository extension): state_dir/models/<name>/unloaded.json names the committed
artifact that was stopped. Written before the model stops serving; start-up does not serve that artifact again.
A later commit (a new deployment or a rollback) carries another artifact and serves as usual."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent.lifecycle.journal import check_name
from agent.lifecycle.slots import SlotEntry
from agent.util.atomic import atomic_write_json, fsync_dir, read_json


def _file(state_dir: str | os.PathLike[str], name: str) -> Path:
    return Path(state_dir) / "models" / check_name(name, "model name") / "unloaded.json"


def mark(state_dir: str | os.PathLike[str], name: str, sha256: str | None) -> None:
    atomic_write_json(_file(state_dir, name), {"sha256": sha256, "ts": time.time()}, mode=0o600)


def clear(state_dir: str | os.PathLike[str], name: str) -> None:
    path = _file(state_dir, name)
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def held(state_dir: str | os.PathLike[str], name: str, committed: SlotEntry | None) -> bool:
    """Was the committed artifact of `name` unloaded (so it must not be served at start-up)?"""
    try:
        doc = read_json(_file(state_dir, name), default=None)
    except (ValueError, OSError):
        return False  # an unreadable mark never keeps a model from serving
    return isinstance(doc, dict) and committed is not None and doc.get("sha256") == committed.sha256
