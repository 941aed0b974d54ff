"""The release root's links and marks: `current`/`previous` replaced atomically (a temporary symlink renamed over
the old one), tries and bad marks, JSON files written by rename. Standard library only."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CURRENT, PREVIOUS = "current", "previous"


def target(root: Path, name: str) -> str | None:
    """The release version a link names (releases/<version>), or None when the link is absent or foreign."""
    try:
        dest = os.readlink(root / name)
    except OSError:
        return None
    parts = Path(dest).parts
    return parts[-1] if len(parts) == 2 and parts[0] == "releases" else None


def set_link(root: Path, name: str, version: str | None) -> None:
    """Point root/<name> at releases/<version> by renaming a fresh symlink over it (never a moment without one);
    None removes it. The directory is fsynced so that the rename survives a power cut."""
    path = root / name
    if version is None:
        path.unlink(missing_ok=True)
    else:
        tmp = root / f".{name}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        os.symlink(os.path.join("releases", version), tmp)
        os.replace(tmp, path)
    fsync_dir(root)


def flip(root: Path, new: str) -> str | None:
    """previous := current, then current := new; returns the old current. A power cut between the two renames
    leaves previous == current (both the running release): still a working agent."""
    old = target(root, CURRENT)
    if old is not None and old != new:
        set_link(root, PREVIOUS, old)
    set_link(root, CURRENT, new)
    return old


def flip_back(root: Path, failed: str, good: str) -> None:
    """current := good again; previous names the failed release until the next install prunes it."""
    set_link(root, CURRENT, good)
    set_link(root, PREVIOUS, failed)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def tries(root: Path, version: str) -> int:
    doc = read_json(root / "guard" / "tries" / f"{version}.json") or {}
    return int(doc.get("failed", 0))


def add_try(root: Path, version: str, reason: str) -> int:
    path = root / "guard" / "tries" / f"{version}.json"
    doc = read_json(path) or {"failed": 0, "reasons": []}
    doc["failed"] = int(doc.get("failed", 0)) + 1
    doc["reasons"] = [*doc.get("reasons", []), reason][-5:]
    write_json(path, doc)
    return int(doc["failed"])


def is_bad(root: Path, version: str) -> bool:
    return (root / "guard" / "bad" / f"{version}.json").exists()


def mark_bad(root: Path, version: str, reason: str) -> None:
    write_json(root / "guard" / "bad" / f"{version}.json", {"version": version, "reason": reason})


def tries_clear(root: Path, version: str) -> None:
    (root / "guard" / "tries" / f"{version}.json").unlink(missing_ok=True)
