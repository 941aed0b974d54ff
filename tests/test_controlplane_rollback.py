"""A roll back through the real service reaches every device that took the version: simulated devices (real
DeviceAgents on a real Mosquitto) in two cohorts, a v2 rollout halted mid-wave after one cohort completed,
then rolled back through the API: every device that got v2 ends on v1 (its own status and the API agree), the
roll back is a tracked operation with a result, and asking again is accepted (no 409)."""

from __future__ import annotations

import json

import httpx
import pytest
from brokers import Mosquitto
from clirunner import edge_agent
from cp_support import running_service, tiny_1_everywhere, until

from agent import sysroots
from agent.artifacts.keys import device_key, generate
from agent.sim.simulator import Simulator
from agent.transport.cpclient import enroll_request as request
from agent.transport.mqtt import BrokerConfig

SYSROOTS = sysroots.root()
WAIT_S = 300.0

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def _sim(tmp_path, broker, pub, count, sysroot, prefix):
    return Simulator(
        count,
        broker=BrokerConfig(broker.url),
        trust=[str(pub)],
        groups=["lab"],
        id_prefix=prefix,
        sysroots=[str(SYSROOTS / sysroot)],
        state_dir=str(tmp_path / prefix),
        probation_s=1.0,
    )


def test_rollback_of_a_halted_canary_returns_every_device_that_took_v2(tmp_path):
    with Mosquitto(tmp_path / "mosquitto") as broker:
        key, pub, _ = generate(tmp_path / "keys")
        # two cohorts by target: a small one that completes first, a larger one halted mid-wave
        small = _sim(tmp_path, broker, pub, 2, "amd-epyc-x86", "rbs").start()
        large = _sim(tmp_path, broker, pub, 5, "rpi5-8gb", "rbl").start()
        agents = {**small.agents, **large.agents}
        try:
            doc = {"mqtt": {"url": broker.url}, "signing_key": str(key), "tick_s": 0.3}
            with running_service(tmp_path / "cp", **doc) as (cp, url):
                api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=60)
                for sim in (small, large):
                    for dev, cls in sim.device_class.items():
                        key_ = device_key(sim.state_dir / dev)
                        assert api.post("/api/v1/enroll", json=request(dev, key_, target=cls.target)).is_success
                        r = api.post(f"/api/v1/devices/{dev}/accept", json={"groups": ["lab"]})
                        assert r.status_code == 200, r.text
                _run(api, agents, tmp_path)
        finally:
            small.stop()
            large.stop()


def _rollback_answered(api, what: str, answered) -> dict:
    """tiny-2 once it is finished and `answered(its roll back operation)` holds ({} before any roll back)."""
    return until(
        what,
        lambda: (
            (r := api.get("/api/v1/rollouts/tiny-2").json())["phase"] == "finished"
            and answered(r["progress"].get("rollback") or {})
            and r
        ),
        WAIT_S,
    )


def _run(api, agents, tmp_path):
    body, first = tiny_1_everywhere(api, tmp_path, len(agents), WAIT_S)
    assert first["state"] == "completed", first["progress"]["counts"]

    # v2 by target, a canary then one device a wave: the small cohort completes while the large one is mid-wave
    body = {**body, "version": "2", "cohort_by": "target", "canary": "1", "wave_size": "1"}
    assert api.post("/api/v1/rollouts", json=body).status_code == 202

    def one_cohort_done():
        prog = api.get("/api/v1/rollouts/tiny-2").json().get("progress") or {}
        states = [c["state"] for c in (prog.get("cohorts") or {}).values()]
        return "completed" in states and "running" in states and prog

    until("one cohort of tiny-2 completed, the other mid-wave", one_cohort_done, WAIT_S)
    assert api.post("/api/v1/rollouts/tiny-2/halt").status_code == 200
    halted = api.get("/api/v1/rollouts/tiny-2").json()
    waiting = [d["waiting_for"] for d in halted["progress"]["devices"] if d["result"] in ("pending", "in_progress")]
    assert waiting and all(waiting), halted["progress"]["devices"]  # the page says what each one waits for
    r = api.post("/api/v1/rollouts/tiny-2/rollback")
    assert r.status_code == 200, r.text
    done = _rollback_answered(api, "tiny-2 rolled back", lambda op: op.get("state") in ("done", "incomplete"))
    op = done["progress"]["rollback"]
    assert op["state"] == "done" and op["remaining"] == [] and op["attempts"] == 1, op
    results = {d["device_id"]: d for d in done["progress"]["devices"]}
    took = {d for d, r in results.items() if r["result"] == "rolled_back"}
    assert len(took) >= 3, results  # the completed cohort (2) and at least the large cohort's canary
    assert {r["result"] for r in results.values()} <= {"rolled_back", "cancelled", "not_reached"}, results
    for dev in agents:  # every device runs v1 again, by its own status and by the API
        until(
            f"{dev} back on 1",
            lambda dev=dev: (agents[dev].status()["models"].get("tiny") or {}).get("version") == "1",
            60,
        )

    def api_on_1():
        devs = api.get("/api/v1/devices", params={"state": "accepted", "limit": 100}).json()["devices"]
        return all((d["models"].get("tiny") or {}).get("version") == "1" for d in devs) and devs

    assert len(until("the API to show every device on 1", api_on_1, 60)) == len(agents)

    # asking again is accepted: a second tracked operation, done with nothing left to do
    again = api.post("/api/v1/rollouts/tiny-2/rollback")
    assert again.status_code == 200, again.text
    second = _rollback_answered(api, "the second roll back answered", lambda op: op.get("attempts") == 2)
    assert second["progress"]["rollback"]["state"] == "done" and second["rollback_requested"].endswith("(request 2)")
    audit = api.get("/api/v1/audit", params={"limit": 1000}).json()["entries"]
    assert sum(1 for a in audit if a["action"] == "rollout.rollback" and a["target"] == "tiny-2") == 2

    # the CLI: the rollout's roll back once more (accepted, done), then the group's without --version: each
    # device goes back to what it ran before tiny-2 reached it (1), never to its `previous` (2, rolled back from)
    token = tmp_path / "op.token"
    token.write_text(api.headers["Authorization"].removeprefix("Bearer "))
    url = str(api.base_url).rstrip("/")
    cp = ("--control-plane", url, "--token-file", token, "--wait", "120", "--json")
    r = edge_agent("fleet", "rollback", "tiny", "--rollout", "tiny-2", *cp)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["rollback"]["state"] == "done" and doc["rollback"]["attempts"] == 3, doc
    r = edge_agent("fleet", "rollback", "tiny", "--group", "lab", *cp)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["versions"] == {"1": sorted(agents)} and doc["ok"], doc
    assert {d["result"] for d in doc["devices"].values()} == {"committed"}, doc
