"""The control plane in a real browser (Playwright driving Debian's chromium through its executable path):
20 simulated devices (real DeviceAgents on a real Mosquitto) ask to enroll with their own keys, an operator
accepts them on the pending page, starts a rollout from the rollouts page, watches its waves, halts it and rolls
it back; screenshots of the overview, a device page and a rollout page are kept ($EDGE_AGENT_ARTIFACTS or
test-artifacts/control-plane/)."""

from __future__ import annotations

import httpx
import pytest
from brokers import Mosquitto
from cp_support import artifacts_dir, browser_page, need_chromium, running_service, tiny_1_everywhere
from support.wait import wait_for

from agent import sysroots
from agent.artifacts.keys import device_key, generate
from agent.sim.simulator import Simulator
from agent.transport.cpclient import enroll_request as request
from agent.transport.cpclient import upload_decisions
from agent.transport.mqtt import BrokerConfig

SYSROOTS = sysroots.root()
WAIT_S = 300.0

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]


def _until(what: str, check, timeout: float = WAIT_S, every: float = 0.5):
    return wait_for(check, timeout, what, step=every)


def test_enroll_20_devices_roll_out_halt_and_roll_back_in_a_browser(tmp_path):
    need_chromium()
    shots = artifacts_dir()
    with Mosquitto(tmp_path / "mosquitto") as broker:
        key, pub, _ = generate(tmp_path / "keys")
        sim = Simulator(
            20,
            broker=BrokerConfig(broker.url),
            trust=[str(pub)],
            groups=["lab"],
            id_prefix="cp",
            sysroots=[str(SYSROOTS / "amd-epyc-x86"), str(SYSROOTS / "rpi5-8gb")],
            state_dir=str(tmp_path / "sim"),
            probation_s=1.0,
        ).start()
        try:
            doc = {"mqtt": {"url": broker.url}, "signing_key": str(key), "tick_s": 0.3}
            with running_service(tmp_path / "cp", **doc) as (cp, url):
                api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=60)
                for dev, cls in sim.device_class.items():
                    r = api.post(
                        "/api/v1/enroll", json=request(dev, device_key(sim.state_dir / dev), target=cls.target)
                    )
                    assert r.status_code == 202 and r.json()["state"] == "pending", r.text
                with browser_page() as page:
                    _run_browser(page, url, cp, api, sim, tmp_path, shots)
        finally:
            sim.stop()


def _run_browser(page, url, cp, api, sim, tmp_path, shots):
    page.goto(url + "/")
    assert "/login" in page.url  # no token, no dashboard
    page.fill("input[name=token]", cp.admin_token)
    page.click("button[type=submit]")
    page.goto(url + "/pending")
    assert page.locator("#pending button[name=accept]").count() == 20
    for _ in range(20):  # accept each device from the pending page
        page.locator("#pending input[name=groups]").first.fill("lab")
        page.locator("#pending button[name=accept]").first.click()
        page.wait_for_load_state()
    assert "no device is waiting" in page.inner_text("#pending")

    # version 1 everywhere first (through the API), so a roll back has somewhere to return to
    _, first = tiny_1_everywhere(api, tmp_path, 20, WAIT_S, every=0.5)
    assert first["state"] == "completed", [
        (d["device_id"], d["result"], d["reason"], sim.agents[d["device_id"]].status().get("in_flight"))
        for d in first["progress"]["devices"]
        if d["result"] != "succeeded"
    ]

    # version 2 from the browser: canary 1 then waves of 25%
    page.goto(url + "/rollouts")
    page.select_option("select[name=model_version]", "tiny 2")
    page.select_option("select[name=group]", "lab")
    page.fill("input[name=canary]", "1")
    page.fill("input[name=wave_size]", "25%")
    page.fill("input[name=deadline_s]", str(int(WAIT_S)))
    page.click("#start-rollout button[type=submit]")
    page.wait_for_url(url + "/rollouts/tiny-2")

    def canary_done():
        prog = api.get("/api/v1/rollouts/tiny-2").json().get("progress") or {}
        cohort = (prog.get("cohorts") or {}).get("all") or {}
        return cohort.get("wave", 0) >= 1 and prog["counts"].get("succeeded", 0) >= 1

    _until("the canary of tiny-2 to succeed and the next wave to start", canary_done)
    page.reload()
    assert "canary" in page.inner_text("table.waves")
    page.screenshot(path=str(shots / "rollout-waves.png"), full_page=True)
    page.click("#halt")
    page.wait_for_load_state()
    assert page.inner_text("#halted") == "yes"
    halted = api.get("/api/v1/rollouts/tiny-2").json()
    assert halted["halted"] and halted["phase"] == "running"
    page.click("#rollback-btn")
    page.wait_for_load_state()
    done = _until(
        "tiny-2 rolled back", lambda: (r := api.get("/api/v1/rollouts/tiny-2").json())["phase"] == "finished" and r
    )
    assert done["state"] == "halted"
    results = {d["device_id"]: d for d in done["progress"]["devices"]}
    took = [d for d, r in results.items() if r["result"] == "rolled_back"]
    assert took, results  # at least the canary took 2 and went back
    assert {r["result"] for r in results.values()} <= {"rolled_back", "cancelled", "not_reached"}, [
        (d, r["result"], r["reason"]) for d, r in results.items() if r["result"] != "rolled_back"
    ]
    for dev in results:  # every device serves version 1 again
        _until(
            f"{dev} back on 1",
            lambda dev=dev: (sim.agents[dev].status()["models"].get("tiny") or {}).get("version") == "1",
            60,
        )
    page.reload()
    assert page.inner_text("#state") == "halted"
    page.screenshot(path=str(shots / "rollout.png"), full_page=True)

    # a device uploads its signed decision records; its page shows the evidence
    dev = took[0]
    assert upload_decisions(url, dev, device_key(sim.state_dir / dev), sim.state_dir / dev)
    page.goto(url + f"/devices/{dev}")
    evidence = page.inner_text("table.evidence")
    assert "passed" in evidence and "p50" in evidence
    page.screenshot(path=str(shots / "device.png"), full_page=True)
    page.goto(url + "/")
    cohorts = page.inner_text("#cohorts")
    assert "tiny 1" in cohorts
    page.screenshot(path=str(shots / "overview.png"), full_page=True)
    audit = api.get("/api/v1/audit", params={"limit": 1000}).json()["entries"]
    actions = {a["action"] for a in audit if a["actor"] == "operator:admin"}
    assert {"device.accept", "rollout.start", "rollout.halt", "rollout.rollback"} <= actions
