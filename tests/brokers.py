"""Real brokers for tests: a private Mosquitto or NATS (MQTT gateway) on a free loopback port.

with Mosquitto(tmp_path) as broker:  broker.url == "mqtt://127.0.0.1:PORT"
broker.restart() keeps the port (and persistence, when enabled) across a stop/start.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGKILL to this child when the process that started it dies, so killing
    pytest (or an xdist worker) never leaves a broker running (Linux prctl PR_SET_PDEATHSIG)."""
    _LIBC.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1; libc loaded before fork, nothing else runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name: str) -> str:
    for cand in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/local/sbin/{name}"):
        if cand and os.path.exists(cand):
            return cand
    raise RuntimeError(f"{name} not installed: run scripts/test.sh (installs it with apt-get)")


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"broker did not listen on {port}: {log.read_text()[-2000:]}")


class _Broker:
    scheme = "mqtt"

    def __init__(self, workdir: Path, port: int | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / "broker.log"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def start(self) -> "_Broker":
        self.proc = subprocess.Popen(
            self._argv(),
            stdout=open(self.log, "ab"),  # noqa: SIM115 - the child owns the handle
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        _wait_port(self.port, self.proc, self.log)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Mosquitto(_Broker):
    """Mosquitto 2.x with anonymous access (or a caller-supplied config body), persistence in workdir."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        extra_conf: str = "",
        anonymous: bool = True,
        persistence: bool = True,
    ):
        super().__init__(workdir, port)
        self.extra_conf = extra_conf
        self.anonymous = anonymous
        self.persistence = persistence

    def _argv(self) -> list[str]:
        conf = self.workdir / "mosquitto.conf"
        lines = [
            f"listener {self.port} 127.0.0.1",
            f"allow_anonymous {'true' if self.anonymous else 'false'}",
            "max_inflight_messages 0",
            "max_queued_messages 10000",
            "message_size_limit 0",
            "set_tcp_nodelay true",
            # as root, Mosquitto would switch to its own user, and a credential change clears PR_SET_PDEATHSIG
            f"user {pwd.getpwuid(os.getuid()).pw_name}",
        ]
        if self.persistence:
            lines += ["persistence true", f"persistence_location {self.workdir}/", "autosave_interval 1"]
        conf.write_text("\n".join(lines) + "\n" + self.extra_conf + "\n")
        return [_which("mosquitto"), "-c", str(conf)]


class NatsMqtt(_Broker):
    """nats-server with JetStream and its MQTT gateway (MQTT 3.1.1 only)."""

    def __init__(self, workdir: Path, port: int | None = None):
        super().__init__(workdir, port)
        self.nats_port = free_port()

    def _argv(self) -> list[str]:
        conf = self.workdir / "nats.conf"
        conf.write_text(
            f"""server_name: edge_test_{self.port}
listen: 127.0.0.1:{self.nats_port}
jetstream {{ store_dir: "{self.workdir}/js" }}
mqtt {{ listen: 127.0.0.1:{self.port} }}
max_payload: 8MB
"""
        )
        return [_which("nats-server"), "-c", str(conf)]
