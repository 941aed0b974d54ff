"""StatsBook: per model, the ModelStats of its most recent versions (the serving one is always kept)."""

from __future__ import annotations

import threading

from agent.serving.metrics import ModelStats

STATS_VERSIONS_KEPT = 8  # per model; older versions' counters are dropped from /metrics


class StatsBook:
    def __init__(self, finite_every: int) -> None:
        self.finite_every = finite_every
        self._lock = threading.Lock()
        self._stats: dict[str, dict[str, ModelStats]] = {}

    def open(self, name: str, version: str, serving: str | None) -> ModelStats:
        """The stats of (name, version), kept from an earlier activation of it or new; the oldest versions
        beyond STATS_VERSIONS_KEPT are dropped, never the serving one."""
        with self._lock:
            per = self._stats.setdefault(name, {})
            stats = per.pop(version, None) or ModelStats(name, version)
            stats.finite_every = self.finite_every
            per[version] = stats  # most recent last
            while len(per) > STATS_VERSIONS_KEPT:
                oldest = next(v for v in per if serving is None or v != serving)
                del per[oldest]
        return stats

    def get(self, name: str, version: str | None) -> ModelStats | None:
        with self._lock:
            return self._stats.get(name, {}).get(version) if version is not None else None

    def all(self) -> list[ModelStats]:
        with self._lock:
            return [s for per in self._stats.values() for s in per.values()]
