"""ChunkPuller: windowed, resumable pull of one artifact over the MQTT artifact channel into the store.

Several chunk requests are in flight (the window); each answer is checked against the manifest's chunk hash
and written with pwrite; a persisted bitmap makes a restart fetch only missing chunks; the whole file's sha256
is checked before the atomic move into blobs/. Memory is bounded by window x chunk_size. A pull with no
progress for `stall_timeout` raises ArtifactError with the reason; it never hangs.
"""
from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Callable

from agent.artifacts import chunks
from agent.artifacts.manifest import Manifest
from agent.artifacts.staging import RECOVER_GAP, Staging
from agent.artifacts.store import ContentStore
from agent.errors import ArtifactError

Progress = Callable[..., None]
DEFAULT_WINDOW_BYTES = 16 * 1024 * 1024  # chunks in flight x chunk_size: the device's memory bound


def check_space(store: ContentStore, needed: int, reserve_bytes: int, what: str) -> None:
    free = store.free_bytes()
    if needed + reserve_bytes > free:
        raise ArtifactError(f"not enough disk for {what}: needs {needed} bytes (+{reserve_bytes} reserve), "
                            f"{free} free under {store.root}")


class ChunkPuller:
    """Pull artifacts through a DeviceLink (anything with chunk_channel(sha) -> ChunkChannel)."""

    def __init__(self, link, store: ContentStore, *, window: int | None = None,
                 window_bytes: int = DEFAULT_WINDOW_BYTES, request_timeout: float = 5.0,
                 stall_timeout: float = 30.0, max_bad: int = 3, reserve_bytes: int = 0,
                 progress: Progress | None = None):
        self.link, self.store = link, store
        self._window, self.window_bytes = window, window_bytes
        self.window, self.request_timeout, self.stall_timeout = max(1, window or 1), request_timeout, stall_timeout
        self.max_bad, self.reserve_bytes, self.progress = max_bad, reserve_bytes, progress
        self.stats: dict[str, int] = {}

    def pull(self, manifest: Manifest) -> Path:
        a = manifest.artifact
        if self.store.has(a.sha256):
            return self.store.path(a.sha256)
        if self._window is None:  # in chunks: what fits in window_bytes (memory bound), at least 4
            self.window = max(4, min(RECOVER_GAP - 1, self.window_bytes // a.chunk_size))
        staging = Staging(self.store, a).open()
        staging.lookahead = self.window
        try:
            check_space(self.store, a.size - staging.bytes_have(), self.reserve_bytes, f"{manifest.name} {manifest.version}")
            self.stats = {"chunks": a.count, "resumed": a.count - len(staging.missing()), "recovered": staging.recovered,
                          "requested": 0, "received": 0, "duplicates": 0, "bad": 0, "not_found": 0, "retries": 0}
            with self.link.chunk_channel(a.sha256) as channel:
                self._loop(manifest, staging, channel)
            self._report("verify", manifest, staging)
            return staging.finish()
        finally:
            staging.close()

    # --- the loop -------------------------------------------------------------------------------
    def _loop(self, manifest: Manifest, staging: Staging, channel) -> None:
        a = manifest.artifact
        missing = collections.deque(staging.missing())
        inflight: set[int] = set()
        bad: collections.Counter = collections.Counter()
        last_progress = last_answer = time.monotonic()
        not_found = ""
        self._report("start", manifest, staging)
        while missing or inflight:
            self._fill(channel, a.chunk_size, staging, missing, inflight)
            resp = channel.get(timeout=min(0.5, self.request_timeout))
            now = time.monotonic()
            if resp is not None and resp.chunk_size == a.chunk_size and resp.index < a.count:
                last_answer = now
                if resp.status != chunks.OK:
                    self.stats["not_found"] += 1
                    not_found = bytes(resp.body).decode("utf-8", "replace")[:200]
                elif staging.have[resp.index]:
                    self.stats["duplicates"] += 1
                elif staging.write(resp.index, resp.body):
                    inflight.discard(resp.index)
                    self.stats["received"] += 1
                    last_progress = now
                    self._report("chunk", manifest, staging)
                else:
                    self._bad_chunk(resp.index, bad, missing, inflight)
            if now - last_answer >= self.request_timeout and inflight:
                self.stats["retries"] += len(inflight)  # nothing came back: ask again (broker restart, lost link)
                missing.extendleft(sorted(inflight, reverse=True))
                inflight.clear()
                last_answer = now
            if now - last_progress >= self.stall_timeout:
                raise ArtifactError(self._stall_reason(manifest, staging, channel, not_found))

    def _fill(self, channel, chunk_size: int, staging: Staging, missing, inflight: set[int]) -> None:
        """Top the window up, in batches of at least a quarter window (fewer, larger request messages)."""
        free = self.window - len(inflight)
        if free <= 0 or (free < max(1, self.window // 4) and len(missing) >= free):
            return
        batch = []
        while missing and len(inflight) + len(batch) < self.window:
            i = missing.popleft()
            if not staging.have[i]:
                batch.append(i)
        if batch:
            channel.request(chunk_size, batch)
            inflight.update(batch)
            staging.note_requested(max(batch))
            self.stats["requested"] += len(batch)

    def _bad_chunk(self, index: int, bad, missing, inflight: set[int]) -> None:
        self.stats["bad"] += 1
        bad[index] += 1
        if bad[index] >= self.max_bad:
            raise ArtifactError(f"chunk {index} failed its sha256 check {bad[index]} times: the artifact source is "
                                "corrupt or tampered with; nothing was installed")
        inflight.discard(index)
        missing.appendleft(index)

    def _stall_reason(self, manifest: Manifest, staging: Staging, channel, not_found: str) -> str:
        a = manifest.artifact
        where = f"{manifest.name} {manifest.version}: {staging.bytes_have()}/{a.size} bytes"
        if not_found:
            return f"download stalled ({where}): artifact servers answered '{not_found}'"
        link = "connected" if getattr(channel, "connected", True) else "not connected to the broker"
        return (f"download stalled ({where}): no chunk for {self.stall_timeout:.0f} s ({link}); is an artifact "
                f"server (edge-agent fleet serve) running?")

    def _report(self, event: str, manifest: Manifest, staging: Staging) -> None:
        if self.progress is None:
            return
        if event == "chunk":
            n = self.stats["received"]
            if n % max(1, manifest.artifact.count // 100) and not staging.done:
                return
        self.progress(event, model=manifest.name, version=manifest.version, done=staging.bytes_have(),
                      total=manifest.artifact.size)
