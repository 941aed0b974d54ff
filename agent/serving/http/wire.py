"""HTTP/1.1 framing for the OIP server: request heads parsed from bytes, response heads rendered, one-send answers.

Connections live in two places (see server.py): while they wait for a request they sit in the selector thread
(selector.py), which reads request heads and answers the health probes itself; a complete head goes to a worker
(http/worker.py), which reads the body and answers. Both frame requests and answers with what is here.
A length header that is not plain ASCII digits is a 400 and closes the connection; chunked bodies are refused (411).
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Any, NamedTuple

import agent
from agent.serving.http.handlers import Response, Router, error_for, error_response

MAX_LINE = 16 * 1024
MAX_HEADERS = 100
MAX_HEAD = 64 * 1024  # request line and headers together
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")
# POSTs that may come without a body and without Content-Length (tritonclient.http sends unload, unregister
# and the like so): none means an empty body (RFC 9112 6.3); infer requests still need one (411)
NO_BODY_POSTS = ("/v2/repository/", "/v2/systemsharedmemory/", "/v2/cudasharedmemory/", "/v2/trace/", "/v2/logging")
PHRASES = {s.value: s.phrase for s in HTTPStatus}
SERVER = f"edge-agent/{agent.__version__}"
MAX_IOV = 512  # buffers per sendmsg (Linux allows 1024)
LINGER_BYTES = 64 * 1024 * 1024  # of a refused body, discarded so that its client can read the answer ...
LINGER_S = 5.0  # ... within this time
RECV_BYTES = 65536


class Framing(Exception):
    """The request cannot be framed: answer with `status`, then close the connection."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Head(NamedTuple):
    """A parsed request line and headers (names lower-cased)."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    close: bool  # the client asked for the connection to close after this request


class Conn:
    """One client connection and the bytes received from it that no request has consumed yet."""

    __slots__ = (
        "sock",
        "peer",
        "buf",
        "first",
        "idle_since",
        "probe",
        "drain_left",
        "deadline",
        "body",
        "body_at",
        "poller",
    )

    def __init__(self, sock: socket.socket, peer: str, now: float, probe: bool = False):
        self.sock = sock
        self.peer = peer
        self.buf = bytearray()
        self.first: float | None = None  # when the first byte of the pending request arrived
        self.idle_since = now
        self.probe = probe  # admitted over the connection cap: health probes only
        self.drain_left = 0  # > 0: a refused body being discarded before the close
        self.deadline = 0.0  # of the drain
        self.body = bytearray()  # reused for every body on this connection (counted as kept in the budget)
        self.body_at = 0  # its address, for alignment
        self.poller: select.poll | None = None  # a worker's wait for the next request


def head_end(buf: bytes | bytearray) -> tuple[int, int, int] | None:
    """(start, end, next) of a complete request head in buf: stray CRLFs before it skipped (RFC 9112 2.2),
    the head is buf[start:end] and the body starts at next; None while incomplete."""
    start, n = 0, len(buf)
    while start < n and buf[start] in b"\r\n":
        start += 1
    end = buf.find(b"\r\n\r\n", start)
    bare = buf.find(b"\n\n", start, end if end >= 0 else n)
    if bare >= 0:
        return start, bare, bare + 2
    if end >= 0:
        return start, end, end + 4
    return None


def parse_head(block: bytes) -> Head:
    """Parse a request head (without its blank line); Framing for anything malformed."""
    text = block.decode("latin-1")
    lines = text.split("\r\n")
    if "\n" in text and text.count("\n") != len(lines) - 1:  # bare LF line ends too (RFC 9112 2.2 allows them)
        lines = [ln.rstrip("\r") for ln in text.split("\n")]
    line = lines[0]
    if len(line) > MAX_LINE:
        raise Framing(414, "request line too long")
    if len(lines) - 1 > MAX_HEADERS:
        raise Framing(431, f"more than {MAX_HEADERS} header lines")
    parts = line.split()
    if len(parts) != 3 or not parts[1].startswith("/"):
        raise Framing(400, f"malformed request line {line[:80].strip()!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise Framing(400, f"unsupported protocol {version[:20]!r}; use HTTP/1.1")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        if len(raw) > MAX_LINE:
            raise Framing(431, "header line too long")
        _header(headers, raw)
    conn = headers.get("connection", "").lower()
    close = conn == "close" or (version == "HTTP/1.0" and conn != "keep-alive")
    return Head(method, target, version, headers, close)


def _header(headers: dict[str, str], line: str) -> None:
    key, sep, value = line.partition(":")
    key = key.strip().lower()
    if not sep or not key or " " in key or "\t" in key:
        raise Framing(400, f"malformed header line {line[:80].strip()!r}")
    value = value.strip()
    if key in ("content-length", "inference-header-content-length") and headers.get(key, value) != value:
        raise Framing(400, f"conflicting {key.title()} headers")
    headers[key] = value


def content_length(head: Head) -> int:
    """The body length; Framing (the connection cannot be reused) unless it is plain ASCII digits."""
    if "transfer-encoding" in head.headers:
        raise Framing(411, "chunked request bodies are not supported; send Content-Length")
    raw = head.headers.get("content-length")
    if raw is None:
        if head.method == "POST" and not head.target.startswith(NO_BODY_POSTS):
            raise Framing(411, "POST needs a Content-Length header")
        return 0
    if not (raw.isascii() and raw.isdigit()):
        raise Framing(400, f"invalid Content-Length {raw[:20]!r}: plain ASCII digits only")
    if len(raw) > 18:
        raise Framing(413, f"Content-Length {raw[:20]} is beyond any limit")
    return int(raw)


def render(resp: Response, close: bool, head_only: bool = False) -> tuple[list[Any], int]:
    """(buffers to send, total bytes) for a response; head_only for HEAD (same headers, no body)."""
    parts, length = resp.buffers()
    extra = "".join(f"{k}: {v}\r\n" for k, v in resp.headers.items()) if resp.headers else ""
    if resp.status == 401:
        extra += 'WWW-Authenticate: Bearer realm="edge-agent"\r\n'
    if close:
        extra += "Connection: close\r\n"
    size = "Transfer-Encoding: chunked" if resp.stream is not None else f"Content-Length: {length}"
    head = (
        f"HTTP/1.1 {resp.status} {PHRASES.get(resp.status, 'Error')}\r\nServer: {SERVER}\r\n"
        f"Content-Type: {resp.content_type}\r\n{size}\r\n{extra}\r\n"
    ).encode("latin-1")
    if head_only:
        return [head], len(head)
    return [head, *parts], len(head) + length


def probe_answer(
    router: Router, accepting: bool, count: Callable[[int], None], block: bytes, close: bool = False
) -> tuple[list[Any], int, bool] | None:
    """The answer to a health probe (GET or HEAD of an OPEN_PATHS path, no body), made without a worker (counted
    by its status); None for any other request (a worker answers it)."""
    try:
        head = parse_head(block)
    except Framing:
        return None
    h = head.headers
    if head.method not in ("GET", "HEAD") or head.target.split("?", 1)[0] not in OPEN_PATHS:
        return None
    if "transfer-encoding" in h or h.get("content-length", "0") != "0":
        return None
    try:
        resp = router.route("GET", head.target, b"", None, accepting)
    except Exception as exc:  # noqa: BLE001 - answered like any other failure
        resp = error_for(exc)
    count(resp.status)
    close = close or head.close
    parts, total = render(resp, close, head.method == "HEAD")
    return parts, total, close


def refusal(status: int, message: str) -> bytes:
    """A complete close-the-connection answer (for the selector thread: one non-blocking send)."""
    parts, _ = render(error_response(status, message), close=True)
    return b"".join(parts)


def send_stream(sock: socket.socket, stream: Iterator[bytes]) -> None:
    """Send a streamed body as HTTP/1.1 chunks as it comes; a client that went away (a failed send) closes the
    stream, which ends whatever produces it (a generation frees its KV budget), and the error goes on up."""
    try:
        for piece in stream:
            if piece:
                sock.sendall(b"%x\r\n%b\r\n" % (len(piece), piece))
        sock.sendall(b"0\r\n\r\n")
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def send_all(sock: socket.socket, parts: list[Any], total: int) -> None:
    """Send buffers in order with one sendmsg (one segment when they fit: no Nagle/delayed-ACK interplay, and
    no copy to glue them together); a partial send goes on from where it stopped."""
    if len(parts) > MAX_IOV:
        parts = [b"".join(parts)]
    sent = sock.sendmsg(parts)
    if sent >= total:
        return
    for part in parts:
        view = memoryview(part)
        if sent >= view.nbytes:
            sent -= view.nbytes
            continue
        view = view.cast("B")
        sock.sendall(view[sent:])
        sent = 0
