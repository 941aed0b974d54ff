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

import resource
import socket
import threading
from collections.abc import Callable, Iterable

from agent.errors import ServingError
from agent.serving.budget import BodyBudget
from agent.serving.dataplane import DataPlane
from agent.serving.http.connbook import ConnBook
from agent.serving.http.handlers import Router
from agent.serving.http.pool import WorkerPool
from agent.serving.http.selector import ConnLimits, Selector
from agent.serving.http.wire import Conn
from agent.serving.http.worker import Worker
from agent.serving.metrics import Metric
from agent.serving.registry import ModelRegistry

DEFAULT_MAX_BODY = 64 * 1024 * 1024
DEFAULT_BODY_BUDGET = 256 * 1024 * 1024  # request memory (bodies as received, inflated, decoded) at once
MEMORY_MAX_SHARE = 4  # the budget is at most a quarter of serving.memory_max


def body_budget_for(memory_max: int | None) -> int:
    """The request memory budget of a process bounded by `memory_max` (serving.memory_max, resolved): a quarter
    of it, never over DEFAULT_BODY_BUDGET nor under the body limit. What requests in flight hold can reach about
    twice their budget (the outputs they cause are held, never refused); the daemon's peak RSS with 4 JSON
    amplification requests at once was 550 MiB with the 256 MiB budget (bench/bench_amplification_daemon.py)."""
    if not memory_max:
        return DEFAULT_BODY_BUDGET
    return max(DEFAULT_MAX_BODY, min(DEFAULT_BODY_BUDGET, int(memory_max) // MEMORY_MAX_SHARE))


def _fd_room(reserve: int = 64) -> int:
    """File descriptors this process may still open for connections (RLIMIT_NOFILE soft limit less a reserve)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, (soft if soft != resource.RLIM_INFINITY else 1 << 20) - reserve)


class OIPServer:
    """KServe v2 REST server over a ModelRegistry. port=0 picks a free port (see .port); `collectors`
    (or add_metrics_collector) add Metric families to /metrics; shutdown(drain_timeout) drains.
    It composes the connection books (connbook.py), the selector thread (selector.py) and the worker pool
    (workers.py, http/worker.py), and is what a worker sees of the server (http/worker.Host)."""

    def __init__(
        self,
        registry: ModelRegistry,
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
        shm_in_place: bool = False,
    ):
        """body_budget_bytes bounds the memory requests occupy over all connections: bodies as received,
        inflated and decoded, plus the read buffers connections keep for reuse (at most a quarter of it).
        A request that cannot fit even alone gets 413 naming the limit; one that does not fit now gets 503.
        plane: the data plane shared with other front ends (gRPC); by default one of its own (token, budget,
        shm_in_place: shared-memory regions mapped and used in place, serving.shm_in_place)."""
        self.registry = registry
        self.max_body_bytes = int(max_body_bytes)
        if plane is None:
            budget = BodyBudget(max(int(body_budget_bytes), self.max_body_bytes))
            plane = DataPlane(
                registry, token=token, budget=budget, max_body_bytes=self.max_body_bytes, shm_in_place=shm_in_place
            )
        self.plane = plane
        self.budget = plane.budget
        self.request_timeout = float(request_timeout)
        self.header_timeout = min(float(header_timeout), self.request_timeout)
        self.idle_timeout = float(idle_timeout)
        self.probe_slots = max(1, int(probe_slots))
        self.max_connections = max(1, min(int(max_connections), _fd_room() - self.probe_slots))
        self.max_per_peer = max(1, int(max_per_peer))
        self._book = ConnBook(self.budget)
        self._collectors = plane.collectors
        self._collectors.extend(collectors)
        plane.transport_metrics.append(self._http_metrics)
        self.router = Router(plane)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            listener = socket.create_server((host, port), family=family, backlog=1024)
        except OSError as exc:
            raise ServingError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        listener.setblocking(False)
        self.host, self.port = listener.getsockname()[:2]
        self._pool = WorkerPool(workers, f"oip-{self.port}")
        limits = ConnLimits(
            self.header_timeout, self.idle_timeout, self.max_connections, self.max_per_peer, self.probe_slots
        )
        self._selector = Selector(listener, self._book, limits, self.router, self._pool.hand_over)
        self._loop: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in str(self.host) else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> OIPServer:
        """Serve in background threads (the selector and the workers); returns self."""
        self._loop = threading.Thread(target=self._selector.run, name=f"oip-{self.port}", daemon=True)
        self._loop.start()
        self._pool.start(lambda: Worker(self).serve)
        return self

    @property
    def accepting(self) -> bool:
        """False from the start of shutdown."""
        return self._book.accepting

    @property
    def open_connections(self) -> int:
        """Client connections open now (probe slots included)."""
        return self._book.open()

    @property
    def idle_connections(self) -> int:
        """Keep-alive connections waiting for a request with nothing of it received (closed first at a cap)."""
        return len(self._selector.idle)

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
        self._book.stop_accepting()
        self.plane.accepting = False
        self._selector.wake()
        drained = self._book.drained(drain_timeout)
        self._selector.stopping = True
        self._selector.wake()
        if self._loop is not None:
            self._loop.join(timeout=5)
        self._selector.close_listener()
        self._book.shut()
        self._pool.stop(timeout=5)
        self._selector.close()
        return drained

    def __enter__(self) -> OIPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown(drain_timeout=5.0)

    # ---- what workers see of the server (http/worker.Host) ---------------------------------------------
    def begin(self) -> bool:
        """A request starts being handled; False while shutting down."""
        return self._book.begin()

    def end(self) -> None:
        self._book.end()

    def count(self, status: int) -> None:
        """Count one response by status code (edge_agent_http_responses_total)."""
        self._book.count(status)

    def backlog(self) -> bool:
        """Do requests wait for a worker?"""
        return self._pool.backlog()

    def park(self, conn: Conn) -> None:
        """Hand a connection back to the selector to wait for its next request."""
        self._selector.hand_back(conn, 0)

    def drain(self, conn: Conn, n: int) -> None:
        """Hand a connection back to discard the n body bytes of a refused request, then close it (LINGER_S):
        its client, likely still sending, then reads the answer instead of a connection reset."""
        self._selector.hand_back(conn, n)

    def close(self, conn: Conn, reason: str | None = None) -> None:
        """Close a connection that is not in the selector (idempotent)."""
        self._book.close(conn, reason)

    def _http_metrics(self) -> list[Metric]:
        codes, closed, inflight, conns = self._book.snapshot()
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
