"""The HTTP server's books: open connections (per client address, and the regular ones apart from those on probe
slots), requests in flight (for the drain), responses by status and connections closed by reason (for /metrics).
Shared by the selector thread and the workers; every count under one lock."""

from __future__ import annotations

import collections
import socket
import threading

from agent.serving.budget import BodyBudget
from agent.serving.http.wire import Conn


class ConnBook:
    """What is open and in flight; close() is the one way a connection ends (its kept read buffer leaves the budget)."""

    def __init__(self, budget: BodyBudget):
        self.budget = budget
        self.accepting = True  # False from the start of shutdown: no new connection, no new request
        self._lock = threading.Condition()
        self._inflight = 0
        self._conns: dict[Conn, None] = {}
        self._regular = 0  # connections inside max_connections (the rest hold probe slots)
        self._peers: collections.Counter[str] = collections.Counter()
        self._codes: dict[int, int] = {}
        self._closed: collections.Counter[str] = collections.Counter()  # connections we closed, by reason

    def stop_accepting(self) -> None:
        with self._lock:
            self.accepting = False

    def begin(self) -> bool:
        """A request starts being handled; False while shutting down."""
        with self._lock:
            if not self.accepting:
                return False
            self._inflight += 1
            return True

    def end(self) -> None:
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                self._lock.notify_all()

    def drained(self, timeout: float) -> bool:
        """Wait up to timeout for the requests in flight to finish; True when they did."""
        with self._lock:
            return self._lock.wait_for(lambda: self._inflight == 0, timeout)

    def count(self, status: int) -> None:
        """Count one response by status code (edge_agent_http_responses_total)."""
        with self._lock:
            self._codes[status] = self._codes.get(status, 0) + 1

    def refused(self, reason: str) -> None:
        """A connection refused at accept with a 503."""
        with self._lock:
            self._closed[reason] += 1
            self._codes[503] = self._codes.get(503, 0) + 1

    def load(self, peer: str) -> tuple[int, int, int]:
        """(connections of this peer, regular connections, connections on probe slots)."""
        with self._lock:
            return self._peers[peer], self._regular, len(self._conns) - self._regular

    def add(self, conn: Conn) -> None:
        with self._lock:
            self._conns[conn] = None
            self._peers[conn.peer] += 1
            if not conn.probe:
                self._regular += 1

    def close(self, conn: Conn, reason: str | None = None) -> None:
        """Close a connection that is not in the selector (idempotent); counted by reason when one is given."""
        with self._lock:
            if conn not in self._conns:
                return
            del self._conns[conn]
            self._peers[conn.peer] -= 1
            if not self._peers[conn.peer]:
                del self._peers[conn.peer]
            if not conn.probe:
                self._regular -= 1
            if reason:
                self._closed[reason] += 1
        self.budget.drop(len(conn.body))
        conn.body = bytearray()
        try:
            conn.sock.close()
        except OSError:
            pass

    def open(self) -> int:
        with self._lock:
            return len(self._conns)

    def all(self) -> list[Conn]:
        with self._lock:
            return list(self._conns)

    def shut(self) -> None:
        """Shut down and close every connection (the end of a shutdown)."""
        for conn in self.all():
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.close(conn)

    def snapshot(self) -> tuple[list[tuple[int, int]], list[tuple[str, int]], int, int]:
        """(responses by code, closes by reason, requests in flight, open connections), for /metrics."""
        with self._lock:
            return sorted(self._codes.items()), sorted(self._closed.items()), self._inflight, len(self._conns)
