"""Safe, never-raising reads of files under a root directory, with notes for what was not understood."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

MAX_READ = 1 << 20  # no file the profile needs is larger; caps garbage and /dev surprises


class Sysroot:
    """Reads files below `root` only; every failure becomes None plus (for garbled data) a note."""

    def __init__(self, root: str | os.PathLike[str] = "/"):
        self.root = Path(root)
        self._real_root = os.path.realpath(self.root)
        self.is_host = self._real_root == os.path.realpath("/")
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def _inside(self, p: Path) -> bool:
        if self.is_host:
            return True
        real = os.path.realpath(p)
        return real == self._real_root or real.startswith(self._real_root.rstrip(os.sep) + os.sep)

    def exists(self, rel: str) -> bool:
        p = self.path(rel)
        try:
            return self._inside(p) and (p.exists() or p.is_symlink())
        except OSError:
            return False

    def not_understood(self, rel: str, what: str) -> None:
        """The one note for a file whose content is not what `what` says it should be (it is then ignored)."""
        self.note(f"/{rel.lstrip('/')}: not understood ({what}); ignored")

    def read_value(self, rel: str, parse: Callable[[str], T], what: str) -> T | None:
        """parse(text of ROOT/rel); None when the file is absent, or (with a note) when it is not text or
        `parse` raises ValueError: the one home of "read a value, note what was not understood"."""
        text = self.read_text(rel, what=what)
        if text is None:
            return None
        try:
            return parse(text)
        except ValueError:
            self.not_understood(rel, what)
            return None

    def read_bytes(self, rel: str) -> bytes | None:
        """Raw bytes of ROOT/rel, or None if missing/unreadable (a note says why when it is not simply absent)."""
        p = self.path(rel)
        try:
            if not self._inside(p):
                self.note(f"/{rel.lstrip('/')}: link points outside the sysroot; ignored")
                return None
            if not stat.S_ISREG(os.stat(p).st_mode):
                if not p.is_dir():
                    self.note(f"/{rel.lstrip('/')}: not a regular file; ignored")
                return None
            with open(p, "rb") as fh:
                return fh.read(MAX_READ)
        except FileNotFoundError:
            return None
        except (IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            self.note(f"/{rel.lstrip('/')}: unreadable ({exc.strerror or exc})")
            return None

    def read_text(self, rel: str, *, what: str | None = None) -> str | None:
        """Text of ROOT/rel with trailing NULs/whitespace stripped; None (and a note) if it is not clean text."""
        data = self.read_bytes(rel)
        if data is None:
            return None
        text = decode_clean(data)
        if text is None:
            self.not_understood(rel, what or "not text")
        return text

    def read_strings(self, rel: str) -> list[str] | None:
        """A device-tree string list (NUL-separated); None if absent or garbled."""
        data = self.read_bytes(rel)
        if data is None:
            return None
        parts = [decode_clean(p) for p in data.split(b"\0") if p]
        if not parts or any(p is None or not p for p in parts):
            self.not_understood(rel, "expected NUL-separated strings")
            return None
        return parts  # type: ignore[return-value]

    def glob(self, pattern: str) -> list[str]:
        """Relative paths under root matching `pattern`, sorted; [] on any error."""
        try:
            base = self.root
            hits = sorted(str(p.relative_to(base)) for p in base.glob(pattern.lstrip("/")))
        except (OSError, ValueError):
            return []
        return [h for h in hits if self._inside(self.path(h))]

    def listdir(self, rel: str) -> list[str]:
        try:
            p = self.path(rel)
            return sorted(os.listdir(p)) if self._inside(p) else []
        except OSError:
            return []


def decode_clean(data: bytes) -> str | None:
    """UTF-8 text without control characters (tabs/newlines allowed, trailing NULs removed), else None."""
    data = data.rstrip(b"\0")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any((ord(c) < 32 and c not in "\n\t\r") or ord(c) == 127 for c in text):
        return None
    return text.strip()


def unpack_capture(archive: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Unpack a capture-sysroot.sh tarball into `dest` (regular files and directories only, no links, nothing
    outside dest); returns dest. Raises ConfigError if it is not a readable tar archive."""
    import tarfile

    from agent.errors import ConfigError

    dest = Path(dest)
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if (m.isfile() or m.isdir()) and _safe_member(m.name)]
            for m in members:
                m.mode = 0o755 if m.isdir() else 0o644
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12/3.11.4: refuse links and devices out of the tree
                tar.extractall(dest, members=members, filter="data")
            else:  # pragma: no cover - older interpreters; members are already limited to safe files and dirs
                tar.extractall(dest, members=members)
    except (tarfile.TarError, EOFError):
        raise ConfigError(
            f"{archive}: not a directory or a capture tarball (.tar.gz from capture-sysroot.sh)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{archive}: cannot unpack: {exc.strerror or exc}") from None
    return dest


def _safe_member(name: str) -> bool:
    parts = Path(name).parts
    return not Path(name).is_absolute() and ".." not in parts
