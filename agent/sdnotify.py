"""The systemd notify protocol, spoken directly on $NOTIFY_SOCKET (READY, STATUS, WATCHDOG, STOPPING, RELOADING).

Usage from the daemon's main loop (never from a helper thread: a wedged main loop must stop the pings):

    sd = SdNotifier.from_env()           # a no-op notifier when not started by systemd
    ...                                  # start serving
    sd.ready("serving 2 models")
    while not stop.wait(timeout=sd.tick(default=1.0)):
        ...                              # one loop iteration; tick() pings WATCHDOG=1 when due
    sd.stopping("draining 3 requests")

Every send is best effort: it returns False instead of raising (systemd gone, socket full).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping, MutableMapping

_ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class SdNotifier:
    """A sender of sd_notify(3) datagrams; inert when `address` is None."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None, *, clock=time.monotonic):
        self.address = address
        self.watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self.last_error: str | None = None
        self._clock = clock
        self._last_ping: float | None = None
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] | None = None, *, unset: bool = True) -> "SdNotifier":
        """Read NOTIFY_SOCKET / WATCHDOG_USEC / WATCHDOG_PID. The watchdog is ours only when WATCHDOG_PID is
        unset or equals our pid. With `unset`, the variables are removed so child processes (qualification
        workers) do not inherit them and cannot speak for the daemon."""
        env = os.environ if env is None else env
        values = {k: env.get(k) for k in _ENV_KEYS}
        if unset:
            for key in _ENV_KEYS:
                env.pop(key, None)
        return cls(values["NOTIFY_SOCKET"] or None, _watchdog_usec(values))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to send WATCHDOG=1: half of WATCHDOG_USEC (None when no watchdog is requested)."""
        if not self.enabled or self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2e6

    # ------------------------------------------------------------ messages

    def ready(self, status: str | None = None) -> bool:
        """READY=1 (once serving). Also sends MAINPID so `systemctl` tracks the right process."""
        return self.notify("READY=1", f"MAINPID={os.getpid()}", *([_status(status)] if status else []))

    def status(self, text: str) -> bool:
        """STATUS=<one line> (shown by `systemctl status`)."""
        return self.notify(_status(text))

    def watchdog(self) -> bool:
        """WATCHDOG=1 now (prefer tick(), which keeps the cadence)."""
        self._last_ping = self._clock()
        return self.notify("WATCHDOG=1")

    def tick(self, default: float = 1.0) -> float:
        """Ping WATCHDOG=1 if half of WATCHDOG_USEC has passed since the last ping; return how long the main
        loop may sleep before calling tick() again (never more than `default`)."""
        interval = self.watchdog_interval_s
        if interval is None:
            return default
        now = self._clock()
        if self._last_ping is None or now - self._last_ping >= interval:
            self.watchdog()
            return min(default, interval)
        return max(0.0, min(default, self._last_ping + interval - now))

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1 (on SIGTERM, before draining)."""
        return self.notify("STOPPING=1", *([_status(status)] if status else []))

    def reloading(self) -> bool:
        """RELOADING=1 with MONOTONIC_USEC (SIGHUP); send ready() when the reload is done."""
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def extend_timeout(self, seconds: float) -> bool:
        """EXTEND_TIMEOUT_USEC: ask for more start-up/stop time (long qualification, long drain)."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def notify(self, *lines: str) -> bool:
        """Send one datagram of newline-separated assignments; False (with last_error) when it fails."""
        if not self.enabled:
            return False
        data = ("\n".join(lines) + "\n").encode("utf-8", "replace")
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # never block: a notify socket nobody reads fills up (10 datagrams by default), and a blocked
                # send would stall the main loop (and the drain on SIGTERM) until a supervisor kills it
                self._sock.sendto(data, socket.MSG_DONTWAIT, _sockaddr(self.address or ""))
            except OSError as exc:
                self.last_error = f"{self.address}: {exc.strerror or exc}"
                return False
        self.last_error = None
        return True

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _watchdog_usec(values: Mapping[str, str | None]) -> int | None:
    pid = values.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None  # the watchdog is meant for another process
    try:
        usec = int(values.get("WATCHDOG_USEC") or 0)
    except ValueError:
        return None
    return usec if usec > 0 else None


def _sockaddr(address: str) -> str | bytes:
    """'@name' is the Linux abstract namespace ('\\0name'); anything else is a filesystem path."""
    if address.startswith("@"):
        return b"\0" + address[1:].encode()
    return address


def _status(text: str) -> str:
    return "STATUS=" + " ".join(str(text).split())  # one line: a newline would start a new assignment
