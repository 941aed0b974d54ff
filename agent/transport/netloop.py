"""paho's network loop without select(): one thread per client that connects, reads, writes, pings and reconnects.

paho's own loop_start() waits in select.select(), which cannot watch a descriptor numbered 1024 or more
(FD_SETSIZE); paho turns the ValueError into "connection lost" and reconnects to the same fate, silently and
forever (paho.mqtt.python issues #183 and #819). A process with many links or files (the fleet simulator: about
13 descriptors per device, so its 80th device) gets such sockets. This loop drives the client through paho's
documented external-loop calls (reconnect, loop_read, loop_write, loop_misc, want_write, socket) and waits with
select.poll, which has no such ceiling (select.select only where poll does not exist, as on Windows).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import paho.mqtt.client as paho

_POLL = hasattr(select, "poll")
_READ_EVENTS = (select.POLLIN | select.POLLERR | select.POLLHUP | select.POLLNVAL) if _POLL else 0


class NetLoop:
    """Runs `client` (a paho Client after connect_async) in its own thread until stop().

    Reconnects after a failed or dropped connection with a back-off of `min_delay`, doubling to `max_delay`,
    reset at each CONNACK (paho's reconnect_delay_set rule); a failed attempt calls `on_connect_fail`, which may
    point the client at another broker (connect_async). No reconnect once `halted()` is true."""

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        on_connect_fail: Callable[[], None] = lambda: None,
        halted: Callable[[], bool] = lambda: False,
        min_delay: float = 1.0,
        max_delay: float = 10.0,
        tick_s: float = 1.0,
    ):
        self.client, self.on_connect_fail, self.halted = client, on_connect_fail, halted
        self.min_delay, self.max_delay, self.tick_s = min_delay, max_delay, tick_s
        self._delay: float | None = None
        self._stop = threading.Event()
        self._flush_until = 0.0
        self._detached = threading.Lock()  # taken once: the first of stop() and the ending thread detaches
        self._wake_r, self._wake_w = socket.socketpair()  # another thread queued a packet: stop waiting
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        client.on_socket_register_write = lambda _c, _u, _s: self.wake()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "NetLoop":
        self._thread.start()
        return self

    def stop(self, flush_s: float = 2.0) -> None:
        """End the thread (packets already queued get up to `flush_s` to leave); afterwards paho writes from
        the caller's thread again, so a disconnect() made after stop() still reaches the broker."""
        self._flush_until = time.monotonic() + flush_s
        self._stop.set()
        self.wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(flush_s + 5.0)
        if self._thread.is_alive():
            return  # called from its own callbacks: the thread ends at its next turn and cleans up
        self._detach()

    def wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # full (a wake is already pending) or closed (stopped)

    # --- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        first = True
        try:
            while not self._stop.is_set():
                if self.client.socket() is None:
                    if not first and not self._backoff():
                        break
                    first = False
                    if self._stop.is_set() or self.halted() or not self._connect():
                        continue
                self._session()
        finally:
            if threading.current_thread() is self._thread and self._stop.is_set():
                self._detach()

    def _backoff(self) -> bool:
        """Wait before the next attempt; False when stopped meanwhile."""
        self._delay = self.min_delay if self._delay is None else min(self._delay * 2, self.max_delay)
        return not self._stop.wait(self._delay)

    def _connect(self) -> bool:
        try:
            self.client.reconnect()
            return True
        except OSError:  # refused, unreachable, timed out, TLS refused (ssl.SSLError is an OSError)
            self.on_connect_fail()
            return False

    def _session(self) -> None:
        """Serve the current socket until it is closed (or until stop, once queued packets have left)."""
        c = self.client
        while True:
            sock = c.socket()
            if sock is None:
                return
            if c.is_connected():
                self._delay = None  # a CONNACK came: the next back-off starts from min_delay again
            if self._stop.is_set() and (not c.want_write() or time.monotonic() >= self._flush_until):
                return
            pending = sock.pending() if hasattr(sock, "pending") else 0  # TLS bytes already decrypted
            readable, writable = self._wait(sock, c.want_write(), 0.0 if pending else self.tick_s)
            if readable or pending:
                c.loop_read()
                if c.socket() is None:
                    return
            if writable:
                c.loop_write()
            c.loop_misc()  # keepalive: PINGREQ when due, drop the socket when the broker stopped answering

    def _wait(self, sock: Any, want_write: bool, timeout: float) -> tuple[bool, bool]:
        """(readable, writable) of `sock` after at most `timeout` s; a wake counts as writable (paho's rule)."""
        try:
            fd = sock.fileno()
        except OSError:
            fd = -1
        if fd < 0:
            return True, False  # closed under us: loop_read reports the lost connection
        rd = wr = woke = False
        if _POLL:
            poller = select.poll()
            poller.register(fd, select.POLLIN | (select.POLLOUT if want_write else 0))
            poller.register(self._wake_r, select.POLLIN)
            for got, ev in poller.poll(timeout * 1000.0):
                if got == fd:
                    rd, wr = rd or bool(ev & _READ_EVENTS), wr or bool(ev & select.POLLOUT)
                else:
                    woke = True
        else:  # pragma: no cover - platforms without poll (Windows): no descriptor-number ceiling there
            r, w, _ = select.select([sock, self._wake_r], [sock] if want_write else [], [], timeout)
            rd, wr, woke = sock in r, sock in w, self._wake_r in r
        if woke:
            self._drain()
        return rd, wr or woke

    def _drain(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _detach(self) -> None:
        if not self._detached.acquire(blocking=False):
            return
        self.client.on_socket_register_write = None
        c = self.client
        if c.socket() is not None and c.want_write():
            try:
                c.loop_write()  # what was queued last (a DISCONNECT) leaves from here
            except Exception:  # noqa: BLE001 - the connection may already be gone
                pass
        for s in (self._wake_r, self._wake_w):
            s.close()


def set_nodelay(client: paho.Client, userdata: object, sock: paho.SocketLike) -> None:
    """paho's on_socket_open: paho leaves Nagle on; set TCP_NODELAY on every (re)connected socket (TLS sockets
    wrap a TCP one), so small packets (requests, PUBACKs) do not wait 40 ms."""
    if not isinstance(sock, socket.socket):  # a websocket wrapper has no socket options: nothing to do
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass  # not a TCP socket (e.g. a unix socket): nothing to do
