"""The daemon's side of the control plane (agent.yaml `control_plane`, agent.services.cpsync) with real parts: a
real daemon (`edge-agent run`) enrolls by itself with an enrollment token, qualifies a model pushed through the
service over a real Mosquitto, and its decision record (with its signed attestations) appears in
`GET /api/v1/devices/ID` without `control-plane report`; a control plane that is down at first (and across a
daemon restart) still gets the record once it is up. `fleet register --control-plane` (accept a pending device,
pre-register a key) and `fleet rollback --control-plane` (a signed rollback pushed through the API, a service
rollout rolled back) are tested through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from brokers import Mosquitto, free_port
from clirunner import edge_agent
from cp_support import add_running_rollout, running_service
from support.daemon import Daemon, drop, write_config
from support.wait import wait_for

from agent.artifacts.keys import device_key, generate, key_id, public_pem
from agent.samples import sample_tiny_package

pytestmark = [pytest.mark.timeout(900)]  # pyproject's hang guard: 300 s cut real work short at load 20
WAIT_S = 120.0


def _cp_section(url: str, **kw) -> dict:
    return {"control_plane": {"url": url, "retry_max_s": 2, **kw}}


def _device(client: httpx.Client, device_id: str = "dev-1") -> dict:
    r = client.get(f"/api/v1/devices/{device_id}")
    return r.json() if r.status_code == 200 else {}


def _upload(client: httpx.Client, tmp: Path, version: str) -> None:
    from agent.artifacts.packtar import write_targz

    out = tmp / f"tiny-{version}.tar.gz"
    write_targz(sample_tiny_package(tmp / f"tiny-{version}", version=version), out)
    r = client.put(f"/api/v1/models/tiny/versions/{version}", content=out.read_bytes())
    assert r.status_code == 201, r.text


def test_daemon_enrolls_itself_and_posts_the_decision_of_a_pushed_model(tmp_path):
    with Mosquitto(tmp_path / "mosquitto") as broker:
        fleet_key, fleet_pub, _ = generate(tmp_path / "keys")
        doc = {"signing_key": str(fleet_key), "mqtt": {"url": broker.url}, "tick_s": 0.3}
        with running_service(tmp_path / "cp", **doc) as (cp, url):
            admin = tmp_path / "admin.token"
            admin.write_text(cp.admin_token)
            client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
            grant = client.post("/api/v1/enroll-tokens", json={"name": "lab", "groups": ["lab"], "uses": 1})
            (tmp_path / "enroll.token").write_text(grant.json()["token"] + "\n")
            config = write_config(
                tmp_path / "dev",
                mqtt={"url": broker.url},
                extra={
                    "trust": {"public_keys": [str(fleet_pub)]},
                    **_cp_section(url, token_file=str(tmp_path / "enroll.token")),
                },
            )
            daemon = Daemon(config, tmp_path / "dev" / "state")
            try:
                daemon.wait_ready()
                got = wait_for(lambda: _device(client).get("state") == "accepted" and _device(client), 60, "enrolled")
                assert got["groups"] == ["lab"] and got["decided_by"] == "token:lab"
                assert got["key_id"] == key_id(device_key(tmp_path / "dev" / "state").public_key())
                _upload(client, tmp_path, "1")
                r = client.post("/api/v1/push", json={"model": "tiny", "version": "1", "devices": ["dev-1"]})
                assert r.status_code == 200, r.text
                assert daemon.wait_deployment("1", timeout=WAIT_S)["result"] == "committed", daemon.tail()

                def posted():
                    docs = _device(client).get("decisions") or []
                    return docs if any((d["doc"].get("attestations") or {}).get("trial") for d in docs) else None

                docs = wait_for(posted, 60, "the decision record with its trial attestation on the control plane")
                assert len(docs) == 1  # reposted as it grew (probation figures, attestations): one per deployment
                record = docs[0]["doc"]
                assert (docs[0]["model"], docs[0]["version"]) == ("tiny", "1")
                assert record["decision"]["selected"] == "cpu" and "probation" in record["decision"]
                assert set(record["attestations"]) == {"qualification", "trial"}
                assert isinstance(docs[0]["seq"], int) and docs[0]["seq"] == record["seq"] >= 1  # freshness
                for att in record["attestations"].values():  # bound to this deployment and its artifact
                    assert att["verified"] and att["summary"]["deployment"] == record["deployment_id"], att
                    assert att["summary"]["digest"]["sha256"] == record["artifact_sha256"], att
                status = json.loads(edge_agent("status", "--config", config, "--json").stdout)["control_plane"]
                assert status["enrollment"] == "accepted" and status["posted"] == 1 and status["pending"] == 0
                # fleet rollback --control-plane: version 2, then back to 1 as a signed rollback through the API
                _upload(client, tmp_path, "2")
                client.post("/api/v1/push", json={"model": "tiny", "version": "2", "devices": ["dev-1"]})
                assert daemon.wait_deployment("2", timeout=WAIT_S)["result"] == "committed", daemon.tail()
                wait_for(lambda: _device(client)["models"].get("tiny", {}).get("version") == "2", 60, "v2 reported")
                rb = edge_agent(
                    *("fleet", "rollback", "tiny", "--device", "dev-1", "--version", "1"),
                    *("--control-plane", url, "--token-file", admin, "--wait", "120", "--json"),
                )
                assert rb.returncode == 0, rb.stdout + rb.stderr
                out = json.loads(rb.stdout)
                assert out["ok"] and out["devices"] == {"dev-1": {"result": "committed", "reason": None}}, out
                audit = client.get("/api/v1/audit").json()["entries"]
                assert any(a["action"] == "model.rollback" and a["target"] == "tiny/1" for a in audit)
            finally:
                daemon.terminate()
                client.close()


def test_control_plane_down_at_first_then_up_still_gets_the_record(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = write_config(tmp_path / "dev", extra=_cp_section(url))
    state = tmp_path / "dev" / "state"
    daemon = Daemon(config, state)
    try:
        daemon.wait_ready()
        drop(state, "1")
        assert daemon.wait_deployment("1", timeout=WAIT_S)["result"] == "committed", daemon.tail()

        def failing():
            cp = (daemon.status() or {}).get("control_plane") or {}
            return cp if cp.get("pending") == 1 and cp.get("retrying") and cp.get("last_error") else None

        seen = wait_for(failing, 30, "the record pending while the control plane is down")
        assert "127.0.0.1" in seen["last_error"] and seen["posted"] == 0, seen
        text = edge_agent("status", "--config", config).stdout
        assert f"control plane {url}: not enrolled, 0 record(s) posted, 1 pending; last error: " in text, text
        daemon.terminate()  # a restart while it is down loses nothing
        daemon = Daemon(config, state)
        daemon.wait_ready()
        with running_service(tmp_path / "cp", port=port) as (cp, got_url):
            assert got_url == url
            client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
            wait_for(lambda: _device(client).get("state") == "pending", 30, "the device asking to enroll")
            assert _device(client)["decisions"] == []  # pending: nothing posted yet
            admin = tmp_path / "admin.token"
            admin.write_text(cp.admin_token)
            r = edge_agent(
                *("fleet", "register", "dev-1", "--group", "lab", "--control-plane", url, "--token-file", admin),
                "--json",
            )
            assert r.returncode == 0, r.stdout + r.stderr
            assert json.loads(r.stdout)["state"] == "accepted" and json.loads(r.stdout)["groups"] == ["lab"]
            docs = wait_for(lambda: _device(client).get("decisions"), 60, "the decision record after the outage")
            assert [(d["model"], d["version"]) for d in docs] == [("tiny", "1")]
            assert docs[0]["doc"]["decision"]["selected"] == "cpu"

            def drained():
                cp_status = (daemon.status() or {}).get("control_plane") or {}
                return cp_status if cp_status.get("posted") == 1 and cp_status.get("pending") == 0 else None

            done = wait_for(drained, 30, "status saying posted 1, pending 0")
            assert done["enrollment"] == "accepted" and not done["retrying"]
            client.close()
    finally:
        daemon.terminate()


def test_fleet_register_and_rollback_through_the_api(tmp_path):
    with running_service(tmp_path / "cp") as (cp, url):
        admin = tmp_path / "admin.token"
        admin.write_text(cp.admin_token)
        pub = tmp_path / "device.pub"
        key = device_key(tmp_path / "dev-9")
        pub.write_text(public_pem(key.public_key()))
        opts = ("--control-plane", url, "--token-file", admin)
        r = edge_agent("fleet", "register", "dev-9", "--public-key", pub, "--group", "lab", *opts, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert (doc["state"], doc["groups"], doc["key_id"]) == ("accepted", ["lab"], key_id(key.public_key()))
        # the same key for another device: one key, one device
        r = edge_agent("fleet", "register", "dev-10", "--public-key", pub, *opts)
        assert r.returncode != 0 and "one key, one device" in r.stderr, r.stderr
        # accept without a pending request: the API's 404 names the device
        r = edge_agent("fleet", "register", "nobody", *opts)
        assert r.returncode != 0 and "nobody" in r.stderr, r.stderr
        # a rollout of the service rolled back (the service has no broker: it stays planned, not published)
        add_running_rollout(cp.factory, "tiny-2", {"name": "tiny", "version": "2"})
        r = edge_agent("fleet", "rollback", "other", "--rollout", "tiny-2", *opts)
        assert r.returncode != 0 and "rolls out tiny, not other" in r.stderr, r.stderr
        r = edge_agent("fleet", "rollback", "tiny", "--rollout", "tiny-2", *opts, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout)["rollout"]["rollback_requested"] == "rolled back by operator:admin (request 1)"
        r = edge_agent("fleet", "rollback", "tiny", "--rollout", "tiny-2", *opts)  # asked again: accepted, numbered
        assert r.returncode == 0 and "rolled back by operator:admin (request 2)" in r.stdout, r.stdout + r.stderr
        # device/group rollback needs the version to return to; without a broker the service says why
        r = edge_agent("fleet", "rollback", "tiny", "--group", "lab", *opts)
        assert r.returncode == 2 and "--version" in r.stderr, r.stderr
        r = edge_agent("fleet", "rollback", "tiny", "--group", "lab", "--version", "1", *opts)
        assert r.returncode != 0 and "no broker configured" in r.stderr, r.stderr
        # without --control-plane the flags are as before
        r = edge_agent("fleet", "rollback", "tiny", "--rollout", "tiny-2")
        assert r.returncode == 2 and "--rollout ID needs --control-plane" in r.stderr, r.stderr
