"""State files 0600 and directories 0700 under state_dir, whatever the umask they were created under."""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE, FILE_MODE = 0o700, 0o600
SKIP = ("inbox",)  # operators drop packages there with their own permissions


def harden(state_dir: str | os.PathLike[str]) -> list[str]:
    """chmod state_dir and everything beneath it (not following symlinks); returns what could not be changed."""
    root = Path(state_dir)
    failed: list[str] = []
    _fix(root, DIR_MODE, failed)
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in SKIP]
        for d in dirnames:
            _fix(Path(dirpath) / d, DIR_MODE, failed)
        for f in filenames:
            _fix(Path(dirpath) / f, FILE_MODE, failed)
    return failed


def _fix(path: Path, mode: int, failed: list[str]) -> None:
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) == mode:
            return
        os.chmod(path, mode)
    except FileNotFoundError:
        return  # removed meanwhile (a temp file)
    except OSError as exc:
        failed.append(f"{path}: {exc.strerror}")
