"""The control plane and simulated devices on a 3-node NATS cluster (JetStream and the MQTT gateway on each
node): a rollout converges with one node SIGKILLed mid-rollout. The service and half of the devices use node 0,
the other half node 2; node 1 (a JetStream peer holding replicas of the MQTT streams) is killed after the canary.
(Failing over from a killed node to another URL is tests/test_nats_cluster.py's.) EDGE_AGENT_CP_NATS_DEVICES sets
the fleet size (default 20; the 200-device start that once stalled was paho's select() past fd 1024, see
docs/control-plane.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from brokers import NatsCluster
from cp_support import running_service
from support.wait import wait_for

from agent import sysroots
from agent.artifacts.keys import device_key, generate
from agent.artifacts.packtar import write_targz
from agent.samples import tiny_model, write_package
from agent.sim.simulator import Simulator
from agent.transport.cpclient import enroll_request as request
from agent.transport.mqtt import BrokerConfig

ROOT = Path(__file__).resolve().parent.parent
DEVICES = int(os.environ.get("EDGE_AGENT_CP_NATS_DEVICES", "20"))
WAIT_S = 900.0
PER_SIM = 10

pytestmark = [pytest.mark.timeout(2400), pytest.mark.slow]


class PatientSimulator(Simulator):
    """The simulator with a longer readiness deadline: NATS builds replicated JetStream state for every new MQTT
    session, which on a loaded 2-CPU host takes longer than the simulator's default minute for the later ones."""

    def wait_ready(self, timeout: float = 300.0) -> None:
        super().wait_ready(timeout)


def _until(what, check, timeout=WAIT_S, every=1.0):
    return wait_for(check, timeout, what, step=every)


def test_rollout_converges_on_a_nats_cluster_with_a_node_killed(tmp_path):
    with NatsCluster(tmp_path / "nats") as cluster:
        key, pub, _ = generate(tmp_path / "keys")
        first, last = cluster.nodes[0], cluster.nodes[2]
        sims = []
        try:
            # simulators of at most PER_SIM devices each (each waits for its own devices' sessions: NATS builds
            # replicated JetStream state for every new MQTT session), alternating between node 0 and node 2
            for i, start in enumerate(range(0, DEVICES, PER_SIM)):
                node = (first, last)[i % 2]
                sims.append(
                    PatientSimulator(
                        min(PER_SIM, DEVICES - start),
                        broker=BrokerConfig(node.url),
                        trust=[str(pub)],
                        groups=["fleet"],
                        id_prefix=f"s{i}",
                        sysroots=[str(sysroots.path("rpi5-8gb"))],
                        state_dir=str(tmp_path / f"sim{i}"),
                        probation_s=1.0,
                    ).start()
                )
            doc = {"mqtt": {"url": first.url}, "signing_key": str(key), "tick_s": 0.5}
            with running_service(tmp_path / "cp", **doc) as (cp, url):
                api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=120)
                grant = api.post("/api/v1/enroll-tokens", json={"name": "all", "groups": ["fleet"], "uses": DEVICES})
                token = grant.json()["token"]
                for sim in sims:
                    for dev in sim.agents:
                        r = api.post("/api/v1/enroll", json=request(dev, device_key(sim.state_dir / dev), token=token))
                        assert r.status_code == 202 and r.json()["state"] == "accepted", r.text

                def verified():
                    page = api.get("/api/v1/devices", params={"online": True, "limit": 1}).json()
                    return page["total"] == DEVICES and all(
                        d["status_ts"] for d in api.get("/api/v1/devices", params={"limit": 1000}).json()["devices"]
                    )

                _until(f"{DEVICES} verified statuses", verified)
                pkg = write_package(tmp_path / "tiny-1", tiny_model(1.0), name="tiny", version="1")
                tar = tmp_path / "tiny-1.tar.gz"
                write_targz(pkg, tar)
                assert api.put("/api/v1/models/tiny/versions/1", content=tar.read_bytes()).status_code == 201
                t0 = time.monotonic()
                body = {
                    "model": "tiny",
                    "version": "1",
                    "group": "fleet",
                    "canary": "1",
                    "wave_size": "50%",
                    "deadline_s": WAIT_S,
                }
                assert api.post("/api/v1/rollouts", json=body).status_code == 202

                def canary_done():
                    prog = api.get("/api/v1/rollouts/tiny-1").json().get("progress") or {}
                    return prog.get("counts", {}).get("succeeded", 0) >= 1

                _until("the canary", canary_done)
                cluster.kill(1)  # mid-rollout: the next wave is being published
                done = _until(
                    "tiny-1 finished",
                    lambda: (r := api.get("/api/v1/rollouts/tiny-1").json())["phase"] == "finished" and r,
                )
                took = time.monotonic() - t0
                assert done["state"] == "completed", done["progress"]["counts"]
                assert done["progress"]["counts"] == {"succeeded": DEVICES}
                print(
                    f"\n{DEVICES} devices on a 3-node NATS cluster, one node killed after the canary: "
                    f"start-to-converge {took:.1f} s"
                )
        finally:
            for sim in sims:
                sim.stop()
