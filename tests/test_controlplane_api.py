"""The control plane's HTTP API over a real socket, the same suite on SQLite and on a real PostgreSQL server
(started by the fixture from Debian's binaries): auth and roles, enrollment (bad signature, replay,
impersonation, one key one device, enrollment tokens), filters as parameters, field-naming 4xx, concurrent
halt/resume, signed decision records, import of an existing store, OpenAPI schema."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from cp_support import add_running_rollout, running_service

from agent.artifacts.keys import device_key, key_id, public_pem
from agent.transport.cpclient import enroll_request as request
from agent.transport.signing import sign_doc


@pytest.fixture
def svc(tmp_path, db_url):
    with running_service(tmp_path, database={"url": db_url}) as (cp, url):
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
        yield cp, client, tmp_path
        client.close()


def _token(client, name, role):
    r = client.post("/api/v1/tokens", json={"name": name, "role": role})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _enroll(client, tmp, dev, **kw):
    return client.post("/api/v1/enroll", json=request(dev, device_key(tmp / "keys" / dev), **kw))


def test_tokens_roles_401_403(svc):
    cp, client, tmp = svc
    url = str(client.base_url)
    assert httpx.get(url + "/api/v1/devices").status_code == 401
    assert httpx.get(url + "/api/v1/devices", headers={"Authorization": "Bearer nope"}).status_code == 401
    viewer = _token(client, "alice", "viewer")
    h = {"Authorization": f"Bearer {viewer}"}
    assert httpx.get(url + "/api/v1/devices", headers=h).status_code == 200
    _enroll(client, tmp, "dev-1")
    r = httpx.post(url + "/api/v1/devices/dev-1/accept", headers=h)
    assert r.status_code == 403 and "viewer" in r.json()["error"]
    op = _token(client, "bob", "operator")
    r = httpx.post(url + "/api/v1/devices/dev-1/accept", headers={"Authorization": f"Bearer {op}"})
    assert r.status_code == 200 and r.json()["state"] == "accepted" and r.json()["decided_by"] == "operator:bob"
    r = httpx.post(
        url + "/api/v1/tokens", json={"name": "eve", "role": "admin"}, headers={"Authorization": f"Bearer {op}"}
    )
    assert r.status_code == 403
    audit = client.get("/api/v1/audit").json()["entries"]
    assert any(a["actor"] == "operator:bob" and a["action"] == "device.accept" for a in audit)
    with cp.factory() as s:  # stored hashed, never in the clear
        from sqlalchemy import text

        hashes = [r[0] for r in s.execute(text("SELECT token_hash FROM operator_tokens"))]
    assert viewer not in hashes and len(hashes) == 3


def test_enrollment_pending_accept_and_refusals(svc):
    cp, client, tmp = svc
    r = _enroll(client, tmp, "dev-1", target="raspberry-pi-5")
    assert r.status_code == 202 and r.json()["state"] == "pending"
    # the same signed request again: a replay
    key = device_key(tmp / "keys" / "dev-2")
    doc = request("dev-2", key)
    assert client.post("/api/v1/enroll", json=doc).status_code == 202
    r = client.post("/api/v1/enroll", json=doc)
    assert r.status_code == 403 and r.json()["error"].startswith("nonce:")
    # a changed field after signing: bad signature
    forged = dict(request("dev-3", device_key(tmp / "keys" / "dev-3")), target="other")
    r = client.post("/api/v1/enroll", json=forged)
    assert r.status_code == 403 and r.json()["error"].startswith("sig:")
    # another key claiming dev-1's id (pending): refused, but answered as an unknown id's request is (an
    # unauthenticated caller cannot tell pending ids from unknown ones); nothing stored
    imp = request("dev-1", device_key(tmp / "keys" / "impostor"))
    r = client.post("/api/v1/enroll", json=imp)
    fresh = _enroll(client, tmp, "dev-new")
    assert (
        (r.status_code, r.json())
        == (fresh.status_code, {**fresh.json(), "device_id": "dev-1"})
        == (
            202,
            {"device_id": "dev-1", "state": "pending"},
        )
    )
    client.post("/api/v1/devices/dev-new/reject")
    client.delete("/api/v1/devices/dev-new")
    # one key, one device: dev-1's key for a new id
    r = client.post("/api/v1/enroll", json=request("dev-9", device_key(tmp / "keys" / "dev-1")))
    assert r.status_code == 403 and "one key, one device" in r.json()["error"]
    # a stale request
    old = sign_doc(
        dict(
            {k: v for k, v in request("dev-4", device_key(tmp / "keys" / "dev-4")).items() if k != "sig"},
            ts=time.time() - 3600,
        ),
        device_key(tmp / "keys" / "dev-4"),
    )
    r = client.post("/api/v1/enroll", json=old)
    assert r.status_code == 403 and r.json()["error"].startswith("ts:")
    refused = [a for a in client.get("/api/v1/audit").json()["entries"] if a["action"] == "enroll.refused"]
    assert len(refused) == 5
    devs = {d["device_id"]: (d["state"], d["key_id"]) for d in client.get("/api/v1/devices").json()["devices"]}
    dev1_key = key_id(device_key(tmp / "keys" / "dev-1").public_key())
    assert devs == {"dev-1": ("pending", dev1_key), "dev-2": ("pending", key_id(key.public_key()))}
    # reject, then decommission frees the key
    assert client.post("/api/v1/devices/dev-2/reject").json()["state"] == "rejected"
    assert client.post("/api/v1/devices/dev-1/decommission").json()["state"] == "decommissioned"
    r = client.post("/api/v1/enroll", json=request("dev-9", device_key(tmp / "keys" / "dev-1")))
    assert r.status_code == 202


def test_enrollment_token_accepts_with_groups(svc):
    cp, client, tmp = svc
    r = client.post("/api/v1/enroll-tokens", json={"name": "line-1", "groups": ["lab"], "uses": 2})
    token = r.json()["token"]
    for dev in ("a-1", "a-2"):
        r = _enroll(client, tmp, dev, token=token)
        assert r.status_code == 202 and r.json()["state"] == "accepted", r.text
    r = _enroll(client, tmp, "a-3", token=token)
    assert r.status_code == 403 and r.json()["error"].startswith("token:")
    r = _enroll(client, tmp, "a-4", token="eacp_wrong")
    assert r.status_code == 403
    page = client.get("/api/v1/devices", params={"group": "lab"}).json()
    assert [d["device_id"] for d in page["devices"]] == ["a-1", "a-2"]
    assert client.get("/api/v1/groups").json()["groups"] == [{"group": "lab", "devices": 2}]


def test_filters_are_parameters_and_paging(svc):
    cp, client, tmp = svc
    for i in range(12):
        _enroll(client, tmp, f"d-{i:02d}", target="rpi5" if i % 2 else "x86")
        if i < 8:
            client.post(f"/api/v1/devices/d-{i:02d}/accept", json={"groups": ["g1"] if i < 4 else ["g2"]})
    page = client.get("/api/v1/devices", params={"state": "accepted", "limit": 3, "offset": 3}).json()
    assert page["total"] == 8 and [d["device_id"] for d in page["devices"]] == ["d-03", "d-04", "d-05"]
    assert client.get("/api/v1/devices", params={"target": "rpi5"}).json()["total"] == 6
    assert client.get("/api/v1/devices", params={"group": "g2", "target": "x86"}).json()["total"] == 2
    for evil in ("x' OR '1'='1", "%", "_", "d-0%' --"):
        r = client.get("/api/v1/devices", params={"q": evil, "target": evil})
        assert r.status_code == 200 and r.json()["total"] == 0, evil
    assert client.get("/api/v1/devices", params={"q": "d-1"}).json()["total"] == 2
    assert client.get("/api/v1/devices").json()["total"] == 12  # the table is intact


def test_bad_input_names_the_field(svc):
    cp, client, tmp = svc
    r = client.get("/api/v1/devices", params={"limit": 0})
    assert r.status_code == 422 and r.json()["error"].startswith("limit:")
    r = client.get("/api/v1/devices", params={"state": "nope"})
    assert r.status_code == 422 and r.json()["error"].startswith("state:")
    r = client.post("/api/v1/rollouts", json={"model": "m", "version": "v1"})
    assert r.status_code == 422 and r.json()["error"].startswith("version:")
    r = client.post("/api/v1/rollouts", json={"model": "m", "version": "1", "surprise": 1})
    assert r.status_code == 422 and "surprise" in r.json()["error"]
    r = client.post("/api/v1/enroll", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"].startswith("body:")
    r = client.post("/api/v1/enroll", content=b"[" + b" " * (2 * 1024 * 1024) + b"]")
    assert r.status_code == 413 and r.json()["error"].startswith("body:")
    r = client.post("/api/v1/enroll", json={"kind": "enroll", "device_id": "../etc"})
    assert r.status_code == 400 and r.json()["error"].startswith("invalid device_id")
    r = client.put("/api/v1/devices/nope/groups", json={"groups": ["a"]})
    assert r.status_code == 404 and r.json()["error"].startswith("device_id:")
    r = client.put("/api/v1/models/m/versions/1", content=b"not an onnx model")
    assert r.status_code in (400, 422) and r.json()["error"]


def test_concurrent_halt_and_resume_leave_one_consistent_state(svc):
    cp, client, tmp = svc
    add_running_rollout(cp.factory, "m-2", {"name": "m", "version": "2"})
    results: list[tuple[str, int]] = []
    url, auth = str(client.base_url), dict(client.headers)

    def act(action):
        with httpx.Client(base_url=url, headers=auth, timeout=60) as c:
            for _ in range(5):
                results.append((action, c.post(f"/api/v1/rollouts/m-2/{action}").status_code))

    threads = [threading.Thread(target=act, args=(a,)) for a in ("halt", "resume") * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {code for _, code in results} <= {200, 409}
    halts = sum(1 for a, c in results if a == "halt" and c == 200)
    resumes = sum(1 for a, c in results if a == "resume" and c == 200)
    final = client.get("/api/v1/rollouts/m-2").json()
    assert halts - resumes == (1 if final["halted"] else 0)  # each success flipped the state exactly once
    audited = [a for a in client.get("/api/v1/audit", params={"limit": 1000}).json()["entries"] if a["target"] == "m-2"]
    assert len(audited) == halts + resumes


def test_signed_decision_records(svc):
    cp, client, tmp = svc
    key = device_key(tmp / "keys" / "dev-1")
    _enroll(client, tmp, "dev-1")
    doc = sign_doc({"device_id": "dev-1", "model": "m", "version": "1", "decision": {"selected": "cpu"}, "ts": 1}, key)
    r = client.post("/api/v1/devices/dev-1/decisions", json=doc)
    assert r.status_code == 403  # pending: nothing it says counts yet
    client.post("/api/v1/devices/dev-1/accept")
    assert client.post("/api/v1/devices/dev-1/decisions", json=doc).status_code == 201
    other = sign_doc(dict(doc, sig=None), device_key(tmp / "keys" / "someone"))
    r = client.post("/api/v1/devices/dev-1/decisions", json=other)
    assert r.status_code == 403 and r.json()["error"].startswith("sig:")
    got = client.get("/api/v1/devices/dev-1").json()
    assert [d["doc"]["decision"] for d in got["decisions"]] == [{"selected": "cpu"}]


def test_the_device_page_shows_the_latency_at_each_shape_point_of_a_decision(svc):
    """A row's `latency_points` (issue 42): one table line per point with its figures, runs and note, escaped;
    one mistyped is refused at the edge naming the field; a row without `coverage` (an older device's) is no 500."""
    cp, client, tmp = svc
    key = device_key(tmp / "keys" / "dev-1")
    _enroll(client, tmp, "dev-1")
    client.post("/api/v1/devices/dev-1/accept")
    gold = {"point": "golden+opt", "inputs": "tokens[1, 56]", "p50": 1.41, "p90": 2.52, "p99": 3.07, "runs": 97}
    top = {"point": "max", "inputs": "tokens[1, 224]", "p50": 1400.0, "runs": 1, "stopped": "one run took 1.4 s"}
    lost = {"point": "max", "inputs": "<b>tokens</b>[1, 4096]", "runs": 0, "skipped": "not run: <script>x</script>"}
    rows = [
        {"key": "cpu", "provider": "cpu", "status": "passed", "coverage": 1.0, "latency_points": [gold, top]},
        {"key": "openvino", "provider": "openvino", "status": "failed", "latency_points": [lost]},
    ]
    doc = {"device_id": "dev-1", "model": "tts", "version": "1", "ts": 1}
    bad = dict(rows[0], latency_points=[dict(gold, runs="many")])
    r = client.post("/api/v1/devices/dev-1/decisions", json=sign_doc({**doc, "decision": {"results": [bad]}}, key))
    assert r.status_code == 422 and "decision.results.0.latency_points.0.runs" in r.json()["error"], r.text
    signed = sign_doc({**doc, "decision": {"selected": "cpu", "results": rows}}, key)
    assert client.post("/api/v1/devices/dev-1/decisions", json=signed).status_code == 201
    page = client.get("/devices/dev-1").text
    assert "<h4>Latency at each shape point</h4>" in page, page
    assert "<td>cpu</td><td>golden+opt</td><td>tokens[1, 56]</td>\n<td>1.41</td><td>2.52</td><td>3.07</td>" in page
    assert "<td>1.4e+03</td><td>not measured</td><td>not measured</td>\n<td>1</td><td>one run took 1.4 s</td>" in page
    assert "<td>&lt;b&gt;tokens&lt;/b&gt;[1, 4096]</td>" in page and "<td>0</td><td>not run: &lt;script&gt;" in page
    assert "<script>" not in page and "<b>tokens" not in page
    assert "passed</td>\n<td>100%</td>" in page and "failed</td>\n<td>not measured</td>" in page  # coverage


def test_attestations_in_decision_records_are_verified_stored_and_shown(svc):
    """The attestations a device sends inside a decision record (`edge-agent control-plane report`, as the daemon
    does) are each verified against that accepted device's key: a good one is listed with its summary and the
    envelope (checkable again offline), a changed one is kept as refused with the reason and audited; the
    dashboard shows both."""
    from clirunner import edge_agent

    from agent.evidence.attest import Attestor
    from agent.evidence.verify import verify_attestation
    from agent.lifecycle.journal import Deployment
    from agent.lifecycle.states import State

    cp, client, tmp = svc
    state = tmp / "keys" / "dev-1"  # the device's state dir: _enroll made its key there
    _enroll(client, tmp, "dev-1")
    client.post("/api/v1/devices/dev-1/accept")
    dep = Deployment("m-1-abc", "m", "1", State.COMMITTED, {"kind": "manifest"}, time.time(), time.time())
    dep.data.update(sha256="ab" * 32, selected={"provider": "cpu", "precision": "f32"})
    (state / "decisions").mkdir(parents=True)
    (state / "decisions" / "m-1-abc.json").write_text(json.dumps({"model": {"name": "m", "version": "1"}}))
    att = Attestor(state, "dev-1")
    att.trial(dep, "committed", None)
    qual = att.qualification(dep, {"selected": "cpu", "reason": "fastest", "results": []})
    data = bytearray(qual.read_bytes())
    data[len(data) // 2] ^= 0x01  # one byte changed after signing (inside the base64 payload: still JSON)
    qual.write_bytes(bytes(data))
    (tmp / "agent.yaml").write_text(json.dumps({"device_id": "dev-1", "state_dir": str(state)}))
    out = edge_agent("control-plane", "report", "--agent-config", tmp / "agent.yaml", "--url", client.base_url)
    assert out.returncode == 0 and "uploaded 1 decision record(s)" in out.stdout, out.stderr

    got = {a["kind"]: a for a in client.get("/api/v1/devices/dev-1/attestations").json()["attestations"]}
    assert got["trial"]["verified"] is True and got["trial"]["summary"]["verdict"] == "committed"
    assert got["trial"]["deployment_id"] == "m-1-abc"
    pub = device_key(state).public_key()
    assert verify_attestation(json.dumps(got["trial"]["envelope"]), pub, "dev-1")["kind"] == "trial"
    assert got["qualification"]["verified"] is False and got["qualification"]["reason"]
    assert client.get("/api/v1/devices/dev-1").json()["attestations"] == list(got.values())
    audit = client.get("/api/v1/audit", params={"limit": 100}).json()["entries"]
    assert [a["action"] for a in audit].count("attestation.refused") == 1
    page = client.get("/devices/dev-1").text
    assert "<td>trial</td>" in page and "by the device&#39;s key" in page and "REFUSED: " in page


def test_openapi_schema_is_served(svc):
    cp, client, tmp = svc
    schema = httpx.get(str(client.base_url) + "/api/openapi.json").json()
    for path in ("/api/v1/devices", "/api/v1/enroll", "/api/v1/rollouts/{rollout_id}/{action}", "/api/v1/audit"):
        assert path in schema["paths"], path


def test_import_of_an_existing_store_on_first_start(tmp_path, db_url):
    from agent.fleet.registry import REGISTRY_NAME, DeviceRegistry
    from agent.fleet.rollout_plan import RolloutSpec

    store = tmp_path / "store"
    with DeviceRegistry.edit(store / REGISTRY_NAME) as reg:
        reg.register("old-1", public_pem(device_key(tmp_path / "k1").public_key()), ["lab"])
        reg.register("old-2", public_pem(device_key(tmp_path / "k2").public_key()), [])
    (store / "rollouts").mkdir()
    state = {
        "format": 1,
        "rollout_id": "m-3",
        "spec": RolloutSpec("m", "3").to_dict(),
        "state": "completed",
        "created": 1.0,
        "cohorts": {},
        "devices": {},
    }
    (store / "rollouts" / "m-3.json").write_text(json.dumps(state))
    with running_service(tmp_path, database={"url": db_url}) as (cp, url):
        h = {"Authorization": f"Bearer {cp.admin_token}"}
        devs = httpx.get(url + "/api/v1/devices", headers=h).json()["devices"]
        assert [(d["device_id"], d["state"], d["groups"]) for d in devs] == [
            ("old-1", "accepted", ["lab"]),
            ("old-2", "accepted", []),
        ]
        assert httpx.get(url + "/api/v1/rollouts/m-3", headers=h).json()["phase"] == "finished"
    with running_service(tmp_path, database={"url": db_url}) as (cp, url):  # a second start imports nothing
        assert cp.imported == {"devices": 0, "rollouts": 0}


def test_preregister_a_key_and_one_record_per_deployment(svc):
    cp, client, tmp = svc
    key = device_key(tmp / "keys" / "pre-1")
    pem = public_pem(key.public_key())
    viewer = _token(client, "v", "viewer")
    body = {"device_id": "pre-1", "public_key": pem, "groups": ["lab"]}
    r = httpx.post(str(client.base_url) + "/api/v1/devices", json=body, headers={"Authorization": f"Bearer {viewer}"})
    assert r.status_code == 403  # registering is an operator's change
    r = client.post("/api/v1/devices", json=body)
    assert r.status_code == 201 and (r.json()["state"], r.json()["groups"]) == ("accepted", ["lab"]), r.text
    r = client.post("/api/v1/devices", json={**body, "device_id": "pre-2"})
    assert r.status_code == 409 and "one key, one device" in r.json()["error"]
    r = client.post("/api/v1/devices", json={**body, "public_key": "not a key"})
    assert r.status_code == 400 and r.json()["error"].startswith("public_key"), r.text
    assert _enroll(client, tmp, "pre-1").json()["state"] == "accepted"  # the device asking later: nothing changes
    first = {"device_id": "pre-1", "deployment_id": "d1", "model": "m", "version": "1", "decision": {"n": 1}, "ts": 1}
    for n in (1, 2):  # the same deployment's record posted again as it grew: the newer copy replaces the older
        assert (
            client.post(
                "/api/v1/devices/pre-1/decisions", json=sign_doc({**first, "decision": {"n": n}}, key)
            ).status_code
            == 201
        )
    other = sign_doc({**first, "deployment_id": "d2", "decision": {"n": 3}}, key)
    assert client.post("/api/v1/devices/pre-1/decisions", json=other).status_code == 201
    got = client.get("/api/v1/devices/pre-1").json()["decisions"]
    assert sorted(d["doc"]["decision"]["n"] for d in got) == [2, 3]
