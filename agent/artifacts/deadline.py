"""Download deadlines: every download makes progress (at least `min_bytes` every `interval_s`) and ends within
`overall_s`; a cancel (the step's check) stops it at the next poll. A source that is too slow (a tarpit sending
one byte every few seconds) raises SourceTooSlow, and fetch_artifact moves on to the manifest's next source."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.errors import ArtifactError

POLL_S = 0.5  # the longest a puller blocks between two checks (socket reads, channel waits)


class SourceTooSlow(ArtifactError):
    """This source missed its progress or overall deadline (transient: another source, or later, may work)."""


@dataclass(frozen=True)
class DownloadLimits:
    min_bytes: int = 64 * 1024  # at least this many bytes ...
    interval_s: float = 30.0  # ... in every interval of this length, per source
    overall_s: float = 6 * 3600.0  # the whole download (every source), per attempt

    def watch(self, what: str, check: Callable[[], None] | None = None) -> "DownloadWatch":
        return DownloadWatch(self, what, check)


class DownloadWatch:
    """One download attempt: `got(n)` as bytes arrive, `check()` at every poll; `source(name)` starts the
    progress window of the next source (the overall deadline runs on)."""

    def __init__(
        self,
        limits: DownloadLimits,
        what: str,
        check: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits, self.what, self._check, self._clock = limits, what, check, clock
        self.started = clock()
        self.source("")

    def source(self, name: str) -> None:
        self.name, self._window_start, self._window_bytes = name, self._clock(), 0

    def got(self, n: int) -> None:
        self._window_bytes += n

    def check(self) -> None:
        """Cancel/step deadline first (the caller's check raises its own errors), then this source's progress
        and the overall deadline (SourceTooSlow)."""
        if self._check is not None:
            self._check()
        now = self._clock()
        lim = self.limits
        if now - self.started > lim.overall_s:
            raise SourceTooSlow(f"download of {self.what} passed its overall deadline ({lim.overall_s:.0f} s)")
        if now - self._window_start >= lim.interval_s:
            if self._window_bytes < lim.min_bytes:
                raise SourceTooSlow(
                    f"{self.name or 'source'} too slow for {self.what}: {self._window_bytes} bytes in the last "
                    f"{now - self._window_start:.1f} s, under the {lim.min_bytes} bytes every {lim.interval_s:g} s "
                    "the download deadline needs; abandoned"
                )
            self._window_start, self._window_bytes = now, 0
