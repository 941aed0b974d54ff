"""The control-plane service as people run it: `edge-agent control-plane --config FILE` in its own process,
devices enrolling with `edge-agent control-plane enroll`, `fleet rollout --control-plane URL` and
`fleet status --control-plane URL` through its API; the service SIGKILLed mid-rollout resumes it with no
device told twice; the database on a full disk fails writes with a clear error while reads keep working."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from brokers import Mosquitto, free_port
from clirunner import EXE, ROOT, edge_agent
from cp_support import cp_health, start_cp
from support.stop import stop
from support.wait import wait_for

from agent import sysroots
from agent.artifacts.keys import generate
from agent.samples import tiny_model, write_package
from agent.sim.simulator import Simulator
from agent.transport.mqtt import BrokerConfig

SYSROOTS = sysroots.root()
WAIT_S = 240.0

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def _wait_up(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    try:
        wait_for(lambda: cp_health(url), timeout, "the control plane to answer", proc=proc, step=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {log.read_text()[-2000:]}") from None


def _until(what, check, timeout=WAIT_S, every=0.5):
    return wait_for(check, timeout, what, step=every)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    """The service's database: SQLite beside the store, or a real PostgreSQL server of the test's own."""
    if request.param == "sqlite":
        yield {}
        return
    from cp_support import postgres

    with postgres(tmp_path / "pg") as url:
        yield {"url": url}


def test_service_cli_enroll_rollout_and_resume_after_sigkill(tmp_path, database):
    with Mosquitto(tmp_path / "mosquitto") as broker:
        key, pub, _ = generate(tmp_path / "keys")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cfg = tmp_path / "cp" / "control-plane.yaml"
        cfg.parent.mkdir()
        cfg.write_text(
            yaml.safe_dump(
                {
                    "listen": {"host": "127.0.0.1", "port": port},
                    "store": "store",
                    "signing_key": str(key),
                    "mqtt": {"url": broker.url},
                    "tick_s": 0.3,
                    **({"database": database} if database else {}),
                }
            )
        )
        log = tmp_path / "cp.log"
        sim = Simulator(
            4,
            broker=BrokerConfig(broker.url),
            trust=[str(pub)],
            groups=["lab"],
            id_prefix="sv",
            sysroots=[str(SYSROOTS / "rpi5-8gb")],
            state_dir=str(tmp_path / "sim"),
            probation_s=1.0,
        ).start()
        proc = start_cp(cfg, log)
        try:
            _wait_up(url, proc, log)
            token_file = cfg.parent / "admin.token"
            token = token_file.read_text().strip()
            h = {"Authorization": f"Bearer {token}"}
            grant = httpx.post(
                url + "/api/v1/enroll-tokens", json={"name": "lab", "groups": ["lab"], "uses": 4}, headers=h
            )
            (tmp_path / "enroll.token").write_text(grant.json()["token"])
            for dev, cls in sim.device_class.items():  # the device side, as a device runs it
                agent_yaml = tmp_path / f"{dev}.yaml"
                agent_yaml.write_text(yaml.safe_dump(sim._config_dict(dev, cls)))
                r = edge_agent(
                    "control-plane",
                    "enroll",
                    "--agent-config",
                    agent_yaml,
                    "--url",
                    url,
                    "--token-file",
                    tmp_path / "enroll.token",
                )
                assert r.returncode == 0 and json.loads(r.stdout)["state"] == "accepted", r.stderr

            def verified():
                devs = httpx.get(url + "/api/v1/devices", headers=h).json()["devices"]
                return len(devs) == 4 and all(d["status_ts"] and d["online"] for d in devs)

            _until("4 verified statuses", verified)
            pkg = write_package(tmp_path / "tiny-1", tiny_model(1.0), name="tiny", version="1")
            # one device per wave, so a wave is in flight when the service is killed
            roll = subprocess.Popen(
                [
                    *EXE,
                    "fleet",
                    "rollout",
                    str(pkg),
                    "--name",
                    "tiny",
                    "--version",
                    "1",
                    "--all",
                    "--canary",
                    "1",
                    "--wave-size",
                    "1",
                    "--deadline",
                    str(int(WAIT_S)),
                    "--control-plane",
                    url,
                    "--token-file",
                    str(token_file),
                    "--wait",
                    "--json",
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

            def some_done():
                r = httpx.get(url + "/api/v1/rollouts/tiny-1", headers=h)
                prog = r.json().get("progress") if r.status_code == 200 else None
                return prog and prog["counts"].get("succeeded", 0) >= 1 and prog["counts"].get("succeeded") < 4

            _until("the first devices of tiny-1", some_done)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            roll.kill()
            roll.wait()
            proc = start_cp(cfg, log)  # resumes every rollout from the database
            _wait_up(url, proc, log)
            done = _until(
                "tiny-1 finished after the restart",
                lambda: (
                    (r := httpx.get(url + "/api/v1/rollouts/tiny-1", headers=h).json())["phase"] == "finished" and r
                ),
            )
            assert done["state"] == "completed", done["progress"]["counts"]
            for dev in sim.agents:  # no device told twice: one deployment of tiny 1 each
                journals = [json.loads(p.read_text()) for p in (sim.state_dir / dev / "deployments").glob("*.json")]
                ones = [j for j in journals if j.get("model") == "tiny" and j.get("version") == "1"]
                assert len(ones) == 1, (dev, [(j.get("model"), j.get("version"), j.get("state")) for j in journals])
            r = edge_agent("fleet", "status", "--control-plane", url, "--token-file", token_file, "--json")
            assert r.returncode == 0, r.stderr
            rows = json.loads(r.stdout)["devices"]
            assert {d["device_id"]: d["models"]["tiny"]["version"] for d in rows} == {d: "1" for d in sim.agents}
            # a plain push of version 2 to the group through the service, waiting for verified reports
            pkg2 = write_package(tmp_path / "tiny-2", tiny_model(2.0), name="tiny", version="2")
            r = edge_agent(
                "fleet",
                "push",
                pkg2,
                "--name",
                "tiny",
                "--version",
                "2",
                "--group",
                "lab",
                "--control-plane",
                url,
                "--token-file",
                token_file,
                "--wait",
                str(int(WAIT_S)),
                "--json",
            )
            assert r.returncode == 0, r.stdout + r.stderr
            pushed = json.loads(r.stdout)
            assert pushed["ok"] and set(pushed["devices"]) == set(sim.agents), pushed
            # its progress on stderr, as a push over the broker says it: stored, published, each device's change
            said = [json.loads(ln) for ln in r.stderr.splitlines() if ln.startswith("{")]
            assert [d["event"] for d in said[:2]] == ["store", "published"], said
            done = {d["device_id"] for d in said if d["event"] == "device" and d["result"] == "committed"}
            assert done == set(sim.agents), said
        finally:
            stop(proc, 30)
            sim.stop()


def test_full_disk_fails_writes_clearly_and_reads_keep_working(tmp_path):
    """The SQLite database on an 8 MiB tmpfs: once it is full a write is refused with 507 and a message naming the
    full disk, the database stays consistent, and listing devices keeps working."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    from cp_support import running_service

    from agent.artifacts.keys import device_key
    from agent.transport.cpclient import enroll_request as request

    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        limits = {"address_burst": 1000, "address_per_minute": 1000}  # up to 200 enrollments from one address
        with running_service(tmp_path, database={"url": f"sqlite:///{mnt / 'cp.db'}"}, limits=limits) as (cp, url):
            c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
            filler = mnt / "filler"
            try:  # leave the database no room
                with open(filler, "wb") as f:
                    while True:
                        f.write(b"\0" * 4096)
                        f.flush()
            except OSError:
                pass
            codes, pad = [], {f"pad{j}": "x" * 250 for j in range(12)}  # 3 KB (hardware values: 256 at most)
            for i in range(200):
                doc = request(f"dev-{i}", device_key(tmp_path / "keys" / f"dev-{i}"), hardware=pad)
                r = c.post("/api/v1/enroll", json=doc)
                codes.append(r.status_code)
                if r.status_code == 507:
                    assert "disk is full" in r.json()["error"], r.json()
                    break
            assert codes[-1] == 507, codes
            listed = c.get("/api/v1/devices", params={"limit": 1000})
            assert listed.status_code == 200
            assert listed.json()["total"] == codes.count(202)
            assert c.get("/").status_code in (200, 303)
            filler.unlink()
            r = c.post("/api/v1/enroll", json=request("after", device_key(tmp_path / "keys" / "after")))
            assert r.status_code == 202  # room again: writes work again
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
