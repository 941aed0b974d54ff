"""NotifyListener: plays systemd for a daemon under test. A bound unix datagram socket (the daemon's NOTIFY_SOCKET);
every sd_notify message is parsed and kept, in order. `wait_ready` waits for READY=1 as systemd does: the start-up
may take the 90 s of systemd's default TimeoutStartSec, each EXTEND_TIMEOUT_USEC the daemon sends extends that
window from the moment it arrives (agent/app.py asks for 300 s while it restores its models), and a daemon that
exits ends the wait at once, with its last log lines. No wall-clock guess of the test's own: the daemon's deadlines.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 90.0  # systemd's DefaultTimeoutStartSec


class NotifyListener:
    def __init__(self):
        # under /tmp: a unix socket path has at most 107 bytes, and pytest's tmp_path can be longer
        self.dir = tempfile.mkdtemp(prefix="sd", dir="/tmp")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.5)
        self.messages: list[dict[str, str]] = []
        self.arrived: list[float] = []  # time.monotonic() of each message
        self.cond = threading.Condition()
        self.closed = False
        self._finalizer = weakref.finalize(self, _cleanup, self.sock, self.dir)
        threading.Thread(target=self._run, daemon=True, name="sd-listener").start()

    def _run(self):
        while not self.closed:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self._keep(data)

    def _keep(self, data: bytes) -> None:
        msg = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        with self.cond:
            self.messages.append(msg)
            self.arrived.append(time.monotonic())
            self.cond.notify_all()

    def wait_for(self, pred, timeout: float, what: str, proc: Any = None, log: Path | None = None):
        """Wait until pred(messages) holds; fail at `timeout`, or within 0.2 s of `proc` exiting (with `log`'s tail)."""
        end = time.monotonic() + timeout
        with self.cond:
            while not pred(self.messages):
                _check_alive(proc, log, what, self.messages)
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out after {timeout:.0f} s waiting for {what}; got {self.messages[-10:]}"
                    )
                self.cond.wait(min(left, 0.2))
            return list(self.messages)

    def wait_ready(self, proc: Any = None, log: Path | None = None, since: int = 0) -> list[dict[str, str]]:
        """Wait for READY=1 (after message index `since`) within the start-up window the daemon itself asked for."""
        started = time.monotonic()
        with self.cond:
            while not any(m.get("READY") == "1" for m in self.messages[since:]):
                _check_alive(proc, log, "READY=1", self.messages)
                deadline = started + START_TIMEOUT_S
                for msg, at in zip(self.messages[since:], self.arrived[since:]):
                    if "EXTEND_TIMEOUT_USEC" in msg:
                        deadline = max(deadline, at + int(msg["EXTEND_TIMEOUT_USEC"]) / 1e6)
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = _tail(log)
                    raise AssertionError(
                        f"no READY=1 within the start-up time the daemon asked for; got {self.messages[-10:]}{tail}"
                    )
                self.cond.wait(min(left, 0.2))
            return list(self.messages)

    def count(self, key: str) -> int:
        with self.cond:
            return sum(1 for m in self.messages if key in m)

    def close(self):
        """Keep what is still queued (a daemon's last STOPPING=1 before it exited), then close the socket."""
        self.closed = True
        while True:
            try:
                data = self.sock.recv(4096, socket.MSG_DONTWAIT)
            except OSError:  # nothing queued (BlockingIOError), or closed already
                break
            self._keep(data)
        self._finalizer()


def _cleanup(sock: socket.socket, directory: str) -> None:
    sock.close()
    shutil.rmtree(directory, ignore_errors=True)


def _tail(log: Path | None, n: int = 30) -> str:
    if log is None:
        return ""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return ""
    return "\n--- daemon log (last lines) ---\n" + "\n".join(lines)


def _check_alive(proc: Any, log: Path | None, what: str, messages: list) -> None:
    if proc is not None and proc.poll() is not None:
        raise AssertionError(
            f"daemon exited ({proc.returncode}) while waiting for {what}; got {messages[-10:]}{_tail(log)}"
        )
