"""Consistency check of a state_dir: legal journal histories, slots pointing at verified blobs."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.errors import LifecycleError
from agent.lifecycle import integrity
from agent.lifecycle.journal import Journal, check_history
from agent.lifecycle.slots import ModelSlots, SlotEntry


def check_state_dir(state_dir: str | os.PathLike[str], *, rehash: bool = True) -> list[str]:
    """Every problem found (empty list = consistent). Reads only; safe while the daemon runs."""
    state_dir = Path(state_dir)
    problems: list[str] = []
    journal = Journal(state_dir)
    for p in sorted(journal.root.glob("*.json")):
        try:
            json.loads(p.read_bytes())
        except ValueError as exc:
            problems.append(f"{p.name}: unreadable journal record: {exc}")
    for dep in journal.all():
        problems += check_history(dep)
    ms = ModelSlots(state_dir)
    for name in ms.names():
        try:
            slots = ms.get(name)
        except LifecycleError as exc:
            problems.append(str(exc))  # names the file
            continue
        for which in ("committed", "previous"):
            entry = slots[which]
            if entry:
                problems += _check_entry(state_dir, name, which, entry, rehash)
    return problems


def _check_entry(state_dir: Path, name: str, which: str, entry: SlotEntry, rehash: bool) -> list[str]:
    from agent.util.hashing import sha256_file

    sha = entry.sha256
    blob = state_dir / "blobs" / "sha256" / sha
    where = f"{name} {which} (version {entry.version})"
    if not blob.is_file():
        return [f"{where}: blob {sha[:12]} is missing"]
    if rehash and sha256_file(blob) != sha:
        return [f"{where}: blob {sha[:12]} does not match its sha256"]
    model = entry.model_path
    if model and not Path(model).is_file():
        return [f"{where}: unpacked model {model} is missing (it is rebuilt from the blob on activation)"]
    pkg = entry.package_dir or (str(Path(model).parent) if model else None)
    if pkg and rehash:
        return [f"{where}: {p}" for p in integrity.check(pkg, entry.model_sha256, model, restamp=False)]
    return []
