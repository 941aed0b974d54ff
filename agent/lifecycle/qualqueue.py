"""One qualification at a time on a device: a FIFO every deployment's qualifying step waits in.

Measurements on the same cores contaminate each other (latencies, the provider chosen, probation's baseline),
so a device qualifies one package at a time. A waiting deployment keeps checking its StepContext: when a newer
version of the same model supersedes it (or an operator cancels it) it leaves the queue at once. The state's
deadline does not run while a deployment waits: it is moved on by the time spent in line.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agent.lifecycle.context import Cancelled, StepContext

POLL_S = 0.2


class QualificationQueue:
    """FIFO of tickets; the head runs, the rest wait. `history` keeps the last windows (for tests and status)."""

    def __init__(self, keep: int = 100) -> None:
        self._cond = threading.Condition()
        self._waiting: list[int] = []
        self._running: int | None = None
        self._labels: dict[int, str] = {}
        self._ids = itertools.count(1)
        self.keep = keep
        self.history: list[dict[str, Any]] = []

    @contextmanager
    def turn(self, label: str, ctx: StepContext) -> Iterator[dict[str, Any]]:
        """Wait for this deployment's turn (reporting its place), run the body alone, then hand over. The
        yielded dict is the window record: queued_s, started, finished (epoch seconds)."""
        ticket = next(self._ids)
        queued = time.time()
        with self._cond:
            self._waiting.append(ticket)
            self._labels[ticket] = label
        try:
            self._wait(ticket, label, ctx)
        except BaseException:
            with self._cond:
                self._waiting.remove(ticket)
                self._labels.pop(ticket, None)
                self._cond.notify_all()
            raise
        window = {"label": label, "queued_s": round(time.time() - queued, 3), "started": time.time()}
        try:
            yield window
        finally:
            window["finished"] = time.time()
            with self._cond:
                self._running = None
                self._labels.pop(ticket, None)
                self.history = [*self.history, window][-self.keep :]
                self._cond.notify_all()

    def _wait(self, ticket: int, label: str, ctx: StepContext) -> None:
        reported = -1
        while True:
            if ctx.cancel.is_set():  # superseded or cancelled while queued: leave now (the deadline waits)
                raise Cancelled(ctx.cancel_event, ctx.cancel_reason)
            with self._cond:
                if self._running is None and self._waiting[0] == ticket:
                    self._waiting.pop(0)
                    self._running = ticket
                    return
                ahead = self._waiting.index(ticket) + (self._running is not None)
                running = self._labels.get(self._running) if self._running is not None else None
            if ahead != reported:
                reported = ahead
                ctx.report("queued", position=ahead, behind=running)
            with self._cond:
                self._cond.wait(POLL_S)

    def snapshot(self) -> dict[str, Any]:
        """What runs and what waits, by label (for status)."""
        with self._cond:
            return {
                "running": self._labels.get(self._running) if self._running is not None else None,
                "waiting": [self._labels[t] for t in self._waiting if t in self._labels],
            }
