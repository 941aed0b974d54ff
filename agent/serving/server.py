"""OIPServer: the HTTP/1.1 front of the registry (KServe v2 REST + /metrics): connections, limits, auth, drain.

Connections: one selector thread holds every connection that waits for a request (idle keep-alive ones and
ones whose request head is still arriving), so a slow or idle crowd costs file descriptors, not threads; a
pool of worker threads serves complete requests. Limits: a request head must arrive within header_timeout
of its first byte and the whole request within request_timeout; idle keep-alive connections close after
idle_timeout, and first (oldest first) when max_connections or max_per_peer is reached. Health probes are
always answerable: the selector answers GET/HEAD /v2/health/live and /v2/health/ready itself, without a
worker, and a connection over either cap still gets one of probe_slots reserved slots, which serve the
two probe paths only (oldest evicted first when they run out).

Authentication: with a token, every endpoint except the two probes needs `Authorization: Bearer <token>`
(scheme case-insensitive); the probes reveal nothing but liveness. Loopback is the default bind address.
"""

from __future__ import annotations

import collections
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable

from agent.errors import ServingError
from agent.serving.budget import BodyBudget
from agent.serving.dataplane import DataPlane
from agent.serving.handlers import Router
from agent.serving.metrics import Metric
from agent.serving.wire import LINGER_BYTES, LINGER_S, RECV_BYTES, Conn, Worker, head_end, probe_answer, refusal

DEFAULT_MAX_BODY = 64 * 1024 * 1024
DEFAULT_BODY_BUDGET = 256 * 1024 * 1024  # request memory (bodies as received, inflated, decoded) at once
SWEEP_S = 0.1  # deadlines are checked this often
_LISTENER, _WAKE = object(), object()
_BUSY = refusal(503, "too many open connections")


def _fd_room(reserve: int = 64) -> int:
    """File descriptors this process may still open for connections (RLIMIT_NOFILE soft limit less a reserve)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, (soft if soft != resource.RLIM_INFINITY else 1 << 20) - reserve)


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


class OIPServer:
    """KServe v2 REST server over a ModelRegistry. port=0 picks a free port (see .port); `collectors`
    (or add_metrics_collector) add Metric families to /metrics; shutdown(drain_timeout) drains."""

    def __init__(
        self,
        registry,
        host: str = "127.0.0.1",
        port: int = 8080,
        token: str | None = None,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        request_timeout: float = 60.0,
        header_timeout: float = 10.0,
        idle_timeout: float = 60.0,
        max_connections: int = 1024,
        max_per_peer: int = 128,
        probe_slots: int = 16,
        workers: int = 16,
        body_budget_bytes: int = DEFAULT_BODY_BUDGET,
        collectors: Iterable[Callable[[], Iterable[Metric]]] = (),
        plane: DataPlane | None = None,
    ):
        """body_budget_bytes bounds the memory requests occupy over all connections: bodies as received,
        inflated and decoded, plus the read buffers connections keep for reuse (at most a quarter of it).
        A request that cannot fit even alone gets 413 naming the limit; one that does not fit now gets 503.
        plane: the data plane shared with other front ends (gRPC); by default one of its own (token, budget)."""
        self.registry = registry
        self.max_body_bytes = int(max_body_bytes)
        if plane is None:
            budget = BodyBudget(max(int(body_budget_bytes), self.max_body_bytes))
            plane = DataPlane(registry, token=token, budget=budget, max_body_bytes=self.max_body_bytes)
        self.plane = plane
        self.budget = plane.budget
        self.request_timeout = float(request_timeout)
        self.header_timeout = min(float(header_timeout), self.request_timeout)
        self.idle_timeout = float(idle_timeout)
        self.probe_slots = max(1, int(probe_slots))
        self.max_connections = max(1, min(int(max_connections), _fd_room() - self.probe_slots))
        self.max_per_peer = max(1, int(max_per_peer))
        self.accepting = True
        self._lock = threading.Condition()
        self._inflight = 0
        self._conns: dict[Conn, None] = {}
        self._regular = 0  # connections inside max_connections (the rest hold probe slots)
        self._peers: collections.Counter[str] = collections.Counter()
        self._codes: dict[int, int] = {}
        self._closed: collections.Counter[str] = collections.Counter()  # connections we closed, by reason
        self._collectors = plane.collectors
        self._collectors.extend(collectors)
        plane.transport_metrics.append(self._http_metrics)
        self.router = Router(plane)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, port), family=family, backlog=1024)
        except OSError as exc:
            raise ServingError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        self._listener.setblocking(False)
        self.host, self.port = self._listener.getsockname()[:2]
        # selector-thread state
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._parked: set[Conn] = set()  # in the selector
        self._idle: collections.OrderedDict[Conn, None] = collections.OrderedDict()  # parked, no pending bytes
        self._handback: collections.deque[tuple[Conn, int]] = collections.deque()
        self._listening = True
        self._paused_until = 0.0  # accepting paused (out of file descriptors) until then
        self._stopping = False
        # workers: the most recently idle one takes the next connection (a small, warm set of threads serves)
        self._wlock = threading.Lock()
        self._waiting: list[_Seat] = []  # idle workers, most recent last
        self._pending: collections.deque[Conn] = collections.deque()  # connections no worker has taken yet
        self._closing_workers = False
        self._threads: list[threading.Thread] = []
        self._nworkers = max(1, int(workers))

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in str(self.host) else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> "OIPServer":
        """Serve in background threads (the selector and the workers); returns self."""
        loop = threading.Thread(target=self._loop, name=f"oip-{self.port}", daemon=True)
        self._threads = [loop] + [
            threading.Thread(target=self._work, name=f"oip-{self.port}-w{i}", daemon=True)
            for i in range(self._nworkers)
        ]
        for t in self._threads:
            t.start()
        return self

    @property
    def open_connections(self) -> int:
        """Client connections open now (probe slots included)."""
        with self._lock:
            return len(self._conns)

    @property
    def idle_connections(self) -> int:
        """Keep-alive connections waiting for a request with nothing of it received (closed first at a cap)."""
        return len(self._idle)

    @property
    def token(self) -> str | None:
        return self.plane.auth.token

    def set_token(self, token: str | None) -> None:
        """Replace the bearer token at runtime (serving.token_file is reloadable); None opens the API."""
        self.plane.auth.set_token(token)

    def add_metrics_collector(self, collect: Callable[[], Iterable[Metric]]) -> None:
        """Hook for other modules (telemetry): collect() returns Metric families added to /metrics."""
        self._collectors.append(collect)

    def shutdown(self, drain_timeout: float = 10.0) -> bool:
        """Stop accepting, let in-flight requests finish (up to drain_timeout), close every connection.
        Returns True when everything in flight finished in time."""
        with self._lock:
            self.accepting = False
        self.plane.accepting = False
        self._wake()
        with self._lock:
            drained = self._lock.wait_for(lambda: self._inflight == 0, drain_timeout)
        self._stopping = True
        self._wake()
        if self._threads:
            self._threads[0].join(timeout=5)
        if self._listening:
            self._listener.close()
            self._listening = False
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.close(conn)
        with self._wlock:
            self._closing_workers = True
            waiting, self._waiting = self._waiting, []
        for seat in waiting:
            seat.give(None)
        for t in self._threads[1:]:
            t.join(timeout=5)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
        return drained

    def __enter__(self) -> "OIPServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown(drain_timeout=5.0)

    # ---- the interface workers use (wire.Worker) ------------------------------------------------------
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

    def count(self, status: int) -> None:
        """Count one response by status code (edge_agent_http_responses_total)."""
        with self._lock:
            self._codes[status] = self._codes.get(status, 0) + 1

    def backlog(self) -> bool:
        """Do requests wait for a worker?"""
        return bool(self._pending)

    def park(self, conn: Conn) -> None:
        """Hand a connection back to the selector to wait for its next request."""
        self._handback.append((conn, 0))
        self._wake()

    def drain(self, conn: Conn, n: int) -> None:
        """Hand a connection back to discard the n body bytes of a refused request, then close it (LINGER_S):
        its client, likely still sending, then reads the answer instead of a connection reset."""
        self._handback.append((conn, n))
        self._wake()

    def close(self, conn: Conn, reason: str | None = None) -> None:
        """Close a connection that is not in the selector (idempotent)."""
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

    # ---- worker threads ---------------------------------------------------------------------------------
    def _work(self) -> None:
        worker, seat = Worker(self), _Seat()
        while True:
            with self._wlock:
                if self._closing_workers:
                    return
                conn = self._pending.popleft() if self._pending else None
                if conn is None:
                    self._waiting.append(seat)
            if conn is None:
                conn = seat.take()
                if conn is None:
                    return
            worker.serve(conn)

    def _hand_over(self, conn: Conn) -> None:
        """Give a connection with a complete request head to the most recently idle worker (or queue it)."""
        with self._wlock:
            seat = self._waiting.pop() if self._waiting else None
            if seat is None:
                self._pending.append(conn)
                return
        seat.give(conn)

    # ---- the selector thread ------------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (the selector is already due to wake) or closed
            pass

    def _loop(self) -> None:
        next_sweep = 0.0
        while not self._stopping:
            if not self.accepting and self._listening:
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
            if not self.accepting:
                sock.close()
                continue
            self._admit(sock, str(addr[0]))

    def _admit(self, sock: socket.socket, peer: str) -> None:
        with self._lock:
            over_peer = self._peers[peer] >= self.max_per_peer
            over_all = self._regular >= self.max_connections
        probe = False
        if over_peer or over_all:
            victim = self._idle_victim(peer) if over_peer else None
            if victim is None and over_all and not over_peer:
                victim = self._idle_victim(None)
            if victim is not None:
                self._drop(victim, "idle_evicted")
            else:
                probe = True
                with self._lock:
                    probes = len(self._conns) - self._regular
                if probes >= self.probe_slots:  # the oldest probe connection gives way
                    oldest = min((c for c in self._parked if c.probe), key=lambda c: c.idle_since, default=None)
                    if oldest is None:
                        self._refuse(sock, "refused_full")
                        return
                    self._drop(oldest, "probe_evicted")
        now = time.monotonic()
        conn = Conn(sock, peer, now, probe)
        with self._lock:
            self._conns[conn] = None
            self._peers[peer] += 1
            if not probe:
                self._regular += 1
        self._sel.register(sock, selectors.EVENT_READ, conn)
        self._parked.add(conn)
        if not probe:
            self._idle[conn] = None

    def _idle_victim(self, peer: str | None) -> Conn | None:
        """The oldest idle connection (of `peer`, when given) that is idle indeed. One whose first bytes arrived
        but were not read yet is not: it is read now (its head is arriving). One its client closed will do."""
        for conn in list(self._idle):
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
        with self._lock:
            self._closed[reason] += 1
            self._codes[503] = self._codes.get(503, 0) + 1

    def _unpark(self, conn: Conn) -> None:
        """Take a connection out of the selector and the parked/idle books (it is being closed or served)."""
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self._parked.discard(conn)
        self._idle.pop(conn, None)

    def _drop(self, conn: Conn, reason: str | None) -> None:
        """Close a parked connection."""
        self._unpark(conn)
        self.close(conn, reason)

    def _woken(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        now = time.monotonic()
        while self._handback:
            conn, n = self._handback.popleft()
            if self._stopping:
                self.close(conn)
                continue
            try:
                conn.sock.setblocking(False)
                if n:
                    conn.drain_left, conn.deadline = min(n, LINGER_BYTES), now + LINGER_S
                    conn.sock.shutdown(socket.SHUT_WR)  # the answer is on its way; nothing more will be written
                self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError, KeyError):
                self.close(conn)
                continue
            self._parked.add(conn)
            if not n and not conn.buf and not conn.probe:
                conn.idle_since = now
                self._idle[conn] = None

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
            self._idle.pop(conn, None)
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
            answer = probe_answer(self, bytes(conn.buf[start:end]), conn.probe)
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
                self._idle[conn] = None
                return

    def _dispatch(self, conn: Conn) -> None:
        self._unpark(conn)
        self._hand_over(conn)

    def _sweep(self, now: float) -> None:
        """Enforce the deadlines of parked connections: drains, request heads, idle keep-alive."""
        late: list[tuple[Conn, str]] = []
        head_by = now - self.header_timeout
        for conn in self._parked:
            if conn.drain_left:
                if now >= conn.deadline:
                    late.append((conn, "drained"))
            elif conn.first is not None:
                if conn.first <= head_by:
                    late.append((conn, "header_timeout"))
            elif conn.idle_since <= now - self.idle_timeout:
                late.append((conn, "idle_timeout"))
        for conn, reason in late:
            if reason == "header_timeout":
                try:
                    conn.sock.send(refusal(408, f"request head not complete within {self.header_timeout:g} s"))
                except OSError:
                    pass
            self._drop(conn, reason)

    def _http_metrics(self) -> list[Metric]:
        with self._lock:
            codes = sorted(self._codes.items())
            closed = sorted(self._closed.items())
            inflight, conns = self._inflight, len(self._conns)
        used, kept = self.budget.usage()
        return [
            Metric(
                "edge_agent_http_responses_total",
                "counter",
                "HTTP responses by status code.",
                [("", {"code": str(c)}, n) for c, n in codes],
            ),
            Metric("edge_agent_http_inflight_requests", "gauge", "Requests being handled.", [("", {}, inflight)]),
            Metric("edge_agent_http_open_connections", "gauge", "Open client connections.", [("", {}, conns)]),
            Metric(
                "edge_agent_http_connections_closed_total",
                "counter",
                "Connections the server closed, by reason (timeouts, evictions, refusals).",
                [("", {"reason": r}, n) for r, n in closed],
            ),
            Metric(
                "edge_agent_http_body_bytes",
                "gauge",
                "Request memory held (bodies being handled and their decoded form; read buffers kept for reuse).",
                [("", {"use": "handling"}, used), ("", {"use": "kept"}, kept)],
            ),
        ]
