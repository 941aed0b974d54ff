"""OIPServer: the threaded HTTP/1.1 front of the registry (KServe v2 REST + /metrics), auth, limits, drain.

Authentication: with a token, every endpoint except /v2/health/live and /v2/health/ready needs
`Authorization: Bearer <token>`; the health probes stay open so that supervisors can probe without
credentials (they reveal nothing but liveness). Loopback is the default bind address.
"""
from __future__ import annotations

import hmac
import socket
import threading
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable

import agent
from agent.errors import ServingError
from agent.serving.errors import (BadRequest, LengthRequired, ModelUnavailable, PayloadTooLarge, Unauthorized,
                                  status_of)
from agent.serving.handlers import Response, Router, error_response, header_length
from agent.serving.metrics import Metric

DEFAULT_MAX_BODY = 64 * 1024 * 1024
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")
_PHRASES = {s.value: s.phrase for s in HTTPStatus}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # FACTS: otherwise ~40 ms stalls per keep-alive request
    server_version = f"edge-agent/{agent.__version__}"
    oip: "OIPServer"  # set on the subclass made per server

    def setup(self) -> None:
        self.timeout = self.oip.request_timeout  # idle keep-alive connections end after this
        super().setup()

    def log_message(self, format, *args) -> None:  # noqa: A002 - library code never prints
        pass

    def send_error(self, code, message=None, explain=None) -> None:
        """Errors raised by the stdlib parser (bad request line, huge headers...) answered as JSON, never 5xx."""
        if code >= 500:
            code = 405 if code == 501 else 400
        self.close_connection = True
        self._write(error_response(code, message or _PHRASES.get(code, "bad request")))

    def _write(self, resp: Response) -> None:
        self.oip._count(resp.status)
        head = [f"HTTP/1.1 {resp.status} {_PHRASES.get(resp.status, 'Error')}", f"Server: {self.server_version}",
                f"Content-Type: {resp.content_type}", f"Content-Length: {len(resp.body)}"]
        head += [f"{k}: {v}" for k, v in resp.headers.items()]
        if resp.status == 401:
            head.append('WWW-Authenticate: Bearer realm="edge-agent"')
        if self.close_connection:
            head.append("Connection: close")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + resp.body)

    def _dispatch(self, method: str) -> None:
        oip = self.oip
        if not oip._enter():
            self.close_connection = True
            self._drain_body_quietly()
            self._write(error_response(503, "server is shutting down"))
            return
        try:
            try:
                body = self._body(method)
                self._authorize()
                resp = oip._router.route(method, self.path, body, header_length(self.headers.get("Inference-Header-Content-Length")),
                                         oip.accepting)
            except ServingError as exc:
                resp = error_response(status_of(exc), str(exc))
            except Exception as exc:  # noqa: BLE001 - a bug: answer 500, keep serving
                resp = error_response(500, f"internal error: {type(exc).__name__}: {exc}")
            self._write(resp)
        finally:
            oip._leave()

    def _authorize(self) -> None:
        token = self.oip.token
        if token is None or self.path.split("?", 1)[0] in OPEN_PATHS:
            return
        got = self.headers.get("Authorization", "")
        if not hmac.compare_digest(got.encode("utf-8", "replace"), f"Bearer {token}".encode()):
            raise Unauthorized("missing or wrong bearer token (send 'Authorization: Bearer <token>')")

    def _length(self) -> int:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise LengthRequired("chunked request bodies are not supported; send Content-Length")
        raw = self.headers.get("Content-Length")
        if raw is None:
            return -1
        try:
            n = int(raw)
        except ValueError:
            n = -2
        if n < 0:
            self.close_connection = True
            raise BadRequest(f"invalid Content-Length {raw!r}")
        return n

    def _body(self, method: str) -> bytes:
        n = self._length()
        if n == -1:
            if method == "POST":
                self.close_connection = True
                raise LengthRequired("POST needs a Content-Length header")
            return b""
        if n > self.oip.max_body_bytes:
            self.close_connection = True  # the body is not read: the connection cannot be reused
            raise PayloadTooLarge(f"request body of {n} bytes exceeds the limit of {self.oip.max_body_bytes} bytes")
        body = self.rfile.read(n) if n else b""
        if len(body) != n:
            self.close_connection = True
            raise BadRequest(f"request body ended after {len(body)} of {n} bytes")
        return self._decompress(body)

    def _decompress(self, body: bytes) -> bytes:
        enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if enc == "identity":
            return body
        if enc not in ("gzip", "deflate"):
            raise BadRequest(f"unsupported Content-Encoding {enc!r}; use gzip, deflate or none")
        limit = self.oip.max_body_bytes
        d = zlib.decompressobj(zlib.MAX_WBITS | 16 if enc == "gzip" else zlib.MAX_WBITS)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error as exc:
            raise BadRequest(f"body is not valid {enc}: {exc}") from None
        if len(out) > limit or d.unconsumed_tail:
            raise PayloadTooLarge(f"decompressed request body exceeds the limit of {limit} bytes")
        if not d.eof:
            raise BadRequest(f"body is not valid {enc}: truncated stream")
        return out

    def _drain_body_quietly(self) -> None:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return
        if 0 < n <= self.oip.max_body_bytes:
            self.rfile.read(n)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_HEAD(self) -> None:
        self.close_connection = True  # our answer has a body; do not leave the client misframed
        self._dispatch("HEAD")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, handler, oip: "OIPServer"):
        self.oip = oip
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.oip._track(request):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Content-Length: 36\r\nConnection: close\r\n\r\n{\"error\":\"too many open connections\"}")
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
    """KServe v2 REST server over a ModelRegistry. port=0 picks a free port (see .port)."""

    def __init__(self, registry, host: str = "127.0.0.1", port: int = 8080, token: str | None = None, *,
                 max_body_bytes: int = DEFAULT_MAX_BODY, request_timeout: float = 60.0, max_connections: int = 256):
        self.registry = registry
        self.token = token or None
        self.max_body_bytes = int(max_body_bytes)
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.accepting = True
        self._lock = threading.Condition()
        self._inflight = 0
        self._conns: set[socket.socket] = set()
        self._codes: dict[int, int] = {}
        self._collectors: list[Callable[[], Iterable[Metric]]] = []
        self._router = Router(registry, self._collectors, self._http_metrics)
        handler = type("OIPHandler", (_Handler,), {"oip": self})
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
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"oip-{self.port}", daemon=True)
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

    def _count(self, status: int) -> None:
        with self._lock:
            self._codes[status] = self._codes.get(status, 0) + 1

    def _http_metrics(self) -> list[Metric]:
        with self._lock:
            codes = sorted(self._codes.items())
            inflight, conns = self._inflight, len(self._conns)
        return [
            Metric("edge_agent_http_responses_total", "counter", "HTTP responses by status code.",
                   [("", {"code": str(c)}, n) for c, n in codes]),
            Metric("edge_agent_http_inflight_requests", "gauge", "Requests being handled.", [("", {}, inflight)]),
            Metric("edge_agent_http_open_connections", "gauge", "Open client connections.", [("", {}, conns)]),
        ]
