"""A/B model slots: per model name a committed and a previous entry, pointing at content-addressed blobs."""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle.journal import check_name
from agent.util.atomic import atomic_write_json, read_json


@dataclass(frozen=True, kw_only=True)
class SlotEntry:
    """One version a slot holds: what serves it (provider, precision, options, device, compiled cache), where its
    files are, and what qualification measured. Stored in slots.json under the keys it has always had
    (`to_data`/`from_data`): state directories written before this class load unchanged, and a key this
    version does not know is kept as it was (`extra`)."""

    version: str
    sha256: str
    model_sha256: str | None = None
    provider: str
    precision: str | None = None
    requested_precision: str | None = None
    options: dict[str, Any] | None = None
    device: str | None = None
    cache_dir: str | None = None
    versions: dict[str, Any] | None = None
    package_dir: str | None = None
    model_path: str | None = None
    latency_ms: float | None = None
    deployment_id: str | None = None
    variant: Any = None
    input_specs: list[dict[str, Any]] | None = None
    contended: Any = None
    requalified: Any = None
    memory_peak_bytes: int | None = None
    session_s: float | None = None
    optimization: Any = None
    latency_points: list[dict[str, Any]] | None = None  # qualification's shape points (agent.qualify.points)
    ts: float | None = None  # when it was committed (absent from an entry not committed yet)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_data(self) -> dict[str, Any]:
        """The slots.json object: every entry key (null when unset), `ts` once committed, unknown keys kept."""
        out: dict[str, Any] = {k: getattr(self, k) for k in ENTRY_KEYS}
        out.update({k: getattr(self, k) for k in ADDED_KEYS if getattr(self, k) is not None})
        if self.ts is not None:
            out["ts"] = self.ts
        return {**out, **self.extra}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> SlotEntry:
        """An entry as slots.json (or a deployment's journaled data) holds it; LifecycleError when it lacks
        version, sha256 or provider."""
        missing = [k for k in ("version", "sha256", "provider") if not data.get(k)]
        if missing:
            raise LifecycleError(f"slot entry lacks {', '.join(missing)}")
        known: dict[str, Any] = {k: data.get(k) for k in (*ENTRY_KEYS, *ADDED_KEYS, "ts") if k in data}
        known["version"] = str(known["version"])
        return cls(**known, extra={k: v for k, v in data.items() if k not in _FIELDS})

    def with_(self, **changes: Any) -> SlotEntry:
        return replace(self, **changes)


# keys added after slots.json's format was set: written only when set, so an entry written before them (and read
# by a release that does not know them) round-trips unchanged
ADDED_KEYS = ("latency_points",)
ENTRY_KEYS = tuple(f.name for f in fields(SlotEntry) if f.name not in ("ts", "extra", *ADDED_KEYS))
_FIELDS = {f.name for f in fields(SlotEntry)}
Slots = dict[str, SlotEntry | None]  # {"committed": ..., "previous": ...}


class ModelSlots:
    """state_dir/models/<name>/slots.json = {"committed": entry|null, "previous": entry|null}.

    An entry is a SlotEntry (stored under its JSON keys). Writes are atomic; one lock serialises them.
    """

    def __init__(self, state_dir: str | os.PathLike[str]):
        self.state_dir = Path(state_dir)
        self.root = self.state_dir / "models"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()

    def _file(self, name: str) -> Path:
        return self.root / check_name(name, "model name") / "slots.json"

    def get(self, name: str) -> Slots:
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
        try:
            return {k: SlotEntry.from_data(data[k]) if data.get(k) else None for k in ("committed", "previous")}
        except (LifecycleError, TypeError) as exc:
            raise LifecycleError(f"{path}: corrupt slots file: {exc}") from None

    def write(self, name: str, slots: Slots) -> None:
        """Replace both entries (a rebuild from the journal)."""
        with self._lock:
            self._save(name, slots)

    def _save(self, name: str, slots: Slots) -> None:
        doc = {k: (e.to_data() if e is not None else None) for k in ("committed", "previous") for e in [slots.get(k)]}
        atomic_write_json(self._file(name), doc, mode=0o600)

    def committed(self, name: str) -> SlotEntry | None:
        return self.get(name)["committed"]

    def names(self) -> list[str]:
        return sorted(p.parent.name for p in self.root.glob("*/slots.json"))

    def all(self) -> dict[str, Slots]:
        return {n: self.get(n) for n in self.names()}

    def commit(self, name: str, entry: SlotEntry) -> Slots:
        """The new entry becomes committed; the old committed becomes previous (unless it is the same blob)."""
        with self._lock:
            cur = self.get(name)
            old = cur["committed"]
            prev = old if old and old.sha256 != entry.sha256 else cur["previous"]
            new: Slots = {"committed": entry.with_(ts=time.time()), "previous": prev}
            self._save(name, new)
            return new

    def swap(self, name: str) -> Slots:
        """Rollback: previous <-> committed. LifecycleError when there is no previous slot."""
        with self._lock:
            cur = self.get(name)
            if not cur["previous"]:
                raise LifecycleError(f"model {name!r} has no previous version to roll back to")
            new: Slots = {"committed": cur["previous"], "previous": cur["committed"]}
            self._save(name, new)
            return new

    def referenced(self) -> set[str]:
        """Every sha256 (artifact and model) a slot points at."""
        keep: set[str] = set()
        for slots in self.all().values():
            for entry in slots.values():
                if entry:
                    keep.update(v for v in (entry.sha256, entry.model_sha256) if v)
        return keep


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
