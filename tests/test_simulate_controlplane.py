"""`fleet simulate --control-plane URL` (issue 37, 3) with real parts: a running service (in this process, SQLite)
and a real Mosquitto. Three simulated devices enroll with an enrollment token (accepted at once, with its groups),
two more ask without one and wait as pending until the simulator accepts them with an operator token
(`--accept`); a version pushed through the service reaches all five over the broker, and each one's decision
record, with its qualification and trial attestations verified against that device's key by the service, is in
the API. SIGTERM stops both simulators cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from clirunner import ROOT, edge_agent
from cp_support import fleet_service
from support.stop import stop
from support.wait import wait_for

from agent.artifacts.keys import generate
from agent.samples import sample_tiny_package

pytestmark = [pytest.mark.timeout(600)]
WAIT_S = 180.0  # generous for a loaded 2-CPU host; a pass takes far less


def _simulate(tmp: Path, name: str, broker: str, pub: Path, url: str, *extra: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "agent", "fleet", "simulate", "--trust", str(pub), "--group", "lab"]
    args += ["--broker", broker, "--control-plane", url, "--id-prefix", name, "--probation", "1", "--json", *extra]
    out = (tmp / f"{name}.out").open("wb")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(args, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, env=env)


def _events(tmp: Path, name: str) -> list[dict]:
    out = []
    for line in (tmp / f"{name}.out").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # stderr's progress lines
    return out


def _evidence(client: httpx.Client, device_id: str) -> dict | None:
    """The device's decision record once both its attestations are there, verified by the service; else None."""
    docs = client.get(f"/api/v1/devices/{device_id}").json().get("decisions") or []
    for d in docs:
        atts = d["doc"].get("attestations") or {}
        if set(atts) == {"qualification", "trial"} and all(a["verified"] for a in atts.values()):
            return d
    return None


def test_simulated_devices_enroll_with_a_running_service_and_post_their_evidence(tmp_path):
    from agent.artifacts.packtar import write_targz

    with fleet_service(tmp_path) as (broker, fleet_key, fleet_pub, cp, url, client):
        grant = client.post("/api/v1/enroll-tokens", json={"name": "sim", "groups": ["lab"], "uses": 3})
        assert grant.status_code == 201, grant.text
        (tmp_path / "enroll.token").write_text(grant.json()["token"] + "\n")
        (tmp_path / "admin.token").write_text(cp.admin_token + "\n")
        sims = {
            "tok": _simulate(
                tmp_path, "tok", broker.url, fleet_pub, url,
                *("--devices", "3", "--sysroots", "rpi4-4gb", "--enroll-token-file", "enroll.token"),
            ),
            "acc": _simulate(
                tmp_path, "acc", broker.url, fleet_pub, url,
                *("--devices", "2", "--sysroots", "amd-epyc-x86", "--accept", "--token-file", "admin.token"),
            ),
        }  # fmt: skip
        try:
            token_ids = {f"tok-rpi4-4gb-{n}" for n in (1, 2, 3)}
            accept_ids = {f"acc-amd-epyc-x86-{n}" for n in (1, 2)}

            def accepted():
                rows = client.get("/api/v1/devices?state=accepted&limit=1000").json()["devices"]
                return rows if {r["device_id"] for r in rows} == token_ids | accept_ids else None

            rows = {r["device_id"]: r for r in wait_for(accepted, WAIT_S, "five accepted devices", step=0.5)}
            for dev in token_ids:
                assert rows[dev]["decided_by"] == "token:sim" and rows[dev]["groups"] == ["lab"], rows[dev]
            for dev in accept_ids:  # pending first, then accepted by the simulator as the admin operator
                assert not rows[dev]["decided_by"].startswith("token:") and rows[dev]["groups"] == ["lab"]
            audit = client.get("/api/v1/audit?limit=1000").json()["entries"]
            asked = [a for a in audit if a["action"] == "enroll.request"]
            pending = {a["target"] for a in asked if a["detail"].get("state") == "pending"}
            assert accept_ids <= pending and not token_ids & pending, audit
            assert accept_ids <= {a["target"] for a in audit if a["action"] == "device.accept"}, audit

            pkg = tmp_path / "tiny-1.tar.gz"
            write_targz(sample_tiny_package(tmp_path / "tiny-1", name="tiny", version="1"), pkg)
            r = client.put("/api/v1/models/tiny/versions/1", content=pkg.read_bytes())
            assert r.status_code == 201, r.text
            r = client.post("/api/v1/push", json={"model": "tiny", "version": "1", "groups": ["lab"]})
            assert r.status_code == 200, r.text
            for dev in sorted(token_ids | accept_ids):
                got = wait_for(lambda d=dev: _evidence(client, d), WAIT_S, f"{dev}'s evidence", step=0.5)
                assert (got["model"], got["version"]) == ("tiny", "1"), got
                assert got["doc"]["decision"]["selected"], got["doc"]["decision"]
            said = {name: [e for e in _events(tmp_path, name) if e.get("event") == "control_plane"] for name in sims}
            assert said["tok"] and said["tok"][-1]["accepted"] == 3, said
            assert said["acc"] and said["acc"][-1]["accepted"] == 2, said
        finally:
            codes = {name: stop(proc) for name, proc in sims.items()}
            client.close()
        logs = {name: (tmp_path / f"{name}.out").read_text()[-3000:] for name in sims}
        assert codes == {"tok": 0, "acc": 0}, (codes, logs)
        assert all(e["event"] == "stopped" for e in (_events(tmp_path, n)[-1] for n in sims)), logs


def test_control_plane_options_are_refused_without_what_they_need(tmp_path):
    _, pub, _ = generate(tmp_path / "keys")
    base = ("fleet", "simulate", "--devices", "1", "--trust", pub, "--broker", "mqtt://127.0.0.1:1")
    alone = edge_agent(*base, "--accept", "--enroll-token-file", pub)
    assert alone.returncode == 2 and "--enroll-token-file, --accept: only with --control-plane URL" in alone.stderr
    no_token = edge_agent(*base, "--control-plane", "http://127.0.0.1:1", "--accept", env={"EDGE_AGENT_CP_TOKEN": ""})
    assert no_token.returncode != 0 and "needs an operator token" in no_token.stderr, no_token.stderr
