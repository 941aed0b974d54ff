"""HTTP/1.1 framing for the OIP server: request heads parsed from bytes, bounded body reads, one-send answers.

Connections live in two places (see server.py). While they wait for a request they sit in the server's
selector thread, which reads request heads without a thread per connection (a slow or idle crowd costs
file descriptors, not threads) and answers the health probes itself. A complete head goes to a Worker,
which reads the body against the request deadline and the memory budget, answers in one send, and keeps
the connection while its client sends the next request soon (the keep-alive fast path: up to HOLD_MS, as
long as no other request waits for a worker), so that a busy keep-alive client costs one thread wake-up per
request, not a hand-over from the selector.
Expect: 100-continue is answered only once the request passed its size, budget and token checks; chunked
bodies are refused (411); a length header that is not plain ASCII digits is a 400 and closes the connection.
"""

from __future__ import annotations

import ctypes
import select
import socket
import time
import zlib
from http import HTTPStatus
from typing import TYPE_CHECKING, NamedTuple

import agent
from agent.serving.budget import Ledger
from agent.serving.compress import compress
from agent.serving.errors import BadRequest, PayloadTooLarge, RequestTimeout
from agent.serving.handlers import Response, error_for, error_response, header_length

if TYPE_CHECKING:
    from agent.serving.server import OIPServer

KEEP_BUFFER_BYTES = 16 * 1024 * 1024  # larger bodies get a buffer of their own, dropped after the request
MAX_LINE = 16 * 1024
MAX_HEADERS = 100
MAX_HEAD = 64 * 1024  # request line and headers together
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")
# POSTs that may come without a body and without Content-Length (tritonclient.http sends unload, unregister
# and the like so): none means an empty body (RFC 9112 6.3); infer requests still need one (411)
NO_BODY_POSTS = ("/v2/repository/", "/v2/systemsharedmemory/", "/v2/cudasharedmemory/", "/v2/trace/", "/v2/logging")
PHRASES = {s.value: s.phrase for s in HTTPStatus}
SERVER = f"edge-agent/{agent.__version__}"
ALIGN = 64  # binary tensors start on a cache line
MAX_IOV = 512  # buffers per sendmsg (Linux allows 1024)
LINGER_BYTES = 64 * 1024 * 1024  # of a refused body, discarded so that its client can read the answer ...
LINGER_S = 5.0  # ... within this time
FAST_WAIT_MS = 5  # a worker waits for the next request on its connection in slices of this ...
HOLD_MS = 100  # ... up to this long, unless other requests wait for a worker, then parks the connection
INFLATE_STEP = 1024 * 1024  # decompressed in steps of this size, each counted against the budget first
RECV_BYTES = 65536
HEAD_RECV_BYTES = 8192  # the first read of a request on the keep-alive fast path


def _address(buf: bytearray) -> int:
    """Address of a writable buffer's first byte (for alignment)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


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


def render(resp: Response, close: bool, head_only: bool = False) -> tuple[list, int]:
    """(buffers to send, total bytes) for a response; head_only for HEAD (same headers, no body)."""
    parts, length = resp.buffers()
    extra = "".join(f"{k}: {v}\r\n" for k, v in resp.headers.items()) if resp.headers else ""
    if resp.status == 401:
        extra += 'WWW-Authenticate: Bearer realm="edge-agent"\r\n'
    if close:
        extra += "Connection: close\r\n"
    head = (
        f"HTTP/1.1 {resp.status} {PHRASES.get(resp.status, 'Error')}\r\nServer: {SERVER}\r\n"
        f"Content-Type: {resp.content_type}\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode("latin-1")
    if head_only:
        return [head], len(head)
    return [head, *parts], len(head) + length


def probe_answer(oip: OIPServer, block: bytes, close: bool = False) -> tuple[list, int, bool] | None:
    """The answer to a health probe (GET or HEAD of an OPEN_PATHS path, no body), made without a worker;
    None for any other request (a worker answers it)."""
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
        resp = oip.router.route("GET", head.target, b"", None, oip.accepting)
    except Exception as exc:  # noqa: BLE001 - answered like any other failure
        resp = error_for(exc)
    oip.count(resp.status)
    close = close or head.close
    parts, total = render(resp, close, head.method == "HEAD")
    return parts, total, close


def refusal(status: int, message: str) -> bytes:
    """A complete close-the-connection answer (for the selector thread: one non-blocking send)."""
    parts, _ = render(error_response(status, message), close=True)
    return b"".join(parts)


class _Refused(Exception):
    """The request was answered before its body was read: `unread` body bytes remain on the wire."""


class Worker:
    """Serves connections handed over by the server: one request after another while they keep coming."""

    def __init__(self, oip: OIPServer):
        self.oip = oip
        self._started = False

    def serve(self, conn: Conn) -> None:
        """Answer the requests on conn (its buffer holds a complete head), then park it, drain it or close it."""
        oip, sock = self.oip, conn.sock
        try:
            sock.settimeout(oip.request_timeout)
            while True:
                found = head_end(conn.buf)
                if found is None:
                    if len(conn.buf) > MAX_HEAD:
                        self._send(conn, error_response(431, f"request head over {MAX_HEAD} bytes"), True)
                        oip.close(conn)
                        return
                    if not self._more(conn):
                        oip.park(conn)  # the selector watches it (and its header deadline) from here
                        return
                    continue
                drain = self._one(conn, found)
                if drain is not None:
                    if drain:
                        oip.drain(conn, drain)
                    else:
                        oip.close(conn)
                    return
        except OSError:  # client went away, or a send timed out
            oip.close(conn)

    def _more(self, conn: Conn) -> bool:
        """Wait up to HOLD_MS for more bytes of the next request (less when other requests wait for a worker);
        False when none came (or the header deadline passed, which the selector then enforces)."""
        sock = conn.sock
        if conn.first is not None and time.monotonic() >= conn.first + self.oip.header_timeout:
            return False
        poller = conn.poller
        if poller is None:
            poller = conn.poller = select.poll()
            poller.register(sock, select.POLLIN)
        waited = 0
        while not poller.poll(FAST_WAIT_MS):  # in slices: give the connection up as soon as others wait
            waited += FAST_WAIT_MS
            if waited >= HOLD_MS or self.oip.backlog():
                return False
        if conn.buf:  # more of a head that is still arriving
            data = sock.recv(RECV_BYTES)
            if not data:
                raise ConnectionResetError("client closed")
            conn.buf += data
            return True
        # a new request: its head lands in a small buffer (no large copies of the body on the way to its
        # aligned buffer, where the rest of it is received directly)
        buf = bytearray(HEAD_RECV_BYTES)
        k = sock.recv_into(buf)
        if not k:
            raise ConnectionResetError("client closed")
        del buf[k:]
        conn.buf, conn.first = buf, time.monotonic()
        return True

    def _one(self, conn: Conn, found: tuple[int, int, int]) -> int | None:
        """Answer one request. None: keep the connection; 0: close it; n > 0: discard n body bytes, then close."""
        oip = self.oip
        start, end, nxt = found  # conn.buf[:nxt] is consumed along with the body (one move of the buffer)
        began = conn.first if conn.first is not None else time.monotonic()
        try:
            head = parse_head(bytes(conn.buf[start:end]))
            n = content_length(head)
        except Framing as exc:  # unframed: whatever follows is discarded (never read as a request), then close
            self._send(conn, error_response(exc.status, str(exc)), True)
            return LINGER_BYTES
        if conn.probe and head.target.split("?", 1)[0] not in OPEN_PATHS:
            self._send(conn, error_response(503, "too many open connections"), True)
            return self._unread(conn, nxt, n)
        if not oip.begin():
            self._send(conn, error_response(503, "server is shutting down"), True)
            return self._unread(conn, nxt, n)
        ledger = Ledger(oip.budget)
        close, read = head.close or conn.probe, False
        self._started = False  # _read took the head and the buffered part of the body off conn.buf
        try:
            try:
                raw_len = head.headers.get("inference-header-content-length")
                try:
                    hlen = header_length(raw_len)
                except BadRequest:
                    close = True  # a length header that lies about its digits: nothing after it is trusted
                    raise
                self._authorize(head, conn.peer)
                if n > oip.max_body_bytes:
                    raise PayloadTooLarge(f"request body of {n} bytes exceeds the limit of {oip.max_body_bytes} bytes")
                ledger.charge(n, "the request body")
                if head.headers.get("expect", "").lower() == "100-continue" and len(conn.buf) - nxt < n:
                    conn.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = self._read(conn, nxt, n, hlen or 0, began + oip.request_timeout)
                read = True
                body = self._inflate(body, head, ledger)
                resp = oip.router.route(head.method, head.target, body, hlen, oip.accepting, ledger.charge, ledger.hold)
            except Exception as exc:  # noqa: BLE001 - a ServingError, or a bug: answered, and we keep serving
                resp = error_for(exc)
            left = 0 if read or self._started else self._unread(conn, nxt, n)
            close = close or (not read and n > 0)  # refused before its body was read: the connection ends
            accept = head.headers.get("accept-encoding")
            if accept and resp.status == 200:
                resp = compress(resp, accept, ledger)
            self._send(conn, resp, close, head.method == "HEAD")
            conn.first = time.monotonic() if conn.buf else None  # a pipelined request's bytes are already here
        finally:
            ledger.close()
            oip.end()
        if left:
            return left
        return 0 if close else None

    @staticmethod
    def _unread(conn: Conn, skip: int, n: int) -> int:
        """Drop the head (skip bytes) and the part of an unread body that is already buffered; the bytes of
        the body still on the wire."""
        have = min(len(conn.buf) - skip, n)
        del conn.buf[: skip + have]
        return n - have

    def _authorize(self, head: Head, peer: str) -> None:
        auth = self.oip.plane.auth
        if auth.token is None or head.target.split("?", 1)[0] in OPEN_PATHS:
            return
        scheme, _, cred = head.headers.get("authorization", "").strip().partition(" ")
        auth.check(peer, cred.strip() if scheme.lower() == "bearer" else None, "http")

    def _read(self, conn: Conn, skip: int, n: int, align_at: int, deadline: float) -> memoryview | bytes:
        """Read the n body bytes that follow the head (skip bytes of conn.buf) into the connection's buffer,
        placed so that byte align_at (where the binary tensors start) is 64-byte aligned: ONNX Runtime copies
        misaligned inputs before running."""
        if not n:
            del conn.buf[:skip]
            return b""
        if n + ALIGN > len(conn.body):
            buf = bytearray(n + ALIGN)
            if n + ALIGN <= KEEP_BUFFER_BYTES and self.oip.budget.keep(len(conn.body), len(buf)):
                conn.body, conn.body_at = buf, _address(buf)
            pad = (-(_address(buf) + align_at)) % ALIGN
        else:
            buf, pad = conn.body, (-(conn.body_at + align_at)) % ALIGN
        view = memoryview(buf)[pad : pad + n]
        got = min(len(conn.buf) - skip, n)
        if got:
            with memoryview(conn.buf) as pending:
                view[:got] = pending[skip : skip + got]
        del conn.buf[: skip + got]
        self._started = True
        if got == n:
            return view
        sock = conn.sock
        timeout = 0.0
        try:
            while got < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeout(f"request body incomplete after {self.oip.request_timeout:g} s")
                if not timeout or left < timeout / 2:  # few timeout changes (a syscall each), none overshooting 2x
                    timeout = left
                    sock.settimeout(left)
                k = sock.recv_into(view[got:])
                if not k:
                    raise BadRequest(f"request body ended after {got} of {n} bytes")
                got += k
        except TimeoutError:
            raise RequestTimeout(f"request body incomplete after {self.oip.request_timeout:g} s") from None
        finally:
            sock.settimeout(self.oip.request_timeout)
        return view

    def _inflate(self, body: memoryview | bytes, head: Head, ledger: Ledger) -> memoryview | bytes:
        """Decompress a gzip/deflate body in INFLATE_STEP steps, each counted against the budget before it is
        held; the decompressed size is bounded by the body limit."""
        enc = head.headers.get("content-encoding", "identity").strip().lower()
        if enc == "identity":
            return body
        if enc not in ("gzip", "deflate"):
            raise BadRequest(f"unsupported Content-Encoding {enc[:20]!r}; use gzip, deflate or none")
        limit = self.oip.max_body_bytes
        d = zlib.decompressobj(zlib.MAX_WBITS | 16 if enc == "gzip" else zlib.MAX_WBITS)
        out, data = bytearray(), body
        try:
            while True:
                chunk = d.decompress(data, INFLATE_STEP)
                data = d.unconsumed_tail
                if len(out) + len(chunk) > limit:
                    raise PayloadTooLarge(f"decompressed request body exceeds the limit of {limit} bytes")
                ledger.charge(len(chunk), "the decompressed request body")
                out += chunk
                if d.eof or not (chunk or data):
                    break
        except zlib.error as exc:
            raise BadRequest(f"body is not valid {enc}: {exc}") from None
        if not d.eof:
            raise BadRequest(f"body is not valid {enc}: truncated stream")
        return memoryview(out)

    def _send(self, conn: Conn, resp: Response, close: bool, head_only: bool = False) -> None:
        self.oip.count(resp.status)
        parts, total = render(resp, close, head_only)
        send_all(conn.sock, parts, total)


def send_all(sock: socket.socket, parts: list, total: int) -> None:
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
