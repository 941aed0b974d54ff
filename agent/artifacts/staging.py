"""A resumable download in progress: staging/<sha>.part written with pwrite, plus a persisted bitmap.

The bitmap is a durable record of verified chunks: written atomically after an fdatasync of the .part, by a
background thread so the puller never waits for the disk. The same thread hashes the contiguous written
prefix of the .part as it grows, so the whole-file sha256 is ready (read back from the file, not from memory)
moments after the last chunk. Chunks written after the last persist are not lost on a crash: on resume,
unmarked chunks are re-hashed from the .part and kept when they match the manifest.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time
from pathlib import Path

from agent.artifacts.manifest.parts import Artifact
from agent.artifacts.recipe import Layout
from agent.artifacts.store import ContentStore
from agent.errors import ArtifactError
from agent.util.atomic import atomic_write_json, read_json

Pieces = Artifact | Layout  # the manifest's fixed chunks, or a recipe's variable ones (a delta pull)
RECOVER_GAP = 256  # more than any automatic window: unwritten chunks in a row that end the recovery scan


class Staging:
    """Owns <sha>.part and <sha>.bitmap for one artifact while it downloads."""

    def __init__(
        self,
        store: ContentStore,
        artifact: Pieces,
        persist_interval_s: float = 0.5,
        persist_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.store, self.artifact = store, artifact
        self.part = store.part_path(artifact.sha256)
        self.bitmap_file = store.bitmap_path(artifact.sha256)
        self.have = bytearray(artifact.count)  # one byte per chunk in memory; bits on disk
        self.requested_upto = 0
        self.lookahead = 0  # the puller's window: chunks that may be on disk beyond requested_upto
        self.recovered = 0  # chunks found intact in the .part beyond the persisted bitmap
        self._interval, self._persist_bytes = persist_interval_s, persist_bytes
        self._dirty_bytes, self._last_persist = 0, time.monotonic()
        self._fd: int | None = None
        self._whole, self._hashed = hashlib.sha256(), 0  # sha256 of chunks [0, _hashed) read from the .part
        self._wake, self._stop = threading.Event(), threading.Event()
        self._persist_lock = threading.Lock()
        self._bg: threading.Thread | None = None
        self._bg_error: BaseException | None = None

    # --- open / close ---------------------------------------------------------------------------
    def open(self) -> "Staging":
        a = self.artifact
        fresh = not self.part.exists()
        try:
            self._fd = os.open(self.part, os.O_RDWR | os.O_CREAT, 0o600)
            if os.fstat(self._fd).st_size != a.size:
                os.ftruncate(self._fd, a.size)
        except OSError as exc:
            raise ArtifactError(f"cannot open staging file {self.part}: {exc.strerror or exc}") from None
        self._load_bitmap()
        if not fresh:
            self._recover()
        self._bg = threading.Thread(target=self._background, name=f"staging-{a.sha256[:8]}", daemon=True)
        self._bg.start()
        return self

    def _load_bitmap(self) -> None:
        a = self.artifact
        saved = read_json(self.bitmap_file) if self.bitmap_file.exists() else None
        if (
            isinstance(saved, dict)
            and saved.get("sha256") == a.sha256
            and saved.get("chunk_size") == a.chunk_size
            and saved.get("count") == a.count
        ):
            try:
                bits = base64.b64decode(saved.get("have", ""))
                self.have = bytearray((bits[i >> 3] >> (i & 7)) & 1 for i in range(a.count))
                self.requested_upto = min(int(saved.get("requested_upto", 0)), a.count)
            except (ValueError, IndexError, TypeError):
                self.have = bytearray(a.count)
        elif isinstance(saved, dict) and saved.get("sha256") == a.sha256:
            # the .part was written under another chunk layout (a delta pull by recipe that goes on with fixed
            # chunks): its bits say nothing here, and its chunks may lie anywhere in the file, so recovery
            # checks every chunk instead of stopping after RECOVER_GAP misses in a row
            self.requested_upto = a.count

    def _recover(self) -> None:
        """Keep chunks written after the last bitmap persist (checked against their manifest hashes).

        Requests go out in index order, so written chunks form a prefix with holes: scan past the persisted
        request mark until `RECOVER_GAP` chunks in a row are not there."""
        misses = 0
        for i in range(self.artifact.count):
            if self.have[i]:
                continue
            if self._chunk_ok(i):
                self.have[i] = 1
                self.recovered += 1
                misses = 0
                continue
            misses += 1
            if i >= self.requested_upto and misses >= RECOVER_GAP:
                break
        if self.recovered:
            self.persist()

    def _chunk_ok(self, i: int) -> bool:
        assert self._fd is not None  # only open() calls this (via _recover), after opening the .part
        n = self.artifact.chunk_len(i)
        data = os.pread(self._fd, n, self.artifact.offset(i))
        return len(data) == n and hashlib.sha256(data).hexdigest() == self.artifact.chunks[i]

    def close(self) -> None:
        if self._fd is None:
            return
        self._stop_background()
        try:
            self.persist()
        finally:
            os.close(self._fd)
            self._fd = None

    def _stop_background(self) -> None:
        if self._bg is not None:
            self._stop.set()
            self._wake.set()
            self._bg.join()
            self._bg = None

    # --- state ----------------------------------------------------------------------------------
    def missing(self) -> list[int]:
        return [i for i, h in enumerate(self.have) if not h]

    @property
    def done(self) -> bool:
        return all(self.have)

    def bytes_have(self) -> int:
        return sum(self.artifact.chunk_len(i) for i, h in enumerate(self.have) if h)

    def note_requested(self, index: int) -> None:
        if index + 1 > self.requested_upto:
            self.requested_upto = index + 1

    # --- writing --------------------------------------------------------------------------------
    def write(self, index: int, data: bytes | bytearray | memoryview) -> bool:
        """Verify one chunk against the manifest and pwrite it; False (nothing written) on a hash mismatch."""
        a = self.artifact
        if len(data) != a.chunk_len(index) or hashlib.sha256(data).hexdigest() != a.chunks[index]:
            return False
        if self._fd is None:
            raise ArtifactError(f"cannot write {self.part}: staging is not open")
        try:
            os.pwrite(self._fd, data, a.offset(index))
        except OSError as exc:
            raise ArtifactError(f"cannot write {self.part}: {exc.strerror or exc}") from None
        self.have[index] = 1
        self._dirty_bytes += len(data)
        if index == self._hashed or self._dirty_bytes >= self._persist_bytes:
            self._wake.set()
        return True

    def persist(self) -> None:
        """Snapshot the bitmap, fdatasync the .part (so every chunk in the snapshot is durable), then
        atomically replace the bitmap file."""
        with self._persist_lock:
            if self._fd is None:
                return
            snapshot = bytes(self.have)
            self._dirty_bytes, self._last_persist = 0, time.monotonic()
            os.fdatasync(self._fd)
            bits = bytearray((self.artifact.count + 7) // 8)
            for i, h in enumerate(snapshot):
                if h:
                    bits[i >> 3] |= 1 << (i & 7)
            atomic_write_json(
                self.bitmap_file,
                {
                    "sha256": self.artifact.sha256,
                    "chunk_size": self.artifact.chunk_size,
                    "count": self.artifact.count,
                    "have": base64.b64encode(bytes(bits)).decode(),
                    "requested_upto": min(self.artifact.count, self.requested_upto + self.lookahead),
                },
                mode=0o600,
            )

    # --- background: hash the growing prefix, persist the bitmap --------------------------------
    def _background(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.wait(min(0.1, self._interval))
                self._wake.clear()
                self._advance_hash()
                due = time.monotonic() - self._last_persist >= self._interval and self._dirty_bytes
                if due or self._dirty_bytes >= self._persist_bytes:
                    self.persist()
        except BaseException as exc:  # noqa: BLE001 - surfaced by finish()
            self._bg_error = exc

    def _advance_hash(self) -> None:
        a = self.artifact
        while self._hashed < a.count and self.have[self._hashed] and self._fd is not None:
            n = a.chunk_len(self._hashed)
            self._whole.update(os.pread(self._fd, n, a.offset(self._hashed)))
            self._hashed += 1

    def finish(self) -> Path:
        """Check the whole file's sha256 (as read back from the .part), then move it into the store."""
        if not self.done:
            raise ArtifactError("internal: finish() before every chunk was written")
        self._stop_background()
        self._advance_hash()
        actual = self._whole.hexdigest()
        self.close()
        if self._bg_error is not None and not isinstance(self._bg_error, OSError):
            raise self._bg_error
        return self.store.commit_part(self.artifact.sha256, self.artifact.size, verified_sha=actual)


def persisted_chunks(store: ContentStore, sha256: str) -> int:
    """How many chunks of a pull in progress the persisted bitmap records (0 when none): a cheap progress mark
    (recovery tells a download that advanced between two crashes from a crash loop)."""
    try:
        saved = read_json(store.bitmap_path(sha256))
        bits = base64.b64decode(saved.get("have", "")) if isinstance(saved, dict) else b""
    except (OSError, ValueError, TypeError):
        return 0
    return sum(bin(b).count("1") for b in bits)
