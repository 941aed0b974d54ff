"""Compiled caches sealed when written and verified before use.

`seal(dir)` records every file of a compiled-cache directory (OpenVINO blobs, TensorRT engines, EPContext,
optimised graphs) with its size and sha256 in `dir/.seal.json`. `verify_or_reset(dir)` runs before a session
may load the directory: a file that differs from its record (corrupt, truncated), one that is missing, one
that was not there when sealed, or a directory with files but no seal (foreign: written by someone else or
by a build that died before sealing) empties the directory, so the runtime compiles afresh and the damaged
file is never loaded. The caller seals again once its session is built.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

SEAL = ".seal.json"
FORMAT = 1


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != SEAL and not p.name.startswith(f".{SEAL}."))


def seal(directory: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """Record the directory's files (size, sha256); None when there is no directory."""
    from agent.util.atomic import atomic_write_bytes
    from agent.util.hashing import sha256_file

    if directory is None or not Path(directory).is_dir():
        return None
    root = Path(directory)
    files = {p.relative_to(root).as_posix(): [p.stat().st_size, sha256_file(p)] for p in _files(root)}
    doc = {"format": FORMAT, "files": files}
    try:
        atomic_write_bytes(root / SEAL, json.dumps(doc, sort_keys=True).encode(), mode=0o600)
    except OSError:
        return None  # unsealed: the next use rebuilds it rather than trusting it
    return doc


def problems(directory: str | os.PathLike[str]) -> list[str]:
    """Why the directory must not be loaded (empty: it holds exactly what was sealed, or nothing at all)."""
    from agent.util.hashing import sha256_file

    root = Path(directory)
    present = {p.relative_to(root).as_posix(): p for p in _files(root)} if root.is_dir() else {}
    try:
        doc = json.loads((root / SEAL).read_text())
        files = doc["files"] if doc.get("format") == FORMAT else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        files = None
    if files is None:
        return [f"{root}: {len(present)} file(s) without a valid seal (foreign or unfinished)"] if present else []
    out = []
    for rel, rec in files.items():
        p = present.pop(rel, None)
        if p is None:
            out.append(f"{root / rel}: missing")
        elif p.stat().st_size != rec[0] or sha256_file(p) != rec[1]:
            out.append(f"{p}: content differs from its sealed sha256 {str(rec[1])[:12]} (corrupt)")
    out += [f"{p}: not in the seal (foreign)" for p in present.values()]
    return out


def verify_or_reset(directory: str | os.PathLike[str] | None) -> str | None:
    """Empty a directory that fails verification; a note saying what was wrong, else None."""
    if directory is None or not Path(directory).is_dir():
        return None
    found = problems(directory)
    if not found:
        return None
    root = Path(directory)
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    return f"compiled cache rebuilt, not loaded: {'; '.join(found[:3])}" + (
        f" (+{len(found) - 3} more)" if len(found) > 3 else ""
    )
