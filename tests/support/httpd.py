"""A small real HTTP server on a free loopback port (a webhook receiver, a hostile answerer) for the tests."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing; `answer` sends a whole response."""

    def log_message(self, *a):
        pass

    def answer(self, status: int, body: bytes = b"") -> None:
        """`status` with `body` (its Content-Length set); a client that stops reading mid-body is no error here."""
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            try:
                self.wfile.write(body)
            except OSError:
                pass  # the client stops reading after its bound


class LoopbackHTTP:
    """`handler` served by a ThreadingHTTPServer on 127.0.0.1 (a free port) in a daemon thread; `url`: its base URL
    with `path`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], path: str = "/"):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
