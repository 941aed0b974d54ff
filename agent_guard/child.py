"""The agent as the guard's child, as systemd would run it: `<root>/current/venv/bin/edge-agent run --config C`
with NOTIFY_SOCKET bound by the guard; READY=1 awaited, SIGTERM then SIGKILL to stop. Standard library only."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class Notify:
    """A unix datagram socket standing in for systemd's notify socket (under /tmp: paths are limited to 107
    bytes)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="eag", dir="/tmp")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def drain(self) -> None:
        self.sock.setblocking(False)
        try:
            while True:
                self.sock.recv(4096)
        except OSError:
            pass

    def wait_ready(self, proc: subprocess.Popen, timeout_s: float) -> str | None:
        """None once READY=1 arrives; else why not (the child exited, or the time ran out)."""
        end = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                return f"exited with status {proc.returncode} before READY=1"
            left = end - time.monotonic()
            if left <= 0:
                return f"no READY=1 within {timeout_s:g} s"
            self.sock.settimeout(min(left, 0.5))
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, BlockingIOError):
                continue
            if "READY=1" in data.decode(errors="replace").splitlines():
                return None

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Child:
    def __init__(self, root: Path, config: Path, notify: Notify, log: Path) -> None:
        self.root, self.config, self.notify, self.log = root, config, notify, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        exe = self.root / "current" / "venv" / "bin" / "edge-agent"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WATCHDOG_USEC", "WATCHDOG_PID")}
        env["NOTIFY_SOCKET"] = self.notify.path
        self.notify.drain()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            out.write(f"--- guard: starting {os.path.realpath(exe)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [str(exe), "run", "--config", str(self.config)], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        return self.proc

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def wait_ready(self, timeout_s: float) -> str | None:
        """None once the agent started last sends READY=1; else why not."""
        assert self.proc is not None
        return self.notify.wait_ready(self.proc, timeout_s)

    def exit_reason(self) -> str | None:
        """None while the agent runs; else how it ended."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"exited with status {self.proc.returncode}"

    def idle(self) -> None:
        self.notify.drain()  # as systemd does: a notify socket nobody reads fills up

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (the agent drains), then SIGKILL after timeout_s, as systemd's TimeoutStopSec does."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            end = time.monotonic() + timeout_s
            while self.proc.poll() is None and time.monotonic() < end:
                self.notify.drain()  # read what it says while it drains (STOPPING=1, STATUS=...)
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
