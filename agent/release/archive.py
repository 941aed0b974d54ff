"""A release as one file: the wheelhouse `release build` writes (release.json and the wheels) as a tar.gz, the
artifact the control plane stores and devices pull (`kind: agent`). Unpacked flat, regular files only."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from agent.errors import EdgeAgentError

MAX_MEMBERS, MAX_BYTES = 4096, 2 << 30


def pack(wheelhouse: Path, dest: Path) -> Path:
    """wheelhouse/* (files only, sorted) into dest (a .tar.gz)."""
    with tarfile.open(dest, "w:gz") as tar:
        for path in sorted(p for p in wheelhouse.iterdir() if p.is_file()):
            tar.add(path, arcname=path.name)
    return dest


def unpack(archive: Path, dest: Path) -> Path:
    """The archive's files (at its top or in one directory) as a flat wheelhouse in dest: regular files only,
    no links, no path outside, at most 4096 of them and 2 GiB. EdgeAgentError naming the first bad member."""
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as exc:
        raise EdgeAgentError(f"release archive: not a tar.gz ({exc})") from None
    with tar:
        members = tar.getmembers()
        if len(members) > MAX_MEMBERS:
            raise EdgeAgentError(f"release archive: {len(members)} members, more than {MAX_MEMBERS}")
        for m in members:
            if m.isdir():
                continue
            parts = Path(m.name).parts
            if not m.isfile() or ".." in parts or Path(m.name).is_absolute() or parts[-1].startswith("."):
                raise EdgeAgentError(f"release archive: {m.name[:200]!r} is not a plain file of a wheelhouse")
            total += m.size
            if total > MAX_BYTES:
                raise EdgeAgentError("release archive: more than 2 GiB unpacked")
            src = tar.extractfile(m)
            assert src is not None
            with src, open(dest / parts[-1], "wb") as out:
                shutil.copyfileobj(src, out)
    return dest
