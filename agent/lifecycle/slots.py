"""A/B model slots: per model name a committed and a previous entry, pointing at content-addressed blobs."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle.journal import check_name
from agent.util.atomic import atomic_write_json, read_json


class ModelSlots:
    """state_dir/models/<name>/slots.json = {"committed": entry|null, "previous": entry|null}.

    An entry: version, sha256 (artifact blob), model_sha256, provider, precision, options,
    deployment_id, latency_ms (qualified), ts. Writes are atomic; one lock serialises them.
    """

    def __init__(self, state_dir: str | os.PathLike[str]):
        self.state_dir = Path(state_dir)
        self.root = self.state_dir / "models"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()

    def _file(self, name: str) -> Path:
        return self.root / check_name(name, "model name") / "slots.json"

    def get(self, name: str) -> dict[str, Any]:
        """The two entries; LifecycleError naming the file when it is unreadable (truncated, not JSON)."""
        path = self._file(name)
        try:
            data = read_json(path, default=None) or {}
        except (ValueError, OSError) as exc:
            raise LifecycleError(f"{path}: corrupt slots file: {exc}") from None
        if not isinstance(data, dict) or not all(
            isinstance(data.get(k), (dict, type(None))) for k in ("committed", "previous")
        ):
            raise LifecycleError(f"{path}: corrupt slots file: not a {{committed, previous}} object")
        return {"committed": data.get("committed"), "previous": data.get("previous")}

    def write(self, name: str, slots: dict[str, Any]) -> None:
        """Replace both entries (a rebuild from the journal)."""
        with self._lock:
            atomic_write_json(
                self._file(name), {"committed": slots.get("committed"), "previous": slots.get("previous")}, mode=0o600
            )

    def committed(self, name: str) -> dict[str, Any] | None:
        committed: dict[str, Any] | None = self.get(name)["committed"]
        return committed

    def names(self) -> list[str]:
        return sorted(p.parent.name for p in self.root.glob("*/slots.json"))

    def all(self) -> dict[str, dict[str, Any]]:
        return {n: self.get(n) for n in self.names()}

    def commit(self, name: str, entry: dict[str, Any]) -> dict[str, Any]:
        """The new entry becomes committed; the old committed becomes previous (unless it is the same blob)."""
        _check_entry(entry)
        with self._lock:
            cur = self.get(name)
            old = cur["committed"]
            prev = old if old and old.get("sha256") != entry["sha256"] else cur["previous"]
            new = {"committed": {**entry, "ts": time.time()}, "previous": prev}
            atomic_write_json(self._file(name), new, mode=0o600)
            return new

    def swap(self, name: str) -> dict[str, Any]:
        """Rollback: previous <-> committed. LifecycleError when there is no previous slot."""
        with self._lock:
            cur = self.get(name)
            if not cur["previous"]:
                raise LifecycleError(f"model {name!r} has no previous version to roll back to")
            new = {"committed": cur["previous"], "previous": cur["committed"]}
            atomic_write_json(self._file(name), new, mode=0o600)
            return new

    def referenced(self) -> set[str]:
        """Every sha256 (artifact and model) a slot points at."""
        keep: set[str] = set()
        for slots in self.all().values():
            for entry in slots.values():
                if entry:
                    keep.update(v for v in (entry.get("sha256"), entry.get("model_sha256")) if v)
        return keep


def _check_entry(entry: dict[str, Any]) -> None:
    missing = [k for k in ("version", "sha256", "provider") if not entry.get(k)]
    if missing:
        raise LifecycleError(f"slot entry lacks {', '.join(missing)}")


def gc(state_dir: str | os.PathLike[str], store: Any, keep: set[str]) -> dict[str, int]:
    """Delete blobs, unpacked packages and compiled caches that no slot or in-flight deployment needs."""
    state_dir = Path(state_dir)
    removed_blobs = store.gc(keep)
    removed_dirs = 0
    for sub in ("packages", "cache"):
        base = state_dir / sub
        if not base.is_dir():
            continue
        for d in base.iterdir():
            if d.name.startswith("."):  # dot names: unpacking in progress
                continue
            if d.name.endswith(".files.json"):  # the verified-files record beside packages/<sha>/
                if d.name[: -len(".files.json")] not in keep:
                    d.unlink(missing_ok=True)
                continue
            if d.name not in keep:
                shutil.rmtree(d, ignore_errors=True)
                removed_dirs += 1
    return {
        "blobs": removed_blobs if isinstance(removed_blobs, int) else len(removed_blobs or []),
        "dirs": removed_dirs,
    }
