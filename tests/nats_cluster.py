"""A 3-node NATS cluster with JetStream and the MQTT gateway on every node (Debian's nats-server), on free
loopback ports; each node is a tests/brokers.py broker (`.url`, `.kill()`, `.restart()`)."""

from __future__ import annotations

import time
from pathlib import Path

from brokers import NatsMqtt, _which, free_port


class ClusterNode(NatsMqtt):
    def __init__(self, workdir: Path, name: str, cluster_port: int, routes: list[int]):
        super().__init__(workdir)
        self.name, self.cluster_port, self.routes = name, cluster_port, routes

    def _argv(self) -> list[str]:
        conf = self.workdir / "nats.conf"
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
        conf.write_text(
            f"""server_name: {self.name}
listen: 127.0.0.1:{self.nats_port}
jetstream {{ store_dir: "{self.workdir}/js" }}
cluster {{ name: edge, listen: 127.0.0.1:{self.cluster_port}, routes: [{routes}] }}
mqtt {{ listen: 127.0.0.1:{self.port} }}
max_payload: 8MB
"""
        )
        return [_which("nats-server"), "-c", str(conf)]


class NatsCluster:
    def __init__(self, workdir: Path, size: int = 3):
        ports = [free_port() for _ in range(size)]
        self.nodes = [ClusterNode(Path(workdir) / f"n{i}", f"n{i}", ports[i], ports) for i in range(size)]

    def __enter__(self) -> "NatsCluster":
        for node in self.nodes:
            node.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc) -> None:
        for node in self.nodes:
            node.stop()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until a retained message published on the first node's MQTT gateway is read on the last one
        (JetStream has a meta leader and the MQTT streams exist across the cluster)."""
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        deadline = time.monotonic() + timeout
        seen: list[bytes] = []
        while time.monotonic() < deadline:
            try:
                pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"ready-pub-{time.monotonic_ns()}")
                pub.connect("127.0.0.1", self.nodes[0].port)
                pub.loop_start()
                pub.publish("ready/check", b"ok", qos=1, retain=True).wait_for_publish(10)
                sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"ready-sub-{time.monotonic_ns()}")
                sub.on_message = lambda c, u, m: seen.append(m.payload)
                sub.connect("127.0.0.1", self.nodes[-1].port)
                sub.loop_start()
                sub.subscribe("ready/check", qos=1)
                end = time.monotonic() + 5
                while not seen and time.monotonic() < end:
                    time.sleep(0.1)
                for c in (pub, sub):
                    c.loop_stop()
                    c.disconnect()
                if seen:
                    return
            except (OSError, RuntimeError, ValueError):
                pass
            time.sleep(1)
        raise RuntimeError("the NATS cluster did not carry a retained MQTT message from the first node to the last")
