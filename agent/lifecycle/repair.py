"""Start-up repair: serve only verified files (re-unpack from an intact blob), rebuild slots.json from the journal.

Each function returns a note (what was wrong and what was done, naming the file) or raises Corrupt when the
entry cannot be served as verified; the caller falls back to the previous slot with that reason.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle import integrity
from agent.lifecycle.journal import Deployment, Journal
from agent.lifecycle.slots import ModelSlots, SlotEntry
from agent.lifecycle.states import State
from agent.package.unpack import unpack
from agent.util.hashing import sha256_file


class Corrupt(LifecycleError):
    """A slot entry's files are damaged and cannot be rebuilt from an intact blob."""


def package_dir(entry: SlotEntry, packages: Path) -> Path:
    if entry.package_dir:
        return Path(entry.package_dir)
    if entry.model_path:
        return Path(entry.model_path).parent
    return packages / entry.sha256


def verify_unpacked(store: Any, packages: Path, entry: SlotEntry) -> str | None:
    """Check the entry's unpacked files; re-unpack them from the blob when they differ and the blob is intact."""
    sha, version = entry.sha256, entry.version
    pkg = package_dir(entry, packages)
    problems = integrity.check(pkg, entry.model_sha256, entry.model_path)
    blob = Path(store.path(sha))
    if not problems:
        if not blob.is_file():
            return f"version {version}: blob {blob} is missing; the verified unpacked copy serves (push again to restore it)"
        return None
    why = "; ".join(problems)
    if not blob.is_file():
        raise Corrupt(f"version {version}: {why}; blob {blob} is missing: cannot re-unpack")
    if sha256_file(blob) != sha:
        raise Corrupt(f"version {version}: {why}; blob {blob} does not match its sha256: cannot re-unpack")
    shutil.rmtree(pkg, ignore_errors=True)
    integrity.record_path(pkg).unlink(missing_ok=True)
    unpack(store, sha, pkg.parent)
    again = integrity.check(pkg, entry.model_sha256, entry.model_path)
    if again:
        raise Corrupt(f"version {version}: {why}; re-unpacked from the blob but: {'; '.join(again)}")
    return f"version {version}: {why}; re-unpacked from the intact blob {sha[:12]}"


def rebuild_slots(
    slots: ModelSlots, journal: Journal, name: str, entry_of: Callable[[Deployment], SlotEntry], why: str
) -> str:
    """slots.json of `name` is unreadable: move it aside and replay the journal's commits (and rollbacks)."""
    path = slots.root / name / "slots.json"
    aside = path.with_name(f"slots.json.corrupt-{int(time.time())}")
    try:
        path.replace(aside)
    except OSError:
        pass
    committed: SlotEntry | None = None
    previous: SlotEntry | None = None
    entries: dict[str, SlotEntry] = {}
    done = [d for d in journal.all() if d.model == name and d.state is State.COMMITTED]
    for dep in sorted(done, key=lambda d: d.write_order):
        if dep.source.get("kind") == "rollback":
            target = entries.get(dep.data.get("sha256") or "")
            if target is not None:
                committed, previous = target, committed
            continue
        entry = entry_of(dep).with_(ts=dep.updated)
        entries[entry.sha256] = entry
        if committed and committed.sha256 != entry.sha256:
            previous = committed
        committed = entry
    if committed is None:
        return f"{path}: {why}; moved to {aside.name}; the journal holds no committed deployment of {name}"
    slots.write(name, {"committed": committed, "previous": previous})
    prev = f", previous {previous.version}" if previous else ""
    return f"{path}: {why}; moved to {aside.name} and rebuilt from the journal (committed {committed.version}{prev})"
