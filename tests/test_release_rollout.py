"""Agent releases rolled out from the control plane like models (issue 40, `kind: agent`), with real parts: a
running service (SQLite, in this process), a real Mosquitto and `fleet simulate --control-plane` (real
DeviceAgents, each with a real release root; see agent/sim/release_sim.py for what the simulator stands in for:
no venv is built and no process restarts, the trial's verdict is `--release-fail`'s). A release is a wheelhouse
with its manifest signed by the fleet key (agent.release.manifest.make), uploaded as a tar.gz; its "wheel" is a
small file of bytes, which `release verify` checks by sha256 like any wheel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from clirunner import ROOT
from cp_support import fleet_service, rollout_done, running_service
from support.stop import stop
from support.wait import wait_for

from agent.artifacts.keys import generate, load_private_key

pytestmark = [pytest.mark.timeout(900)]
WAIT_S = 240.0  # generous for a loaded 2-CPU host; a pass takes far less
GOOD, BAD = "rpi4-4gb", "amd-epyc-x86"  # the two device classes, one cohort each (--cohort-by target)


def _release(tmp: Path, version: str, key_path: Path) -> bytes:
    """The tar.gz of a signed wheelhouse of `version` (as `edge-agent release build --no-deps` lays it out)."""
    from agent.release.archive import pack
    from agent.release.manifest import make

    house = tmp / f"wheelhouse-{version}"
    house.mkdir(parents=True)
    (house / f"edge_agent-{version}-py3-none-any.whl").write_bytes(os.urandom(4096))
    make(house, version, dependencies="base", key=load_private_key(key_path))
    return pack(house, tmp / f"release-{version}.tar.gz").read_bytes()


def _simulate(tmp: Path, broker: str, pub: Path, url: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "agent", "fleet", "simulate", "--trust", str(pub), "--group", "lab"]
    args += ["--broker", broker, "--control-plane", url, "--id-prefix", "rel", "--json", "--devices", "20"]
    args += ["--sysroots", f"{GOOD},{BAD}", "--enroll-token-file", "enroll.token"]
    args += ["--agent-release", "1.0.0", "--release-fail", f"{BAD}:1"]  # its canary passes, later trials fail
    out = (tmp / "sim.out").open("wb")
    return subprocess.Popen(
        args, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )


def _page(url: str, token: str, path: str, client: httpx.Client | None = None) -> str:
    """A dashboard page as a signed-in browser gets it (the login form, then the page); `client`: that browser,
    left signed in."""
    if client is None:
        with httpx.Client(base_url=url, timeout=30) as c:
            return _page(url, token, path, c)
    csrf = re.search(r'name="csrf" value="([^"]*)"', client.get("/login").text)
    assert csrf, "no login form"
    r = client.post("/login", data={"token": token, "next": path, "csrf": csrf.group(1)})
    assert r.status_code == 303, r.text
    page = client.get(path)
    assert page.status_code == 200, page.text[:500]
    return page.text


def _devices(client: httpx.Client) -> dict[str, dict]:
    rows = client.get("/api/v1/devices?state=accepted&limit=1000").json()["devices"]
    return {r["device_id"]: r for r in rows}


def test_a_release_rollout_halts_and_rolls_back_the_cohort_whose_trials_fail(tmp_path):
    with fleet_service(tmp_path) as (broker, fleet_key, fleet_pub, cp, url, client):
        for version in ("1.0.0", "1.1.0"):
            r = client.put(f"/api/v1/releases/{version}", content=_release(tmp_path, version, fleet_key))
            assert r.status_code == 201, r.text
        grant = client.post("/api/v1/enroll-tokens", json={"name": "sim", "groups": ["lab"], "uses": 20})
        (tmp_path / "enroll.token").write_text(grant.json()["token"] + "\n")
        sim = _simulate(tmp_path, broker.url, fleet_pub, url)
        try:

            def on_n():  # every device accepted, its status kept, running release 1.0.0
                rows = _devices(client)
                return rows if len(rows) == 20 and all(d["agent_version"] == "1.0.0" for d in rows.values()) else None

            before = wait_for(on_n, WAIT_S, "20 devices reporting release 1.0.0", step=1.0)
            body = {"kind": "agent", "version": "1.1.0", "cohort_by": "target", "canary": "1",
                    "wave_size": "50%", "max_failures": "0%", "deadline_s": 180}  # fmt: skip
            done = rollout_done(client, body, WAIT_S)
        finally:
            code = stop(sim)
        log = (tmp_path / "sim.out").read_text()[-4000:]
        assert code == 0, log
        assert done["kind"] == "agent" and done["model"] == "edge-agent" and done["state"] == "partial", done
        bad_target = {d["target"] for dev, d in before.items() if dev.startswith(f"rel-{BAD}-")}
        assert len(bad_target) == 1 and len({d["target"] for d in before.values()}) == 2, before
        cohorts = done["progress"]["cohorts"]
        states = {k: c["state"] for k, c in cohorts.items()}
        assert sorted(states.values()) == ["completed", "halted"], cohorts
        halted = next(c for c in cohorts.values() if c["state"] == "halted")
        assert "trial: simulated: wrong answer" in str(halted["reason"]), cohorts
        results = {d["device_id"]: d["result"] for d in done["progress"]["devices"]}
        bad_ids = {dev for dev, d in before.items() if d["target"] in bad_target}
        bad = sorted(results[d] for d in bad_ids)  # the canary took N+1 and was rolled back by the rollout;
        # a wave failed: in flight at the halt, a device is cancelled (told to stay; its own trial may have
        # failed after the halt: it never took N+1, so it is not rolled back), the rest not reached
        why = {d["device_id"]: (d["result"], d["reason"]) for d in done["progress"]["devices"]}
        assert bad.count("rolled_back") == 1 and "failed" in bad, why
        assert set(bad) <= {"failed", "cancelled", "not_reached", "rolled_back"}, why
        assert {results[d] for d in set(results) - bad_ids} == {"succeeded"}, results
        rows = _devices(client)
        for row in rows.values():
            trial = (row["agent_release"] or {}).get("trial")
            dev = row["device_id"]
            if results[dev] == "failed":  # its trial failed: the guard flipped it back to N, signed report
                assert trial["result"] == "rolled-back" and trial["verified"] and trial["version"] == "1.1.0", row
                assert "wrong answer" in trial["reason"] and row["agent_release"]["previous"] == "1.1.0", row
            elif results[dev] == "rolled_back":  # N+1 was good here, then the halt sent it back to N: a trial of N
                assert (trial["version"], trial["result"], row["agent_release"]["previous"]) == (
                    "1.0.0",
                    "good",
                    "1.1.0",
                ), row
            elif results[dev] == "not_reached":
                assert trial is None, row
            elif results[dev] == "cancelled":  # its trial, if it ran, failed too
                assert trial is None or trial["result"] == "rolled-back", row
            else:  # completed: every device on N+1, its trial good, the report verified against its key
                assert trial["result"] == "good" and trial["verified"] and trial["version"] == "1.1.0", row
            assert row["agent_version"] == ("1.0.0" if dev in bad_ids else "1.1.0"), row
        page = _page(url, cp.admin_token, "/devices")
        assert "trial 1.1.0: good" in page and "trial 1.1.0: rolled-back (simulated: wrong answer" in page
        assert "trial 1.0.0: good" in page  # the canary of the halted cohort, rolled back
        assert "<td>agent</td>" in _page(url, cp.admin_token, "/rollouts")  # the kind column
        listed = client.get("/api/v1/rollouts").json()["rollouts"]
        assert [r["kind"] for r in listed] == ["agent"], listed


MARKUP = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'


def _status(version: str, trial: dict) -> dict:
    return {
        "trust": "verified",
        "online": True,
        "ts": time.time(),
        "target": "t",
        "providers": ["CPUExecutionProvider"],
        "models": {},
        "agent_version": version,
        "agent_release": {"current": version, "previous": "1.0.0", "trial": trial},
    }


def test_release_uploads_are_checked_and_device_supplied_release_fields_are_escaped(tmp_path):
    """No broker: the API's refusals (a foreign signature, a version other than the manifest's, the reserved
    model name, a rollout's kind without or with a model) and a hostile device's agent fields (its status as the
    fleet loop keeps it) on the device list and page: escaped, and its forged trial report not verified."""
    from agent.artifacts.keys import device_key, public_pem
    from agent.controlplane.fleetloop import FleetLoop
    from agent.transport.signing import sign_doc

    fleet_key, _, _ = generate(tmp_path / "keys")
    other_key, _, _ = generate(tmp_path / "other")
    with running_service(tmp_path / "cp", signing_key=str(fleet_key)) as (cp, url):
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
        r = api.put("/api/v1/releases/2.0.0", content=_release(tmp_path / "a", "2.0.0", other_key))
        assert r.status_code == 422 and "untrusted" in r.json()["error"], r.text
        r = api.put("/api/v1/releases/2.0.1", content=_release(tmp_path / "b", "2.0.0", fleet_key))
        assert r.status_code == 422 and "names '2.0.0'" in r.json()["error"], r.text
        good = _release(tmp_path / "c", "2.0.0", fleet_key)
        for _ in range(2):  # the same bytes again: a no-op
            r = api.put("/api/v1/releases/2.0.0", content=good)
            assert r.status_code == 201 and r.json()["kind"] == "agent" and r.json()["wheels"] == 1, r.text
        assert [x["version"] for x in api.get("/api/v1/releases").json()["releases"]] == ["2.0.0"]
        assert api.get("/api/v1/models").json()["models"][0]["kind"] == "agent"
        r = api.put("/api/v1/models/edge-agent/versions/3", content=b"\x08\x01")
        assert r.status_code == 422 and "releases" in r.json()["error"], r.text
        refused = ({"kind": "agent", "model": "tiny", "version": "2.0.0"}, {"kind": "model", "version": "1"},
                   {"model": "edge-agent", "version": "2.0.0"})  # fmt: skip
        for body in refused:
            r = api.post("/api/v1/rollouts", json=body)
            assert r.status_code == 422 and "model:" in r.json()["error"], r.text

        with httpx.Client(base_url=url, timeout=30) as browser:  # the dashboard's form starts one too
            form = re.search(r'name="csrf" value="([^"]*)"', _page(url, cp.admin_token, "/rollouts", browser))
            assert form and "edge-agent 2.0.0" in form.string, "no start-a-rollout form offering the release"
            csrf = form.group(1)
            r = browser.post("/rollouts", data={"model_version": "edge-agent 2.0.0", "csrf": csrf})
            assert r.status_code == 303 and r.headers["location"] == "/rollouts/edge-agent-2.0.0", r.text
        got = api.get("/api/v1/rollouts/edge-agent-2.0.0").json()
        assert (got["kind"], got["model"], got["version"]) == ("agent", "edge-agent", "2.0.0"), got

        key = device_key(tmp_path / "dev")
        body = {"device_id": "d-1", "public_key": public_pem(key.public_key()), "groups": ["lab"]}
        assert api.post("/api/v1/devices", json=body).status_code == 201
        report = {"version": MARKUP[:60], "result": "rolled-back", "reason": MARKUP, "ended": time.time()}
        FleetLoop(cp.factory, cp.settings)._ingest({"d-1": _status(MARKUP[:60], sign_doc(report, key))})
        got = api.get("/api/v1/devices/d-1").json()
        assert got["agent_version"] == MARKUP[:60] and got["agent_release"]["trial"]["verified"] is True, got
        assert got["agent_release"]["trial"]["reason"] == MARKUP, got
        for path in ("/devices", "/devices/d-1"):
            page = _page(url, cp.admin_token, path)
            assert "<script>window.__pwned" not in page and "<img src=x" not in page, page
            assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page, page
        forged = sign_doc({**report, "ended": time.time() + 1}, load_private_key(other_key))
        FleetLoop(cp.factory, cp.settings)._ingest({"d-1": _status("1.1.0", forged)})
        got = api.get("/api/v1/devices/d-1").json()
        assert got["agent_version"] == "1.1.0" and got["agent_release"]["trial"]["verified"] is False, got
        api.close()
