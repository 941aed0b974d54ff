"""ChunkPuller: windowed, resumable pull of one artifact over the MQTT artifact channel into the store.

Several chunk requests are in flight (the window), topped up continuously as answers land; each answer is
checked against the manifest's chunk hash and written with pwrite straight from the received payload; a
persisted bitmap makes a restart fetch only missing chunks; the whole file's sha256 is checked before the atomic
move into blobs/. Memory is bounded by window x chunk_size. Only chunks older than the adaptive timeout
(agent.artifacts.window) are asked for again. A pull with no progress for `stall_timeout` raises
ArtifactError with the reason; it never hangs.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from agent.artifacts import chunks
from agent.artifacts.deadline import DownloadWatch
from agent.artifacts.manifest import Manifest
from agent.artifacts.recipe import Layout
from agent.artifacts.staging import RECOVER_GAP, Pieces, Staging
from agent.artifacts.store import ContentStore
from agent.artifacts.window import InFlight, RttEstimator
from agent.errors import ArtifactError, ArtifactRefused, DiskFull

Progress = Callable[..., None]


class ChunkSource(Protocol):
    """One artifact's chunk channel as the puller uses it (agent.transport.device.ChunkChannel)."""

    def request(self, chunk_size: int, indices: Iterable[int]) -> None: ...

    def get(self, timeout: float) -> chunks.ChunkResponse | None: ...


class ChunkLink(Protocol):
    """What pulls over MQTT: a link that opens a chunk channel per artifact (agent.transport.device.DeviceLink)."""

    def chunk_channel(self, sha256: str) -> AbstractContextManager[ChunkSource]: ...


DEFAULT_WINDOW_BYTES = 16 * 1024 * 1024  # chunks in flight x chunk_size: the device's memory bound
MIN_WINDOW = 4  # chunks
MIN_REQUEST_TIMEOUT, MAX_REQUEST_TIMEOUT = 0.5, 20.0  # bounds of the adaptive per-chunk timeout (seconds)


def check_space(store: ContentStore, needed: int, reserve_bytes: int, what: str) -> None:
    free = store.free_bytes()
    if needed + reserve_bytes > free:
        raise DiskFull(
            f"not enough disk for {what}: needs {needed} bytes (+{reserve_bytes} reserve), "
            f"{free} free under {store.root}"
        )


class ChunkPuller:
    """Pull artifacts through a DeviceLink (anything with chunk_channel(sha) -> ChunkChannel)."""

    def __init__(
        self,
        link: ChunkLink,
        store: ContentStore,
        *,
        window: int | None = None,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        request_timeout: float = 5.0,
        stall_timeout: float = 30.0,
        max_bad: int = 3,
        reserve_bytes: int = 0,
        progress: Progress | None = None,
        min_request_timeout: float = MIN_REQUEST_TIMEOUT,
        max_request_timeout: float = MAX_REQUEST_TIMEOUT,
        refill: int | None = None,
    ) -> None:
        """request_timeout: how long a chunk may take before any round trip was measured; then the timeout
        adapts to the measured round trips within [min_request_timeout, max_request_timeout] (never more than
        half the stall timeout). window: chunks in flight (default: what fits in window_bytes, at least 4).
        refill: free window slots that trigger a request (default window / 8: a continuous pipeline)."""
        self.link, self.store = link, store
        self._window, self.window_bytes, self._refill = window, window_bytes, refill
        self.window, self.request_timeout, self.stall_timeout = max(1, window or 1), request_timeout, stall_timeout
        self._lo = min(min_request_timeout, request_timeout)
        self._hi = max(self._lo, min(max_request_timeout, stall_timeout / 2))
        self.max_bad, self.reserve_bytes, self.progress = max_bad, reserve_bytes, progress
        self.flight: InFlight | None = None
        self._not_found = ""
        self.stats: dict[str, float] = {}

    def pull(self, manifest: Manifest, watch: DownloadWatch | None = None, layout: Layout | None = None) -> Path:
        """`watch` (agent.artifacts.deadline.DownloadWatch): progress/overall deadlines and the caller's cancel,
        checked on every turn of the loop (at least every 0.5 s). layout: a recipe.Layout to pull the artifact's
        variable chunks by recipe index (a delta pull)."""
        a = layout or manifest.artifact
        if self.store.has(a.sha256):
            return self.store.path(a.sha256)
        if self._window is None:  # in chunks: what fits in window_bytes (memory bound), at least 4
            biggest = a.chunk_size or (max(layout.lens) if layout is not None else 1)  # variable chunks: the largest
            self.window = max(MIN_WINDOW, min(RECOVER_GAP - 1, self.window_bytes // biggest))
        staging = Staging(self.store, a).open()
        staging.lookahead = self.window
        try:
            check_space(
                self.store, a.size - staging.bytes_have(), self.reserve_bytes, f"{manifest.name} {manifest.version}"
            )
            self.stats = {
                "chunks": a.count,
                "resumed": a.count - len(staging.missing()),
                "recovered": staging.recovered,
                "requested": 0,
                "received": 0,
                "duplicates": 0,
                "bad": 0,
                "not_found": 0,
                "retries": 0,
            }
            with self.link.chunk_channel(a.sha256) as channel:
                self._loop(manifest, staging, channel, a, watch)
            self._report("verify", manifest, staging)
            return staging.finish()
        finally:
            staging.close()

    # --- the loop -------------------------------------------------------------------------------
    def _loop(
        self, manifest: Manifest, staging: Staging, channel: ChunkSource, a: Pieces, watch: DownloadWatch | None = None
    ) -> None:
        missing = collections.deque(staging.missing())
        flight = self.flight = InFlight(RttEstimator(self.request_timeout, self._lo, self._hi))
        bad: collections.Counter[int] = collections.Counter()
        last_progress = time.monotonic()
        self._not_found = ""
        self._report("start", manifest, staging)
        while missing or flight:
            now = time.monotonic()
            self._fill(channel, a.chunk_size, staging, missing, flight, now)
            deadline = flight.next_deadline()
            resp = channel.get(timeout=max(0.002, 0.5 if deadline is None else min(0.5, deadline - now)))
            now = time.monotonic()
            if watch is not None:
                watch.got(len(resp.body) if resp is not None else 0)
                watch.check()
            if resp is not None and resp.chunk_size == a.chunk_size and resp.index < a.count:
                if self._take(resp, staging, flight, bad, missing, now):
                    last_progress = now
                    self._report("chunk", manifest, staging)
            due = flight.overdue(now)
            if due:  # only chunks older than the adaptive timeout (lost answers, broker restart), oldest first
                self.stats["retries"] += len(due)
                missing.extendleft(reversed(due))
            if now - last_progress >= self.stall_timeout:
                raise ArtifactError(self._stall_reason(manifest, staging, channel, self._not_found))
        self.stats.update(
            rtt_ms=round(1000 * (flight.rtt.srtt or 0.0), 1),
            timeout_ms=round(1000 * flight.rtt.timeout),
            window=self.window,
        )

    def _take(
        self,
        resp: chunks.ChunkResponse,
        staging: Staging,
        flight: InFlight,
        bad: collections.Counter[int],
        missing: collections.deque[int],
        now: float,
    ) -> bool:
        """Handle one answer; True when it wrote a new chunk (verified, pwritten straight from the payload)."""
        if resp.status != chunks.OK:
            self.stats["not_found"] += 1  # stays in flight: asked again when overdue (a server may appear)
            self._not_found = bytes(resp.body).decode("utf-8", "replace")[:200]
        elif staging.have[resp.index]:
            self.stats["duplicates"] += 1
        elif staging.write(resp.index, resp.body):
            flight.land(resp.index, now)
            self.stats["received"] += 1
            return True
        else:
            self._bad_chunk(resp.index, bad, missing, flight)
        return False

    def _fill(
        self,
        channel: ChunkSource,
        chunk_size: int,
        staging: Staging,
        missing: collections.deque[int],
        flight: InFlight,
        now: float,
    ) -> None:
        """Keep the window full: ask for more as soon as a few slots are free (a continuous pipeline; one small
        request message per `refill` chunks)."""
        free = self.window - len(flight)
        refill = max(1, min(self.window, self._refill or self.window // 8))
        if free <= 0 or (free < refill and len(missing) > free):
            return
        batch: list[int] = []
        while missing and len(batch) < free:
            i = missing.popleft()
            if not staging.have[i] and i not in flight:
                batch.append(i)
        for at in range(0, len(batch), chunks.MAX_INDICES):
            part = batch[at : at + chunks.MAX_INDICES]
            channel.request(chunk_size, part)
            flight.add(part, now)
            staging.note_requested(max(part))
            self.stats["requested"] += len(part)

    def _bad_chunk(
        self, index: int, bad: collections.Counter[int], missing: collections.deque[int], flight: InFlight
    ) -> None:
        self.stats["bad"] += 1
        bad[index] += 1
        if bad[index] >= self.max_bad:
            raise ArtifactRefused(
                f"chunk {index} failed its sha256 check {bad[index]} times: the artifact source is "
                "corrupt or tampered with; nothing was installed"
            )
        flight.drop(index)
        missing.appendleft(index)

    def _stall_reason(self, manifest: Manifest, staging: Staging, channel: ChunkSource, not_found: str) -> str:
        a = manifest.artifact
        where = f"{manifest.name} {manifest.version}: {staging.bytes_have()}/{a.size} bytes"
        if not_found:
            return f"download stalled ({where}): artifact servers answered '{not_found}'"
        link = "connected" if getattr(channel, "connected", True) else "not connected to the broker"
        return (
            f"download stalled ({where}): no chunk for {self.stall_timeout:.0f} s ({link}); is an artifact "
            f"server (edge-agent fleet serve) running?"
        )

    def _report(self, event: str, manifest: Manifest, staging: Staging) -> None:
        if self.progress is None:
            return
        if event == "chunk":
            n = self.stats["received"]
            if n % max(1, manifest.artifact.count // 100) and not staging.done:
                return
        self.progress(
            event,
            model=manifest.name,
            version=manifest.version,
            done=staging.bytes_have(),
            total=manifest.artifact.size,
        )
