"""HealthPublisher: the health document (telemetry figures, or the registry's stats, plus `disk_full`) published
over the link every telemetry.interval_s (0: never)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agent.services import Publish

Source = Callable[[], dict[str, Any]]


class HealthPublisher:
    def __init__(
        self,
        interval_s: float,
        source: Source,
        disk_full: Callable[[], str | None],
        publish: Publish | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`source`: the figures (Telemetry.collect); `disk_full`: why state files cannot be written, or None;
        `publish`: the link's (None: no link, nothing is published)."""
        self.interval_s = interval_s  # SIGHUP changes it (telemetry.interval_s is live)
        self.source, self.disk_full, self.publish, self.clock = source, disk_full, publish, clock
        self._last = 0.0

    def tick(self) -> None:
        if not self.interval_s or self.publish is None or self.clock() - self._last < self.interval_s:
            return
        self._last = self.clock()
        self.publish(self.doc())

    def doc(self) -> dict[str, Any]:
        doc = dict(self.source())
        full = self.disk_full()
        if full is not None:
            doc["disk_full"] = full
        return doc


def registry_health(registry: Any) -> Source:
    """Health figures without telemetry: each serving model's stats."""
    return lambda: {"models": {n: registry.stats(n) for n in registry.models()}}
