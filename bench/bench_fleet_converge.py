"""Fleet convergence: N simulated devices (default 200) converge on a new model through a real Mosquitto.

Reports the time from `rollout` start to the last device committed, and the broker's egress during the
rollout divided by (devices x artifact size) (goal <= 1.05). Egress is Mosquitto's own `$SYS/broker/bytes/sent`
counter (everything the broker wrote to every client: chunks, manifests, status, events, $SYS itself), read
before and after with the fleet idle; the artifact server's count of chunk bytes is printed beside it.

    .venv/bin/python bench/bench_fleet_converge.py [--devices 200] [--size-mb 1] [--json]
Not run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

CLASSES = ["rpi4-4gb", "rpi5-8gb", "jetson-orin-nano-jp6", "qualcomm-qcs6490", "intel-nuc-meteorlake", "amd-epyc-x86"]


def heavy_model(size_mb: float, seed: int = 0):
    """y = x @ W with W random (incompressible), so the artifact is about size_mb."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    n = max(16, int((size_mb * 1024 * 1024 / 4) ** 0.5))
    w = np.random.default_rng(seed).standard_normal((n, n)).astype(np.float32) / n
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "bench_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


class SysBytes:
    """Mosquitto's $SYS/broker/bytes/sent, refreshed every sys_interval (1 s here)."""

    def __init__(self, url: str):
        from agent.transport.mqtt import BrokerConfig, MqttLink

        self.value, self.updates = None, threading.Event()
        self.link = MqttLink(BrokerConfig(url), client_id="bench-sys").start()
        self.link.subscribe("$SYS/broker/bytes/sent", self._on, qos=0)

    def _on(self, topic, payload, retained):
        self.value = int(payload)
        self.updates.set()

    def settled(self, quiet_s: float = 3.0, timeout: float = 120.0) -> int:
        """The counter once it stopped moving (beyond $SYS's own few hundred bytes a second)."""
        end = time.monotonic() + timeout
        last, since = None, time.monotonic()
        while time.monotonic() < end:
            self.updates.clear()
            self.updates.wait(2.0)
            v = self.value
            if last is not None and v is not None and v - last > 4096:
                since = time.monotonic()
            last = v
            if v is not None and time.monotonic() - since >= quiet_s:
                return v
        raise RuntimeError("broker egress never settled")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=200)
    ap.add_argument("--size-mb", type=float, default=1.0)
    ap.add_argument("--canary", default="1")
    ap.add_argument("--wave-size", default="25%")
    ap.add_argument(
        "--source",
        choices=["mqtt", "http"],
        default="mqtt",
        help="where devices fetch the artifact: MQTT chunks, or an HTTP server (a CDN stand-in)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from brokers import Mosquitto

    from agent.artifacts.keys import generate
    from agent.artifacts.store import ContentStore
    from agent.fleet.artifact_server import ArtifactServer, serve_http
    from agent.fleet.rollout_plan import RolloutSpec
    from agent.fleet.rollout_run import run_rollout
    from agent.samples import write_package
    from agent.sim.simulator import Simulator
    from agent.transport.mqtt import BrokerConfig

    tmp = Path(tempfile.mkdtemp(prefix="bench-converge-"))
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    with Mosquitto(tmp / "mq", extra_conf="sys_interval 1") as broker:
        key, pub, _ = generate(tmp / "keys")
        cfg = BrokerConfig(broker.url)
        server = ArtifactServer(ContentStore(tmp / "store"), cfg, workers=4).start()
        httpd = serve_http(ContentStore(tmp / "store"), "127.0.0.1:0") if args.source == "http" else None
        http_url = f"http://127.0.0.1:{httpd.server_address[1]}/blobs/sha256/{{sha256}}" if httpd else None
        sysbytes = SysBytes(broker.url)
        sim = Simulator(
            args.devices,
            broker=cfg,
            trust=[str(pub)],
            groups=["bench"],
            id_prefix="b",
            sysroots=[str(ROOT / "agent/sysroots" / c) for c in CLASSES],
            state_dir=str(tmp / "fleet"),
            probation_s=1.0,
            store=tmp / "store",  # registers the simulated devices: the rollout believes their signed reports
        )
        t0 = time.monotonic()
        sim.start()
        say(f"{args.devices} devices up in {time.monotonic() - t0:.1f} s")
        pkg = write_package(tmp / "pkg", heavy_model(args.size_mb), name="heavy", version="1")
        try:
            before = sysbytes.settled()
            spec = RolloutSpec(
                "heavy", "1", group="bench", canary=args.canary, wave_size=args.wave_size, deadline_s=1800
            ).validate()
            t0 = time.monotonic()
            summary = run_rollout(
                pkg,
                spec,
                key_file=key,
                store=tmp / "store",
                broker=cfg,
                wait=True,
                tick_s=0.5,
                http_url=http_url,
                http_only=httpd is not None,
            )
            converge_s = time.monotonic() - t0
            after = sysbytes.settled()
        finally:
            stats, served = sim.stats(), dict(server.stats)
            sim.stop()
            server.stop()
            sysbytes.link.stop()
            if httpd is not None:
                httpd.shutdown()
        size = _artifact_size(tmp / "store")
        egress = after - before
        doc = {
            "devices": args.devices,
            "artifact_bytes": size,
            "converge_s": round(converge_s, 2),
            "state": summary["state"],
            "counts": summary["counts"],
            "broker_egress_bytes": egress,
            "egress_ratio": round(egress / (args.devices * size), 4),
            "goal_ratio": 1.05,
            "artifact_server": served,
            "chunk_ratio": round(served.get("bytes", 0) / (args.devices * size), 4),
            "qualification": stats["qualification"],
            "canary": args.canary,
            "wave_size": args.wave_size,
            "source": args.source,
        }
    print(json.dumps(doc, indent=None if args.json else 2))
    return doc


def _artifact_size(store: Path) -> int:
    from agent.artifacts.store import ContentStore

    cs = ContentStore(store)
    return max(cs.size(s) for s in cs.list())


if __name__ == "__main__":
    main()
