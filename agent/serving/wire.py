"""HTTP/1.1 framing for the OIP server: a lean request parser, bounded body reads, one-send responses.

The stdlib BaseHTTPRequestHandler parses headers through the email package (tens of microseconds per
request) and answers some client mistakes with 5xx; this parser does neither. Keep-alive is the default,
Expect: 100-continue is honoured (curl sends it for bodies over 1 KB), chunked bodies are refused (411).
"""

from __future__ import annotations

import ctypes
import hmac
import socket
import socketserver
import time
import zlib
from http import HTTPStatus

import agent
from agent.errors import ServingError
from agent.serving.errors import BadRequest, LengthRequired, PayloadTooLarge, ServerBusy, Unauthorized, status_of
from agent.serving.handlers import Response, error_response, header_length

KEEP_BUFFER_BYTES = 16 * 1024 * 1024  # larger bodies get a buffer of their own, dropped after the request
MAX_LINE = 16 * 1024
MAX_HEADERS = 100
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")
PHRASES = {s.value: s.phrase for s in HTTPStatus}
SERVER = f"edge-agent/{agent.__version__}"
ALIGN = 64  # binary tensors start on a cache line
MAX_IOV = 512  # buffers per sendmsg (Linux allows 1024)
LINGER_BYTES = 64 * 1024 * 1024  # of a refused body, discarded so that its client can read the answer ...
LINGER_S = 5.0  # ... within this time


def _address(buf: bytearray) -> int:
    """Address of a writable buffer's first byte (for alignment)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class _Framing(Exception):
    """The request cannot be framed: answer, then close the connection."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ConnectionHandler(socketserver.StreamRequestHandler):
    """One client connection: requests in a keep-alive loop until close, timeout or a framing error."""

    disable_nagle_algorithm = True  # FACTS: otherwise ~40 ms stalls per keep-alive request
    oip = None  # the OIPServer, set on the subclass made per server

    def setup(self) -> None:
        self.timeout = self.oip.request_timeout  # idle keep-alive connections end after this
        super().setup()
        self._buf = bytearray()  # reused for every body on this connection: no per-request allocation
        self._addr = 0
        self._reserved = 0  # bytes of the body being handled, counted against the server's budget
        self._unread = 0  # bytes of a refused request's body left on the wire
        self.close_connection = False

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self._buf:
                self.oip._drop_buffer(len(self._buf))
                self._buf = bytearray()

    def handle(self) -> None:
        try:
            while not self.close_connection:
                self._one()
        except OSError:  # client went away or idle timeout: nothing to answer
            pass

    def _one(self) -> None:
        try:
            request = self._head()
        except _Framing as exc:
            self.close_connection = True
            self._write(error_response(exc.status, str(exc)))
            return
        if request is None:
            self.close_connection = True
            return
        self._unread = 0
        self._dispatch(*request)
        if self._unread:
            self._linger(self._unread)

    def _linger(self, n: int) -> None:
        """A refused request's body (413, 503) was not read, and the client is likely still sending it: after the
        answer, take up to n bytes off the wire into a small scratch buffer (LINGER_BYTES, LINGER_S at most)
        so that the client gets to read the answer instead of a connection reset, then close."""
        sock = self.connection
        try:
            sock.shutdown(socket.SHUT_WR)  # the answer is on its way; nothing more will be written
            sock.settimeout(LINGER_S)
            deadline, scratch, left = time.monotonic() + LINGER_S, bytearray(65536), min(n, LINGER_BYTES)
            while left > 0 and time.monotonic() < deadline:
                k = sock.recv_into(scratch, min(left, len(scratch)))
                if not k:
                    break
                left -= k
        except OSError:
            pass

    def _head(self) -> tuple[str, str, dict] | None:
        block = self._buffered_head()
        if block is not None:  # the whole head arrived with the first read: split it at once
            lines = block.decode("latin-1").split("\r\n")
            line, rest = lines[0], lines[1:]
            if len(rest) > MAX_HEADERS:
                raise _Framing(431, f"more than {MAX_HEADERS} header lines")
        else:
            raw = self.rfile.readline(MAX_LINE + 1)
            while raw in (b"\r\n", b"\n"):  # tolerate stray CRLF between requests (RFC 9112 2.2)
                raw = self.rfile.readline(MAX_LINE + 1)
            if not raw:
                return None
            if len(raw) > MAX_LINE:
                raise _Framing(414, "request line too long")
            line, rest = raw.decode("latin-1"), None
        parts = line.split()
        if len(parts) != 3 or not parts[1].startswith("/"):
            raise _Framing(400, f"malformed request line {line[:80].strip()!r}")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _Framing(400, f"unsupported protocol {version[:20]!r}; use HTTP/1.1")
        headers = self._headers() if rest is None else _parse_headers(rest)
        conn = headers.get("connection", "").lower()
        self.close_connection = conn == "close" or (version == "HTTP/1.0" and conn != "keep-alive") or method == "HEAD"
        if headers.get("expect", "").lower() == "100-continue" and version == "HTTP/1.1":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return method, target, headers

    def _buffered_head(self) -> bytes | None:
        """The request line and header lines, consumed, when all of them sit in the read buffer with plain
        CRLF endings and no line over MAX_LINE; None leaves everything to the line-by-line parser."""
        data = self.rfile.peek(1)
        end = data.find(b"\r\n\r\n")
        if end <= 0 or end > MAX_LINE or data[0] in b"\r\n" or data.count(b"\n", 0, end) != data.count(b"\r\n", 0, end):
            return None
        block = data[:end]
        self.rfile.read(end + 4)
        return block

    def _headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = self.rfile.readline(MAX_LINE + 1)
            if line in (b"\r\n", b"\n", b""):
                return headers
            if len(line) > MAX_LINE:
                raise _Framing(431, "header line too long")
            _header(headers, line.decode("latin-1"))
        raise _Framing(431, f"more than {MAX_HEADERS} header lines")

    def _dispatch(self, method: str, target: str, headers: dict) -> None:
        oip = self.oip
        if not oip._enter():
            self.close_connection = True
            self._write(error_response(503, "server is shutting down"))
            return
        try:
            try:
                raw_len = headers.get("inference-header-content-length")
                body = self._body(method, headers, int(raw_len) if raw_len and raw_len.isdigit() else 0)
                self._authorize(target, headers)
                resp = oip._router.route(method, target, body, header_length(raw_len), oip.accepting)
            except ServingError as exc:
                resp = error_response(status_of(exc), str(exc))
                if isinstance(exc, ServerBusy):
                    resp.headers["Retry-After"] = "1"
            except Exception as exc:  # noqa: BLE001 - a bug: answer 500, keep serving
                resp = error_response(500, f"internal error: {type(exc).__name__}: {exc}")
            self._write(resp)
        finally:
            if self._reserved:
                oip._unreserve(self._reserved)
                self._reserved = 0
            oip._leave()

    def _authorize(self, target: str, headers: dict) -> None:
        token = self.oip.token
        if token is None or target.split("?", 1)[0] in OPEN_PATHS:
            return
        got = headers.get("authorization", "")
        if not hmac.compare_digest(got.encode("utf-8", "replace"), f"Bearer {token}".encode()):
            raise Unauthorized("missing or wrong bearer token (send 'Authorization: Bearer <token>')")

    def _length(self, method: str, headers: dict) -> int:
        if "transfer-encoding" in headers:
            self.close_connection = True
            raise LengthRequired("chunked request bodies are not supported; send Content-Length")
        raw = headers.get("content-length")
        if raw is None:
            if method == "POST":
                self.close_connection = True
                raise LengthRequired("POST needs a Content-Length header")
            return 0
        if not raw.isdigit():
            self.close_connection = True
            raise BadRequest(f"invalid Content-Length {raw[:20]!r}")
        return int(raw)

    def _body(self, method: str, headers: dict, align_at: int = 0) -> memoryview | bytes:
        n = self._length(method, headers)
        if n > self.oip.max_body_bytes:
            self.close_connection = True  # the body is not read: the connection cannot be reused
            self._unread = n
            raise PayloadTooLarge(f"request body of {n} bytes exceeds the limit of {self.oip.max_body_bytes} bytes")
        if not n:
            return b""
        reserved = self.oip._reserve(n)
        if reserved is None:
            self.close_connection = True  # the body is not read: the connection cannot be reused
            self._unread = n
            raise ServerBusy(
                f"request bodies in flight fill the server's budget of "
                f"{self.oip.body_budget_bytes} bytes; retry shortly"
            )
        self._reserved = reserved
        if headers.get("content-encoding", "identity") == "identity":
            return self._read(n, align_at)
        return self._decompress(self._read(n), headers)

    def _read(self, n: int, align_at: int = 0) -> memoryview:
        """Read n body bytes into the connection's buffer, placed so that byte align_at (where the binary
        tensors start) is 64-byte aligned: ONNX Runtime copies misaligned inputs before running."""
        if n + ALIGN > len(self._buf):
            buf = bytearray(n + ALIGN)
            if n + ALIGN <= KEEP_BUFFER_BYTES and self.oip._keep_buffer(len(self._buf), len(buf)):
                self._buf, self._addr = buf, _address(buf)
            pad = (-(_address(buf) + align_at)) % ALIGN
        else:
            buf, pad = self._buf, (-(self._addr + align_at)) % ALIGN
        view = memoryview(buf)[pad : pad + n]
        got = 0
        while got < n:
            k = self.rfile.readinto(view[got:])
            if not k:
                self.close_connection = True
                raise BadRequest(f"request body ended after {got} of {n} bytes")
            got += k
        return view

    def _decompress(self, body: memoryview, headers: dict) -> memoryview | bytes:
        enc = headers.get("content-encoding", "identity").strip().lower()
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

    def _write(self, resp: Response) -> None:
        self.oip._count(resp.status)
        parts, length = resp.buffers()
        extra = "".join(f"{k}: {v}\r\n" for k, v in resp.headers.items()) if resp.headers else ""
        if resp.status == 401:
            extra += 'WWW-Authenticate: Bearer realm="edge-agent"\r\n'
        if self.close_connection:
            extra += "Connection: close\r\n"
        head = (
            f"HTTP/1.1 {resp.status} {PHRASES.get(resp.status, 'Error')}\r\nServer: {SERVER}\r\n"
            f"Content-Type: {resp.content_type}\r\nContent-Length: {length}\r\n{extra}\r\n"
        ).encode("latin-1")
        send_all(self.connection, [head, *parts], len(head) + length)


def _header(headers: dict[str, str], line: str) -> None:
    """Add one header line (without or with its line ending) to headers; _Framing if it is malformed."""
    key, sep, value = line.partition(":")
    key = key.strip().lower()
    if not sep or not key or " " in key:
        raise _Framing(400, f"malformed header line {line[:80].strip()!r}")
    value = value.strip()
    if key == "content-length" and headers.get(key, value) != value:
        raise _Framing(400, "conflicting Content-Length headers")
    headers[key] = value


def _parse_headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        _header(headers, line)
    return headers


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
