"""OIPServer: the threaded HTTP/1.1 front of the registry (KServe v2 REST + /metrics), auth, limits, drain.

Authentication: with a token, every endpoint except /v2/health/live and /v2/health/ready needs
`Authorization: Bearer <token>`; the health probes stay open so that supervisors can probe without
credentials (they reveal nothing but liveness). Loopback is the default bind address.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from http.server import ThreadingHTTPServer

from agent.errors import ServingError
from agent.serving.handlers import Router
from agent.serving.metrics import Metric
from agent.serving.wire import ConnectionHandler

DEFAULT_MAX_BODY = 64 * 1024 * 1024
DEFAULT_BODY_BUDGET = 256 * 1024 * 1024  # request bodies held at once, all connections together
BUDGETED_BODY = 1024 * 1024  # bodies from this size up count against the budget (small ones cannot add up)
_BUSY_BODY = b'{"error":"too many open connections"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, handler, oip: "OIPServer"):
        self.oip = oip
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.oip._track(request):
            try:
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        self.oip._untrack(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        pass  # a broken client connection is not our failure; the stdlib would print a traceback


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
        max_connections: int = 256,
        body_budget_bytes: int = DEFAULT_BODY_BUDGET,
        collectors: Iterable[Callable[[], Iterable[Metric]]] = (),
    ):
        """body_budget_bytes bounds the memory of request bodies over all connections: bodies being read or
        served, plus the read buffers connections keep for reuse (at most a quarter of it). A large body that
        does not fit gets 503 (retry) without being read, instead of 256 connections x 64 MiB."""
        self.registry = registry
        self.token = token or None
        self.max_body_bytes = int(max_body_bytes)
        self.body_budget_bytes = max(int(body_budget_bytes), self.max_body_bytes)
        self._body_used = 0  # bytes of large bodies being handled
        self._kept = 0  # bytes of read buffers connections keep between requests
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.accepting = True
        self._lock = threading.Condition()
        self._inflight = 0
        self._conns: set[socket.socket] = set()
        self._codes: dict[int, int] = {}
        self._collectors: list[Callable[[], Iterable[Metric]]] = list(collectors)
        self._router = Router(registry, self._collectors, self._http_metrics)
        handler = type("OIPHandler", (ConnectionHandler,), {"oip": self})
        try:
            self._httpd = _HTTPServer((host, port), handler, self)
        except OSError as exc:
            raise ServingError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        self.host, self.port = self._httpd.server_address[:2]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in str(self.host) else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> "OIPServer":
        """Serve in a background thread; returns self."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name=f"oip-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def set_token(self, token: str | None) -> None:
        """Replace the bearer token at runtime (serving.token_file is reloadable); None opens the API."""
        self.token = token or None

    def add_metrics_collector(self, collect: Callable[[], Iterable[Metric]]) -> None:
        """Hook for other modules (telemetry): collect() returns Metric families added to /metrics."""
        self._collectors.append(collect)

    def shutdown(self, drain_timeout: float = 10.0) -> bool:
        """Stop accepting, let in-flight requests finish (up to drain_timeout), close every connection.
        Returns True when everything in flight finished in time."""
        with self._lock:
            self.accepting = False
        if self._thread:
            self._httpd.shutdown()
        with self._lock:
            drained = self._lock.wait_for(lambda: self._inflight == 0, drain_timeout)
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        if self._thread:
            self._thread.join(timeout=5)
        return drained

    def __enter__(self) -> "OIPServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown(drain_timeout=5.0)

    # ---- bookkeeping used by the handler --------------------------------------------------------------
    def _enter(self) -> bool:
        with self._lock:
            if not self.accepting:
                return False
            self._inflight += 1
            return True

    def _leave(self) -> None:
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                self._lock.notify_all()

    def _track(self, conn: socket.socket) -> bool:
        with self._lock:
            if len(self._conns) >= self.max_connections or not self.accepting:
                return False
            self._conns.add(conn)
            return True

    def _untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _reserve(self, n: int) -> int | None:
        """Reserve room for a body of n bytes: the bytes counted against the budget (0 for a small body, which
        always fits), or None when it does not fit."""
        if n < BUDGETED_BODY:
            return 0
        with self._lock:
            if self._body_used + self._kept + n > self.body_budget_bytes and self._body_used:
                return None
            self._body_used += n
            return n

    def _unreserve(self, n: int) -> None:
        with self._lock:
            self._body_used -= n

    def _keep_buffer(self, old: int, new: int) -> bool:
        """May a connection swap its kept buffer of `old` bytes for one of `new` bytes? (a quarter of the budget)"""
        with self._lock:
            if self._kept - old + new > self.body_budget_bytes // 4:
                return False
            self._kept += new - old
            return True

    def _drop_buffer(self, size: int) -> None:
        with self._lock:
            self._kept -= size

    def _count(self, status: int) -> None:
        with self._lock:
            self._codes[status] = self._codes.get(status, 0) + 1

    def _http_metrics(self) -> list[Metric]:
        with self._lock:
            codes = sorted(self._codes.items())
            inflight, conns, used, kept = self._inflight, len(self._conns), self._body_used, self._kept
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
                "edge_agent_http_body_bytes",
                "gauge",
                "Memory held for request bodies (being handled, kept for reuse by connections).",
                [("", {"use": "handling"}, used), ("", {"use": "kept"}, kept)],
            ),
        ]
