"""Real brokers for tests: a private Mosquitto or NATS (MQTT gateway) on a free loopback port.

with Mosquitto(tmp_path) as broker:  broker.url == "mqtt://127.0.0.1:PORT"
broker.restart() keeps the port (and persistence, when enabled) across a stop/start.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import random
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


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (the source ports of outgoing connections)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PORTS = random.Random()  # seeded from the OS: xdist workers and test processes draw apart


def free_port() -> int:
    """A port nothing listens on, drawn below the ephemeral range: a port the kernel hands out with bind(0) is
    also handed out as the source port of any outgoing connection in the moment before the test's server binds
    it (seen in CI: a NATS node's route port taken, "bind: address already in use"); below the range only
    another test's draw can collide. Falls back to the kernel's choice where that range is unusable."""
    high = _ephemeral_low()
    for _ in range(50):
        port = _PORTS.randrange(max(1024, high - 12000), high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class NatsNode(NatsMqtt):
    """One node of a NatsCluster: its own client, cluster and MQTT ports, server_name and JetStream store."""

    def __init__(self, workdir: Path, name: str, cluster: str, route_ports: list[int]):
        super().__init__(workdir)
        self.name, self.cluster_name = name, cluster
        self.cluster_port = free_port()
        self.route_ports = route_ports  # every node's cluster port, this one's included (NATS skips itself)

    def _argv(self) -> list[str]:
        conf = self.workdir / "nats.conf"
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in self.route_ports)
        conf.write_text(
            f"""server_name: {self.name}
listen: 127.0.0.1:{self.nats_port}
jetstream {{ store_dir: "{self.workdir}/js" }}
cluster {{
  name: {self.cluster_name}
  listen: 127.0.0.1:{self.cluster_port}
  routes: [{routes}]
}}
mqtt {{
  listen: 127.0.0.1:{self.port}
  stream_replicas: 3
  consumer_memory_storage: true
}}
max_payload: 8MB
"""
        )
        return [_which("nats-server"), "-c", str(conf)]


class NatsCluster:
    """Three nats-server nodes routed to each other, JetStream clustered (R3 MQTT streams), MQTT on each node.

    .urls: the MQTT URL of each node; .url: all of them comma-separated (what BrokerConfig and --broker take);
    .kill(i) SIGKILLs node i; .restart(i) starts it again on the same ports and store, rejoining the cluster.
    start() returns once an MQTT client on every node receives a retained message published through node 0:
    JetStream has a meta leader and the MQTT streams exist on all three."""

    def __init__(self, workdir: Path, size: int = 3, name: str = "edge_test"):
        self.workdir = Path(workdir)
        ports = [free_port() for _ in range(size)]
        self.nodes = [NatsNode(self.workdir / f"n{i}", f"n{i}", name, ports) for i in range(size)]
        for node, port in zip(self.nodes, ports):
            node.cluster_port = port

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def start(self, timeout: float = 60.0) -> "NatsCluster":
        try:
            for node in self.nodes:
                node.start()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 60.0, nodes: list[int] | None = None) -> None:
        """A retained message published through the first live node reaches a subscriber on each of `nodes`."""
        live = [i for i, n in enumerate(self.nodes) if n.proc is not None]
        nodes = live if nodes is None else nodes
        deadline = time.monotonic() + timeout
        token = f"{time.monotonic_ns()}".encode()
        last = "no attempt"
        while time.monotonic() < deadline:
            try:
                _mqtt_once(self.nodes[live[0]].port, lambda c: c.publish("edge-test/ready", token, 1, retain=True))
                for i in nodes:
                    got = _mqtt_once(self.nodes[i].port, None, "edge-test/ready")
                    if got != token:
                        raise RuntimeError(f"node n{i} returned {got!r}")
                return
            except (OSError, RuntimeError) as exc:
                last = str(exc)
                time.sleep(0.5)
        logs = "\n".join(n.log.read_text()[-1500:] for n in self.nodes)
        raise RuntimeError(f"NATS cluster not ready in {timeout:.0f} s ({last}):\n{logs}") from None

    def kill(self, i: int) -> None:
        self.nodes[i].kill()

    def restart(self, i: int, timeout: float = 60.0) -> None:
        self.nodes[i].stop()
        self.nodes[i].start()
        self.wait_ready(timeout, nodes=[i])

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "NatsCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _mqtt_once(port: int, action, topic: str | None = None, timeout: float = 5.0) -> bytes | None:
    """Connect (MQTT 3.1.1) to 127.0.0.1:port; run `action(client)` and wait for its PUBACK, or subscribe to
    `topic` and return the first message's payload. RuntimeError when the broker does not answer in time.
    Driven by agent.transport.netloop, not paho's select() loop: this runs beside hundreds of simulated devices
    (a node restarted mid-run), where its socket may be numbered past 1024."""
    import threading

    import paho.mqtt.client as mqtt

    from agent.transport.netloop import NetLoop

    connected, done = threading.Event(), threading.Event()
    got: list[bytes] = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"ready-{port}-{time.monotonic_ns()}")
    c.on_connect = lambda cl, u, f, rc, p=None: connected.set() if not rc.is_failure else None

    def on_message(cl, u, m):
        got.append(m.payload)
        done.set()

    c.on_message = on_message
    c.on_publish = lambda *a: done.set()
    c.connect("127.0.0.1", port, keepalive=10)  # a refused TCP connection raises OSError here, at once
    net = NetLoop(c, f"ready-{port}").start()
    try:
        if not connected.wait(timeout):
            raise RuntimeError(f"no CONNACK from 127.0.0.1:{port}")
        if topic is not None:
            c.subscribe(topic, qos=1)
        else:
            action(c)
        if not done.wait(timeout):
            raise RuntimeError(f"127.0.0.1:{port}: no {'message' if topic else 'PUBACK'}")
        return got[0] if got else None
    finally:
        c.disconnect()
        net.stop()
