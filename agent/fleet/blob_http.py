"""BlobServer: the store's blobs over HTTP (`fleet serve --http`): GET/HEAD /blobs/sha256/<hex>, one Range.

One asyncio event loop in one thread holds every connection, so an idle crowd costs file descriptors, not
threads. Bounds: at most max_connections open (never more than RLIMIT_NOFILE less `reserve_fds`, so accept()
never runs out of descriptors) and max_per_peer per client address; when either is reached, the oldest idle
connection (no request in progress) is closed to make room, so a new request is served beside any number of
idle ones; with nothing idle to close, the new connection gets 503. An idle connection closes after
idle_timeout; a request head must arrive within header_timeout of its first byte. Bodies go out by sendfile.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import resource
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.artifacts.store import ContentStore
from agent.errors import ArtifactError

MAX_HEAD = 16384
ROOM_BATCH = 16  # idle connections closed at once when a new one waits and every slot is taken


def fd_room(reserve: int) -> int:
    """Descriptors this process may still give to connections: the RLIMIT_NOFILE soft limit less `reserve`
    (the store's files, the broker link, logs) less what is open now."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = soft if soft != resource.RLIM_INFINITY else 1 << 20
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 32
    return max(8, soft - used - reserve)


@dataclass(eq=False)
class _Conn:
    peer: str
    writer: asyncio.StreamWriter
    idle: bool = True  # waiting for a request head (no byte of it yet)


class _Protocol(asyncio.StreamReaderProtocol):
    """StreamReaderProtocol that says when its connection is gone (the moment its descriptor is released)."""

    def __init__(
        self, reader: asyncio.StreamReader, on_lost: Callable[[], None], loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(reader, loop=loop)
        self._on_lost = on_lost

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._on_lost()


class BlobServer:
    """start() binds and serves from a background thread; .port/.url/.server_address; shutdown() stops."""

    def __init__(
        self,
        store: ContentStore,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_connections: int = 4096,
        max_per_peer: int = 256,
        idle_timeout: float = 30.0,
        header_timeout: float = 10.0,
        reserve_fds: int = 64,
    ) -> None:
        self.store, self.host, self.port = store, host, port
        self.max_connections = max(1, min(int(max_connections), fd_room(reserve_fds)))
        self.max_per_peer = max(1, int(max_per_peer))
        self.idle_timeout, self.header_timeout = float(idle_timeout), float(header_timeout)
        self.stats: collections.Counter[str] = collections.Counter()
        self._conns: collections.OrderedDict[_Conn, None] = collections.OrderedDict()  # oldest first
        self._peers: collections.Counter[str] = collections.Counter()
        self._loop = asyncio.new_event_loop()
        self._listener: socket.socket
        self._reading = self._stopping = self._want_room = False
        self._sockets = 0  # accepted and not yet closed (admitted or not)
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread: threading.Thread | None = None

    @property
    def server_address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def start(self) -> "BlobServer":
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            self._listener = socket.create_server((self.host, self.port), family=family, backlog=1024)
        except OSError as exc:
            self._loop.close()
            raise ArtifactError(f"cannot serve HTTP on {self.host}:{self.port}: {exc.strerror or exc}") from None
        self._listener.setblocking(False)
        self.host, self.port = self._listener.getsockname()[:2]
        self._loop.call_soon(self._resume)
        self._thread = threading.Thread(target=self._loop.run_forever, name="artifact-http", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        if self._thread is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        with contextlib.suppress(Exception):
            fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None
        self._loop.close()
        self._listener.close()

    async def _close(self) -> None:
        self._stopping = True
        self._pause()
        for conn in list(self._conns):
            conn.writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    # --- accepting: never more sockets than max_connections, so accept() never meets EMFILE -------------
    def _pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._listener.fileno())
            self._reading = False

    def _resume(self) -> None:
        if not self._reading and not self._stopping:
            self._loop.add_reader(self._listener.fileno(), self._accept)
            self._reading = True

    def _accept(self) -> None:
        while self._sockets < self.max_connections:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors after all (another part of the process): retry shortly
                self.stats["accept_errors"] += 1
                self._pause()
                self._loop.call_later(0.1, self._resume)
                return
            self._sockets += 1
            sock.setblocking(False)
            task = self._loop.create_task(self._connection(sock, str(addr[0]) if addr else "?"))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # full, and someone is waiting in the backlog: the oldest idle connection makes room (its close resumes
        # accepting); with none idle, wait for a connection to end
        self._pause()
        self._want_room = True
        self._make_room()

    def _make_room(self) -> None:
        """Someone waits in the backlog while we are full: close the oldest idle connections, ROOM_BATCH at a
        time so a crowd queued in the backlog is cycled through quickly (none idle yet: the next connection to
        become idle is the one)."""
        if not self._want_room:
            return
        victims = [c for c in itertools.islice((c for c in self._conns if c.idle), ROOM_BATCH)]
        if victims:
            self._want_room = False
        for victim in victims:
            self._evict(victim)

    def _evict(self, victim: _Conn) -> None:
        self._forget(victim)
        self.stats["evicted_idle"] += 1
        victim.writer.transport.abort()  # its reader sees the end at once; its socket closes on the next turn

    async def _connection(self, sock: socket.socket, peer: str) -> None:
        reader = asyncio.StreamReader(limit=MAX_HEAD, loop=self._loop)
        protocol = _Protocol(reader, self._closed_one, loop=self._loop)
        try:
            transport, _ = await self._loop.connect_accepted_socket(lambda: protocol, sock)
        except OSError:
            sock.close()
            self._closed_one()
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, self._loop)
        try:
            await self._handle(reader, writer, peer)
        finally:
            transport.close()

    def _closed_one(self) -> None:
        """A connection's socket is closed (the transport closes it right after connection_lost)."""
        self._sockets -= 1
        self._loop.call_soon(self._resume)

    # --- admission --------------------------------------------------------------------------------
    def _admit(self, conn: _Conn) -> bool:
        """Room for `conn` within max_per_peer, closing its peer's oldest idle connection if need be."""
        if self._peers[conn.peer] >= self.max_per_peer:
            victim = next((c for c in self._conns if c.idle and c.peer == conn.peer), None)
            if victim is None:
                return False
            self._evict(victim)
        self._conns[conn] = None
        self._peers[conn.peer] += 1
        self._make_room()
        return True

    def _forget(self, conn: _Conn) -> None:
        if self._conns.pop(conn, False) is None:
            self._peers[conn.peer] -= 1
            if self._peers[conn.peer] <= 0:
                del self._peers[conn.peer]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        conn = _Conn(peer, writer)
        if not self._admit(conn):
            self.stats["refused"] += 1
            with contextlib.suppress(OSError):
                writer.write(_response(503, "too many open connections", close=True))
            writer.close()
            return
        try:
            while await self._one(reader, writer, conn):
                pass
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        except asyncio.LimitOverrunError:
            with contextlib.suppress(OSError):
                writer.write(_response(431, "request head too large", close=True))
        finally:
            self._forget(conn)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn) -> bool:
        """Serve one request; False when the connection should close."""
        conn.idle = True
        self._conns.move_to_end(conn)
        self._make_room()
        first = await asyncio.wait_for(reader.readexactly(1), self.idle_timeout)
        conn.idle = False
        rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.header_timeout)
        lines = (first + rest).decode("latin-1").split("\r\n")
        parts = lines[0].split()
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        close = headers.get("connection", "").lower() == "close" or (len(parts) == 3 and parts[2] == "HTTP/1.0")
        if len(parts) != 3 or parts[0] not in ("GET", "HEAD"):
            writer.write(_response(405 if len(parts) == 3 else 400, "GET or HEAD /blobs/sha256/<hex>", close=True))
            await writer.drain()
            return False
        if "content-length" in headers or "transfer-encoding" in headers:
            writer.write(_response(400, "a GET carries no body", close=True))
            await writer.drain()
            return False
        await self._serve(writer, parts[0] == "GET", parts[1], headers.get("range"), close)
        self.stats["requests"] += 1
        return not close

    async def _serve(self, writer: asyncio.StreamWriter, body: bool, target: str, rng: str | None, close: bool) -> None:
        parts = target.split("?")[0].strip("/").split("/")
        if (
            len(parts) != 3
            or parts[:2] != ["blobs", "sha256"]
            or not is_hex64(parts[2])
            or not self.store.has(parts[2])
        ):
            writer.write(_response(404, "no such blob", close=close))
            await writer.drain()
            return
        with open(self.store.path(parts[2]), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start, end, status = 0, size - 1, 200
            if rng:
                parsed = parse_range(rng, size)
                if parsed is None:
                    extra = {"Content-Range": f"bytes */{size}"}
                    writer.write(_head(416, 0, close, extra))
                    await writer.drain()
                    return
                start, end, status = parsed[0], parsed[1], 206
            extra = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
            if status == 206:
                extra["Content-Range"] = f"bytes {start}-{end}/{size}"
            writer.write(_head(status, max(0, end - start + 1), close, extra))
            await writer.drain()
            if body and end >= start:
                await asyncio.get_running_loop().sendfile(writer.transport, f, start, end - start + 1)
                self.stats["bytes"] += end - start + 1


_REASONS = {200: "OK", 206: "Partial Content", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
_REASONS |= {416: "Range Not Satisfiable", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


def _head(status: int, length: int, close: bool, extra: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}", f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _response(status: int, message: str, close: bool) -> bytes:
    data = message.encode()
    return _head(status, len(data), close, {"Content-Type": "text/plain"}) + data


def is_hex64(s: str) -> bool:
    return len(s) == 64 and all(c in "0123456789abcdef" for c in s)


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """'bytes=a-b' / 'bytes=a-' / 'bytes=-n' -> (start, end) inclusive; None when unsatisfiable or multi-range."""
    if not header.startswith("bytes=") or "," in header:
        return None
    a, _, b = header[6:].strip().partition("-")
    try:
        if a == "":
            n = int(b)
            start, end = max(0, size - n), size - 1
        else:
            start, end = int(a), (int(b) if b else size - 1)
    except ValueError:
        return None
    end = min(end, size - 1)
    return (start, end) if 0 <= start <= end else None


def serve_http(store: ContentStore, bind: str, **limits: Any) -> BlobServer:
    """Serve the store's blobs on HOST:PORT from a background thread; returns the server (call .shutdown())."""
    host, _, port = bind.rpartition(":")
    try:
        port_n = int(port)
    except ValueError:
        raise ArtifactError(f"cannot serve HTTP on {bind!r}: expected HOST:PORT") from None
    return BlobServer(store, host.strip("[]") or "0.0.0.0", port_n, **limits).start()
