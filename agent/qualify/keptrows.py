"""Row workers kept for the close-call confirmation round.

A passing row's worker keeps its session (the warm one its cold/warm figures opened last) until selection is
decided, so the confirmation round re-times that session in that process: no new fork and no second compile,
and each row stays in its own child (a crash is still a row). Only the two fastest passing rows are kept (the
round confirms at most those), and with a memory cap the kept sessions together stay within it (the slowest is
let go first): a model never holds more than `serving.memory_max` in idle sessions beside the row being measured.
"""

from __future__ import annotations

from typing import Any

from agent.isolate.runner import IsolatedWorker

LIMIT = 2  # the confirmation round re-times the two fastest passing rows


class KeptRows:
    """Workers of passing rows by row key, with the p50 and peak memory each was kept for."""

    def __init__(self, memory_max: int | None = None) -> None:
        self.memory_max = memory_max
        self._held: dict[str, tuple[float, int, IsolatedWorker]] = {}

    def offer(self, row: Any, worker: IsolatedWorker) -> None:
        """Keep `worker` for `row` when the row passed with samples and is among the fastest; else close it."""
        lat = row.latency_ms or {}
        if row.status != "passed" or not lat.get("samples_ms") or lat.get("p50") is None or row.emulated:
            worker.close()
            return
        old = self._held.pop(row.key, None)
        if old is not None:
            old[2].close()
        self._held[row.key] = (float(lat["p50"]), int(row.memory_peak_bytes or 0), worker)
        self._prune()

    def _prune(self) -> None:
        def over() -> bool:
            if len(self._held) > LIMIT:
                return True
            held = sum(peak for _, peak, _ in self._held.values())
            return bool(self.memory_max) and held > (self.memory_max or 0)

        while self._held and over():
            slowest = max(self._held, key=lambda k: self._held[k][0])
            self._held.pop(slowest)[2].close()

    def pop(self, key: str) -> IsolatedWorker | None:
        """The kept worker of a row (the caller closes it), or None."""
        held = self._held.pop(key, None)
        return held[2] if held else None

    def keys(self) -> list[str]:
        return list(self._held)

    def close(self) -> None:
        while self._held:
            self._held.popitem()[1][2].close()
