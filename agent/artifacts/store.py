"""ContentStore: content-addressed blobs (blobs/sha256/<hex>) and the staging area for resumable downloads.

A blob only ever appears by an atomic rename after its full sha256 was checked: nothing half-written is
ever visible under blobs/.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import ArtifactError, ArtifactRefused
from agent.util.atomic import atomic_move, fsync_dir

if TYPE_CHECKING:
    import builtins  # the class's own list() method shadows the builtin inside its body

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_BUF = 1024 * 1024


def check_sha(sha256: str) -> str:
    if not isinstance(sha256, str) or not _HEX64.fullmatch(sha256):
        raise ArtifactError(f"not a sha256 hex digest: {str(sha256)[:80]!r}")
    return sha256


def hash_file(path: str | os.PathLike[str], chunk_size: int | None = None) -> tuple[str, int, list[str]]:
    """(sha256, size, per-chunk sha256 list) of a file, reading it once."""
    whole, chunk_hashes, size = hashlib.sha256(), [], 0
    step = chunk_size or _BUF
    with open(path, "rb") as f:
        while True:
            block = f.read(step)
            if not block:
                break
            whole.update(block)
            size += len(block)
            if chunk_size:
                chunk_hashes.append(hashlib.sha256(block).hexdigest())
    return whole.hexdigest(), size, chunk_hashes


STALE_TEMP_S = 3600  # a put.* temp file older than this was left by a crash


class ContentStore:
    """root/blobs/sha256/<hex> (immutable, verified) and root/staging/<hex>.part + .bitmap (resumable)."""

    def __init__(self, root: str | os.PathLike[str], file_mode: int = 0o644):
        """file_mode: of the blobs (a device's state_dir store uses 0600; a control plane's may be served)."""
        self.root = Path(root)
        self.file_mode = file_mode
        self.blobs = self.root / "blobs" / "sha256"
        self.staging = self.root / "staging"
        try:
            self.blobs.mkdir(parents=True, exist_ok=True)
            self.staging.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArtifactError(f"cannot create store at {self.root}: {exc.strerror or exc}") from None

    # --- blobs ----------------------------------------------------------------------------------
    def path(self, sha256: str) -> Path:
        return self.blobs / check_sha(sha256)

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def list(self) -> list[str]:
        return sorted(p.name for p in self.blobs.iterdir() if _HEX64.fullmatch(p.name))

    def size(self, sha256: str) -> int:
        return self.path(sha256).stat().st_size

    def put_file(self, path: str | os.PathLike[str]) -> str:
        """Copy a file into the store (hashing while copying); returns its sha256."""
        h = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(prefix="put.", suffix=".tmp", dir=self.staging)
        try:
            with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
                while block := src.read(_BUF):
                    h.update(block)
                    dst.write(block)
                dst.flush()
                os.fsync(dst.fileno())
            sha = h.hexdigest()
            if self.has(sha):
                os.unlink(tmp)
            else:
                os.chmod(tmp, self.file_mode)
                atomic_move(tmp, self.path(sha))
            return sha
        except OSError as exc:
            _unlink(tmp)
            raise ArtifactError(f"cannot store {path}: {exc.strerror or exc}") from None
        except BaseException:
            _unlink(tmp)
            raise

    def put_bytes(self, data: bytes) -> str:
        fd, tmp = tempfile.mkstemp(prefix="put.", suffix=".src", dir=self.staging)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return self.put_file(tmp)
        finally:
            _unlink(tmp)

    def verify(self, sha256: str) -> bool:
        return self.has(sha256) and hash_file(self.path(sha256))[0] == sha256

    def gc(self, keep: Iterable[str]) -> builtins.list[str]:
        """Delete blobs not in `keep` and staging leftovers not belonging to a kept sha; returns removed shas.

        Temp files of writes in progress (`put.*`) are only removed once they are an hour old: another thread
        may be between mkstemp and rename."""
        keep = set(keep)
        removed = []
        for sha in self.list():
            if sha not in keep:
                _unlink(self.blobs / sha)
                removed.append(sha)
        now = time.time()
        for p in self.staging.iterdir():
            if p.name.startswith("put."):
                try:
                    if now - p.stat().st_mtime > STALE_TEMP_S:
                        _unlink(p)
                except FileNotFoundError:
                    pass
            elif p.name.split(".")[0] not in keep:
                _unlink(p)
        fsync_dir(self.blobs)
        return removed

    # --- staging --------------------------------------------------------------------------------
    def part_path(self, sha256: str) -> Path:
        return self.staging / f"{check_sha(sha256)}.part"

    def bitmap_path(self, sha256: str) -> Path:
        return self.staging / f"{check_sha(sha256)}.bitmap"

    def discard(self, sha256: str) -> None:
        """Forget a partial download."""
        _unlink(self.part_path(sha256))
        _unlink(self.bitmap_path(sha256))

    def commit_part(self, sha256: str, expected_size: int, verified_sha: str | None = None) -> Path:
        """Check the staged file's full sha256 and size, then move it atomically into blobs/.
        `verified_sha`: the caller already hashed the file's bytes as read back from disk."""
        part = self.part_path(sha256)
        if verified_sha is not None:
            actual, size = verified_sha, part.stat().st_size
        else:
            actual, size, _ = hash_file(part)
        if actual != sha256 or size != expected_size:
            self.discard(sha256)
            raise ArtifactRefused(
                f"assembled artifact has sha256 {actual[:16]}... ({size} bytes), manifest says "
                f"{sha256[:16]}... ({expected_size} bytes): discarded"
            )
        os.chmod(part, self.file_mode)
        atomic_move(part, self.path(sha256))
        _unlink(self.bitmap_path(sha256))
        return self.path(sha256)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.root).free


def _unlink(path: str | os.PathLike[str]) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
