"""One meaning of "committed" through the service: a simulated device (a real DeviceAgent on a real Mosquitto)
with a 60 s probation; `fleet push --control-plane URL --wait` says "on probation" with the time left, never
"committed", until the device itself reports the commit, and the dashboard's device page says the same."""

from __future__ import annotations

import subprocess
import threading

import httpx
import pytest
from brokers import Mosquitto
from clirunner import EXE, ROOT
from cp_support import running_service, until

from agent import sysroots
from agent.artifacts.keys import device_key, generate
from agent.samples import tiny_model, write_package
from agent.sim.simulator import Simulator
from agent.transport.cpclient import enroll_request as request
from agent.transport.mqtt import BrokerConfig

SYSROOTS = sysroots.root()
PROBATION_S = 60.0

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_push_wait_says_on_probation_until_the_device_commits(tmp_path):
    with Mosquitto(tmp_path / "mosquitto") as broker:
        key, pub, _ = generate(tmp_path / "keys")
        sim = Simulator(
            1,
            broker=BrokerConfig(broker.url),
            trust=[str(pub)],
            groups=["lab"],
            id_prefix="pb",
            sysroots=[str(SYSROOTS / "amd-epyc-x86")],
            state_dir=str(tmp_path / "sim"),
            probation_s=PROBATION_S,
        ).start()
        try:
            doc = {"mqtt": {"url": broker.url}, "signing_key": str(key), "tick_s": 0.3}
            with running_service(tmp_path / "cp", **doc) as (cp, url):
                (dev,) = sim.agents
                api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=60)
                cls = sim.device_class[dev]
                assert api.post("/api/v1/enroll", json=request(dev, device_key(sim.state_dir / dev), target=cls.target))
                assert api.post(f"/api/v1/devices/{dev}/accept", json={"groups": ["lab"]}).status_code == 200
                until("a verified status", lambda: api.get(f"/api/v1/devices/{dev}").json().get("status_ts"), 240)
                token = tmp_path / "op.token"
                token.write_text(cp.admin_token)
                pkg = write_package(tmp_path / "tiny-1", tiny_model(1.0), name="tiny", version="1")
                _push(api, url, token, pkg, dev, sim.agents[dev], cp.admin_token)
        finally:
            sim.stop()


def _push(api, url, token, pkg, dev, agent, admin_token):
    proc = subprocess.Popen(
        [
            *EXE,
            *("fleet", "push", str(pkg), "--name", "tiny", "--version", "1", "--group", "lab"),
            *("--control-plane", url, "--token-file", str(token), "--wait", "400"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[tuple[str, str]] = []  # (stderr line, the device's own model state when the line arrived)

    def read():
        assert proc.stderr is not None
        for line in proc.stderr:
            state = (agent.status()["models"].get("tiny") or {}).get("state")
            said.append((line.rstrip("\n"), str(state)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        on_probation = until(
            "the push to say on probation",
            lambda: [s for s in said if f"push: {dev}: on probation" in s[0]],
            timeout=300,
        )
        line, state = on_probation[0]
        assert state == "probation" and " s left" in line, on_probation
        # the API keeps the device's own word: probation, with when it ends; the dashboard says on probation
        model = api.get(f"/api/v1/devices/{dev}").json()["models"]["tiny"]
        assert model["state"] == "probation" and model["probation_s"] == PROBATION_S, model
        assert model["probation_ends"] == pytest.approx(model["probation_since"] + PROBATION_S)
        page = httpx.get(f"{url}/devices/{dev}", headers={"Authorization": f"Bearer {admin_token}"}, timeout=60)
        assert page.status_code == 200 and "on probation" in page.text, page.text[-2000:]
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert proc.returncode == 0, (out, said)
    committed = [s for s in said if f"push: {dev}: committed" in s[0]]
    assert committed, said
    first = said.index(committed[0])
    assert all("committed" not in line for line, _ in said[:first]), said  # never before
    assert said.index(on_probation[0]) < first
    assert agent.status()["models"]["tiny"]["state"] == "committed"  # by the device's own word
    assert f"{dev}: committed" in out, out
    assert api.get(f"/api/v1/devices/{dev}").json()["models"]["tiny"]["state"] == "committed"
