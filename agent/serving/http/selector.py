"""The HTTP server's selector thread: admission of connections and everything they do while they wait for a request.

One thread holds every connection that waits for a request (idle keep-alive ones and ones whose request head is
still arriving), so a slow or idle crowd costs file descriptors, not threads. It accepts and admits connections
(at max_connections or max_per_peer the oldest idle one makes room; failing that the connection gets one of
probe_slots reserved slots, which serve the two health probes only, oldest evicted first), answers the health
probes itself, hands a complete request head to the worker pool, takes connections back from workers (to wait,
or to discard a refused body before the close), and enforces the header, idle and drain deadlines.
"""

from __future__ import annotations

import collections
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.serving.http.connbook import ConnBook
from agent.serving.http.handlers import Router
from agent.serving.http.wire import LINGER_BYTES, LINGER_S, RECV_BYTES, Conn, head_end, probe_answer, refusal

SWEEP_S = 0.1  # deadlines are checked this often
_LISTENER, _WAKE = object(), object()
_BUSY = refusal(503, "too many open connections")


@dataclass(frozen=True)
class ConnLimits:
    """The limits the selector enforces (OIPServer's arguments of the same names)."""

    header_timeout: float
    idle_timeout: float
    max_connections: int
    max_per_peer: int
    probe_slots: int


class Selector:
    """The selector thread over `listener`; complete request heads go to `hand_over` (the worker pool)."""

    def __init__(
        self,
        listener: socket.socket,
        book: ConnBook,
        limits: ConnLimits,
        router: Router,
        hand_over: Callable[[Conn], None],
    ):
        self._listener = listener
        self.book = book
        self.limits = limits
        self.router = router
        self._hand_over = hand_over
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._parked: set[Conn] = set()  # in the selector
        self.idle: collections.OrderedDict[Conn, None] = collections.OrderedDict()  # parked, no pending bytes
        self._handback: collections.deque[tuple[Conn, int]] = collections.deque()
        self._listening = True
        self._paused_until = 0.0  # accepting paused (out of file descriptors) until then
        self.stopping = False

    # ---- from other threads -----------------------------------------------------------------------------
    def wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (the selector is already due to wake) or closed
            pass

    def hand_back(self, conn: Conn, n: int) -> None:
        """A worker is done with conn: wait for its next request (n == 0), or discard n body bytes, then close."""
        self._handback.append((conn, n))
        self.wake()

    def close_listener(self) -> None:
        """After the loop ended."""
        if self._listening:
            self._listener.close()
            self._listening = False

    def close(self) -> None:
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # ---- the loop -----------------------------------------------------------------------------------------
    def run(self) -> None:
        next_sweep = 0.0
        while not self.stopping:
            if not self.book.accepting and self._listening:
                if not self._paused_until:
                    self._sel.unregister(self._listener)
                self._listener.close()
                self._listening = False
            elif self._paused_until and time.monotonic() >= self._paused_until:
                self._sel.register(self._listener, selectors.EVENT_READ, _LISTENER)
                self._paused_until = 0.0
            for key, _ in self._sel.select(SWEEP_S):
                if key.data is _LISTENER:
                    self._accept()
                elif key.data is _WAKE:
                    self._woken()
                else:
                    self._readable(key.data)
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + SWEEP_S

    def _accept(self) -> None:
        for _ in range(256):
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors: make room from the idle crowd, or pause accepting
                victim = self._idle_victim(None)
                if victim is not None:
                    self._drop(victim, "idle_evicted")
                elif self._listening:
                    self._sel.unregister(self._listener)
                    self._paused_until = time.monotonic() + SWEEP_S
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # field notes: no 40 ms keep-alive stalls
            except OSError:
                pass
            if not self.book.accepting:
                sock.close()
                continue
            self._admit(sock, str(addr[0]))

    def _admit(self, sock: socket.socket, peer: str) -> None:
        mine, regular, _ = self.book.load(peer)
        over_peer = mine >= self.limits.max_per_peer
        over_all = regular >= self.limits.max_connections
        probe = False
        if over_peer or over_all:
            victim = self._idle_victim(peer) if over_peer else None
            if victim is None and over_all and not over_peer:
                victim = self._idle_victim(None)
            if victim is not None:
                self._drop(victim, "idle_evicted")
            else:
                probe = True
                probes = self.book.load(peer)[2]
                if probes >= self.limits.probe_slots:  # the oldest probe connection gives way
                    oldest = min((c for c in self._parked if c.probe), key=lambda c: c.idle_since, default=None)
                    if oldest is None:
                        self._refuse(sock, "refused_full")
                        return
                    self._drop(oldest, "probe_evicted")
        conn = Conn(sock, peer, time.monotonic(), probe)
        self.book.add(conn)
        self._sel.register(sock, selectors.EVENT_READ, conn)
        self._parked.add(conn)
        if not probe:
            self.idle[conn] = None

    def _idle_victim(self, peer: str | None) -> Conn | None:
        """The oldest idle connection (of `peer`, when given) that is idle indeed. One whose first bytes arrived
        but were not read yet is not: it is read now (its head is arriving). One its client closed will do."""
        for conn in list(self.idle):
            if peer is not None and conn.peer != peer:
                continue
            try:
                pending = conn.sock.recv(1, socket.MSG_PEEK)  # parked sockets do not block
            except (BlockingIOError, InterruptedError):
                return conn
            except OSError:
                return conn  # broken: the client is gone
            if not pending:
                return conn  # closed by its client
            self._readable(conn)  # not idle: its bytes are read (and it leaves the idle books)
        return None

    def _refuse(self, sock: socket.socket, reason: str) -> None:
        try:
            sock.send(_BUSY)
        except OSError:
            pass
        sock.close()
        self.book.refused(reason)

    def _unpark(self, conn: Conn) -> None:
        """Take a connection out of the selector and the parked/idle books (it is being closed or served)."""
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self._parked.discard(conn)
        self.idle.pop(conn, None)

    def _drop(self, conn: Conn, reason: str | None) -> None:
        """Close a parked connection."""
        self._unpark(conn)
        self.book.close(conn, reason)

    def _woken(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        now = time.monotonic()
        while self._handback:
            conn, n = self._handback.popleft()
            if self.stopping:
                self.book.close(conn)
                continue
            try:
                conn.sock.setblocking(False)
                if n:
                    conn.drain_left, conn.deadline = min(n, LINGER_BYTES), now + LINGER_S
                    conn.sock.shutdown(socket.SHUT_WR)  # the answer is on its way; nothing more will be written
                self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError, KeyError):
                self.book.close(conn)
                continue
            self._parked.add(conn)
            if not n and not conn.buf and not conn.probe:
                conn.idle_since = now
                self.idle[conn] = None

    def _readable(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, None if not conn.buf else "closed_mid_request")
            return
        if conn.drain_left:
            conn.drain_left -= len(data)
            if conn.drain_left <= 0:
                self._drop(conn, None)
            return
        if not conn.buf:
            conn.first = time.monotonic()
            self.idle.pop(conn, None)
        conn.buf += data
        self._ready(conn)

    def _ready(self, conn: Conn) -> None:
        """Act on a parked connection's buffer: answer probes here, hand anything else with a complete head
        (or an oversized one, which the worker refuses) to a worker."""
        while True:
            found = head_end(conn.buf)
            if found is None:
                if len(conn.buf) > 64 * 1024:
                    self._dispatch(conn)
                return
            start, end, nxt = found
            block = bytes(conn.buf[start:end])
            answer = probe_answer(self.router, self.book.accepting, self.book.count, block, conn.probe)
            if answer is None:
                self._dispatch(conn)
                return
            parts, total, close = answer
            del conn.buf[:nxt]
            try:
                sent = conn.sock.send(b"".join(parts))
            except OSError:
                sent = -1
            if sent < total or close:
                self._drop(conn, None if sent == total else "unwritable")
                return
            now = time.monotonic()
            conn.first = now if conn.buf else None
            if not conn.buf:
                conn.idle_since = now
                self.idle[conn] = None
                return

    def _dispatch(self, conn: Conn) -> None:
        self._unpark(conn)
        self._hand_over(conn)

    def _sweep(self, now: float) -> None:
        """Enforce the deadlines of parked connections: drains, request heads, idle keep-alive."""
        late: list[tuple[Conn, str]] = []
        head_by = now - self.limits.header_timeout
        for conn in self._parked:
            if conn.drain_left:
                if now >= conn.deadline:
                    late.append((conn, "drained"))
            elif conn.first is not None:
                if conn.first <= head_by:
                    late.append((conn, "header_timeout"))
            elif conn.idle_since <= now - self.limits.idle_timeout:
                late.append((conn, "idle_timeout"))
        for conn, reason in late:
            if reason == "header_timeout":
                try:
                    conn.sock.send(refusal(408, f"request head not complete within {self.limits.header_timeout:g} s"))
                except OSError:
                    pass
            self._drop(conn, reason)
