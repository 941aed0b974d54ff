"""The HTTP server's worker pool: a fixed set of threads that serve connections with a complete request head. The
most recently idle worker takes the next connection (a small, warm set of threads serves); connections no worker
has taken yet wait in order, and `backlog()` tells a worker on its keep-alive fast path to give its connection up."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from agent.serving.http.wire import Conn


class _Seat:
    """Where one idle worker waits for its next connection (None: stop)."""

    __slots__ = ("_ready", "_conn")

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._conn: Conn | None = None

    def give(self, conn: Conn | None) -> None:
        self._conn = conn
        self._ready.set()

    def take(self) -> Conn | None:
        self._ready.wait()
        self._ready.clear()
        conn, self._conn = self._conn, None
        return conn


class WorkerPool:
    """`size` threads, each running `make()`'s serve function (one per thread) on the connections handed over."""

    def __init__(self, size: int, name: str):
        self.size = max(1, int(size))
        self.name = name
        self._lock = threading.Lock()
        self._waiting: list[_Seat] = []  # idle workers, most recent last
        self._pending: collections.deque[Conn] = collections.deque()  # connections no worker has taken yet
        self._closing = False
        self._threads: list[threading.Thread] = []

    def start(self, make: Callable[[], Callable[[Conn], None]]) -> None:
        self._threads = [
            threading.Thread(target=self._work, args=(make(),), name=f"{self.name}-w{i}", daemon=True)
            for i in range(self.size)
        ]
        for t in self._threads:
            t.start()

    def backlog(self) -> bool:
        """Do connections wait for a worker?"""
        return bool(self._pending)

    def hand_over(self, conn: Conn) -> None:
        """Give a connection with a complete request head to the most recently idle worker (or queue it)."""
        with self._lock:
            seat = self._waiting.pop() if self._waiting else None
            if seat is None:
                self._pending.append(conn)
                return
        seat.give(conn)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the idle workers and wait (up to timeout each) for the busy ones to finish."""
        with self._lock:
            self._closing = True
            waiting, self._waiting = self._waiting, []
        for seat in waiting:
            seat.give(None)
        for t in self._threads:
            t.join(timeout=timeout)

    def _work(self, serve: Callable[[Conn], None]) -> None:
        seat = _Seat()
        while True:
            with self._lock:
                if self._closing:
                    return
                conn = self._pending.popleft() if self._pending else None
                if conn is None:
                    self._waiting.append(seat)
            if conn is None:
                conn = seat.take()
                if conn is None:
                    return
            serve(conn)
