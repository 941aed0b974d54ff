"""The HTTP server's workers: each serves a connection handed over with a complete request head, reading the body
against the request deadline and the memory budget, answering in one send, and keeping the connection while its
client sends the next request soon (the keep-alive fast path: up to HOLD_MS, as long as no other request waits for
a worker), so that a busy keep-alive client costs one thread wake-up per request, not a hand-over from the selector.
Expect: 100-continue is answered only once the request passed its size, budget and token checks.
"""

from __future__ import annotations

import ctypes
import select
import time
import zlib
from typing import Protocol

from agent.serving.budget import BodyBudget, Ledger
from agent.serving.dataplane import DataPlane
from agent.serving.errors import InvalidInput, PayloadTooLarge, RequestTimeout
from agent.serving.http.compress import compress
from agent.serving.http.handlers import Response, Router, error_for, error_response, header_length
from agent.serving.http.jsonfast import JSON_BODY_HINT, keep_parsers
from agent.serving.http.wire import (
    LINGER_BYTES,
    MAX_HEAD,
    OPEN_PATHS,
    RECV_BYTES,
    Conn,
    Framing,
    Head,
    content_length,
    head_end,
    parse_head,
    render,
    send_all,
    send_stream,
)

KEEP_BUFFER_BYTES = 16 * 1024 * 1024  # larger bodies get a buffer of their own, dropped after the request
ALIGN = 64  # binary tensors start on a cache line
FAST_WAIT_MS = 5  # a worker waits for the next request on its connection in slices of this ...
HOLD_MS = 100  # ... up to this long, unless other requests wait for a worker, then parks the connection
INFLATE_STEP = 1024 * 1024  # decompressed in steps of this size, each counted against the budget first
HEAD_RECV_BYTES = 8192  # the first read of a request on the keep-alive fast path


class Host(Protocol):
    """What a worker sees of the HTTP server (server.OIPServer): its limits, budget, router and connection books."""

    request_timeout: float
    header_timeout: float
    max_body_bytes: int
    budget: BodyBudget
    router: Router
    plane: DataPlane

    @property
    def accepting(self) -> bool: ...

    def begin(self) -> bool: ...

    def end(self) -> None: ...

    def count(self, status: int) -> None: ...

    def backlog(self) -> bool: ...

    def park(self, conn: Conn) -> None: ...

    def drain(self, conn: Conn, n: int) -> None: ...

    def close(self, conn: Conn, reason: str | None = None) -> None: ...


def _address(buf: bytearray) -> int:
    """Address of a writable buffer's first byte (for alignment)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class Worker:
    """Serves connections handed over by the server: one request after another while they keep coming."""

    def __init__(self, oip: Host):
        self.oip = oip
        self._started = False
        self._keeps_parser = False  # this thread keeps a JSON parser (jsonfast.keep_parsers), counted as kept memory

    def serve(self, conn: Conn) -> None:
        """Answer the requests on conn (its buffer holds a complete head), then park it, drain it or close it."""
        oip, sock = self.oip, conn.sock
        if not self._keeps_parser:  # serve runs in the worker's own thread, one Worker a thread
            keep_parsers(oip.budget.keep)
            self._keeps_parser = True
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
                except InvalidInput:
                    close = True  # a length header that lies about its digits: nothing after it is trusted
                    raise
                self._authorize(head, conn.peer)
                if n > oip.max_body_bytes:
                    raise PayloadTooLarge(
                        f"request body of {n} bytes exceeds the limit of {oip.max_body_bytes} bytes"
                        + (f"; {JSON_BODY_HINT}" if hlen is None and head.target.endswith("/infer") else "")
                    )
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
            if accept and resp.status == 200 and resp.stream is None:
                resp = compress(resp, accept, ledger)
            close = close or resp.stream is not None  # a stream ends its connection
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
                    raise InvalidInput(f"request body ended after {got} of {n} bytes")
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
            raise InvalidInput(f"unsupported Content-Encoding {enc[:20]!r}; use gzip, deflate or none")
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
            raise InvalidInput(f"body is not valid {enc}: {exc}") from None
        if not d.eof:
            raise InvalidInput(f"body is not valid {enc}: truncated stream")
        return memoryview(out)

    def _send(self, conn: Conn, resp: Response, close: bool, head_only: bool = False) -> None:
        self.oip.count(resp.status)
        parts, total = render(resp, close, head_only)
        send_all(conn.sock, parts, total)
        if resp.stream is not None:  # SSE: chunks as they come (the connection closes after it)
            send_stream(conn.sock, iter(()) if head_only else resp.stream)
