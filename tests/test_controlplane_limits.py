"""Requests that must not break the control plane (issue 34, 3/4/6/7), over a real socket, on SQLite and on a real
PostgreSQL server: bodies over their route's cap (declared or streamed), JSON nested 100k deep or holding too
many values, oversized or mis-shaped `hardware`, mistyped decision records: each a clear 4xx with nothing
stored (row counts checked). Rows written straight into the database (as an old row would be: nested past the
parser, mistyped) never break a listing, a filter or a page. Paging bounds, delete (API and CLI, audited), rate
limits per address and key, the pending cap, and pre-registration winning over a pending squatter."""

from __future__ import annotations

import json

import httpx
import pytest
from clirunner import edge_agent
from cp_support import running_service
from sqlalchemy import func, select, text

from agent.artifacts.keys import device_key, public_pem
from agent.controlplane.models import AuditEntry, Device, DeviceDocument, DeviceGroup, EnrollNonce
from agent.transport.cpclient import enroll_request as request
from agent.transport.signing import sign_doc

TABLES = (Device, DeviceDocument, DeviceGroup, EnrollNonce, AuditEntry)


@pytest.fixture
def limited(tmp_path, db_url):
    """A service with small rate limits and pending cap: (cp, admin client, tmp)."""
    doc = {"address_burst": 6, "address_per_minute": 1, "key_burst": 2, "key_per_minute": 1, "pending_max": 3}
    with running_service(tmp_path, database={"url": db_url}, limits=doc) as (cp, url):
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=60) as c:
            yield cp, c, tmp_path


@pytest.fixture
def svc(tmp_path, db_url):
    with running_service(tmp_path, database={"url": db_url}) as (cp, url):
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=60) as c:
            yield cp, c, tmp_path


def counts(cp) -> dict[str, int]:
    with cp.factory() as s:
        return {t.__tablename__: s.scalar(select(func.count()).select_from(t)) or 0 for t in TABLES}


def _accepted(client, tmp, dev: str):
    key = device_key(tmp / "keys" / dev)
    r = client.post("/api/v1/devices", json={"device_id": dev, "public_key": public_pem(key.public_key())})
    assert r.status_code == 201, r.text
    return key


def _nested(n: int) -> bytes:
    return b"[" * n + b"]" * n


def test_bodies_json_and_hardware_over_their_limits_are_refused_and_nothing_stored(svc):
    cp, client, tmp = svc
    key = _accepted(client, tmp, "dev-1")
    before = counts(cp)
    lim = cp.settings.limits

    def enroll_with(**kw):
        return client.post("/api/v1/enroll", json=request("new-1", device_key(tmp / "keys" / "new-1"), **kw))

    answers = {
        "declared too large": client.post("/api/v1/enroll", content=b" " * (lim.enroll_body_bytes + 1)),
        "streamed too large": client.post("/api/v1/enroll", content=iter([b" " * 8192] * 8)),  # chunked, no length
        "100k levels (enroll)": client.post("/api/v1/enroll", content=_nested(100_000)),
        "10k levels in the enroll cap": client.post("/api/v1/enroll", content=_nested(10_000)),
        "100k levels (decision)": client.post("/api/v1/devices/dev-1/decisions", content=_nested(100_000)),
        "100k levels (operator route)": client.post("/api/v1/rollouts", content=_nested(100_000)),
        "too many values": client.post("/api/v1/devices/dev-1/decisions", content=b"[" + b"1," * 60_000 + b"1]"),
        "hardware over 16 KB": enroll_with(hardware={f"k{i}": ["x" * 250] * 3 for i in range(31)}),
        "hardware nested 400 deep": client.post(
            "/api/v1/enroll",
            content=json.dumps({**request("new-1", device_key(tmp / "keys" / "new-1")), "hardware": 0})
            .replace('"hardware": 0', '"hardware": ' + '{"a": ' * 400 + "1" + "}" * 400)
            .encode(),
        ),
        "hardware not flat": enroll_with(hardware={"arch": {"nested": "no"}}),
        "target of 65 characters": enroll_with(target="t" * 65),
    }
    want = {
        "declared too large": (413, "body: more than"),
        "streamed too large": (413, "body: more than"),
        "100k levels (enroll)": (413, "body: more than"),  # 200 KB: over the enrollment cap before any parsing
        "10k levels in the enroll cap": (413, "body: JSON nested deeper than"),
        "100k levels (decision)": (413, "body: JSON nested deeper than"),
        "100k levels (operator route)": (422, ""),  # FastAPI's own parsing: refused, no 500
        "too many values": (413, "body: JSON with more than"),
        "hardware over 16 KB": (422, "enroll document: hardware"),
        "hardware nested 400 deep": (413, "body: JSON nested deeper than"),
        "hardware not flat": (422, "enroll document: hardware: Value error, arch: expected a string"),
        "target of 65 characters": (422, "enroll document: target"),
    }
    got = {name: (r.status_code, r.json()["error"][: len(want[name][1])]) for name, r in answers.items()}
    assert got == want
    sig = {"device_id": "dev-1", "model": "m", "version": "1", "deployment_id": "m-1-a", "ts": 1.0}
    for bad in ({"decision": {"results": [{"coverage": "x"}]}}, {"trial": [1, 2]}, {"model": ["m"]}):
        r = client.post("/api/v1/devices/dev-1/decisions", json=sign_doc({**sig, **bad}, key))
        assert r.status_code == 422 and r.json()["error"].startswith("decision document: "), r.text
        assert next(iter(bad)) in r.json()["error"]
    r = client.post("/api/v1/devices/dev-1/conformance", json=sign_doc({**sig, "ts": "yesterday"}, key))
    assert r.status_code == 422 and "ts" in r.json()["error"]
    assert counts(cp) == before  # nothing stored, not even an audit entry
    assert client.get("/api/v1/health").json()["ok"] is True


def _raw_json(cp, table: str, column: str, where: str, value: str) -> None:
    """Write `value` (JSON text) into a JSON column as an old row or a hand edit would, bypassing every check."""
    cast = "CAST(:v AS JSON)" if cp.engine.dialect.name == "postgresql" else ":v"
    with cp.engine.begin() as conn:
        conn.execute(text(f"UPDATE {table} SET {column} = {cast} WHERE {where}"), {"v": value})


def test_bad_rows_in_the_database_never_break_a_listing_or_a_page(svc):
    cp, client, tmp = svc
    key = _accepted(client, tmp, "bad-1")
    _accepted(client, tmp, "ok-1")
    assert client.post("/api/v1/enroll", json=request("pend-1", device_key(tmp / "keys" / "pend-1"))).status_code
    base = {"device_id": "bad-1", "model": "m", "version": "1", "ts": 1.0}
    for i in range(4):
        doc = sign_doc({**base, "deployment_id": f"m-1-{i}", "decision": {"results": []}}, key)
        assert client.post("/api/v1/devices/bad-1/decisions", json=doc).status_code == 201
    assert client.post("/api/v1/devices/bad-1/conformance", json=sign_doc(base, key)).status_code == 201
    deep = '{"a": ' * 2000 + "1" + "}" * 2000  # past what json.loads can take
    _raw_json(cp, "devices", "hardware", "device_id = 'bad-1'", deep)
    _raw_json(cp, "devices", "hardware", "device_id = 'pend-1'", '{"arch": ' * 400 + "1" + "}" * 400)
    _raw_json(cp, "devices", "status", "device_id = 'bad-1'", '{"models": [1], "deployments": {"m": 3}}')
    _raw_json(cp, "devices", "models_summary", "device_id = 'bad-1'", '{"m": [1]}')  # what a list shows
    _raw_json(cp, "devices", "groups", "device_id = 'ok-1'", '"lab"')
    deep_decision = '{"a": ' * 700 + "1" + "}" * 700
    bad_docs = [
        json.dumps({**base, "decision": {"results": [{"coverage": "x", "status": "passed"}, "junk"]}, "trial": [1]}),
        '{"device_id": "bad-1", "deployment_id": "deep", "decision": ' + deep_decision + "}",
        json.dumps(
            {**base, "attestations": {"trial": {"verified": True, "summary": {"selected": [1], "attested_at": "x"}}}}
        ),
        "[1, 2]",
        '{"ts": "x", "summary": 5}',  # the conformance report
    ]
    with cp.engine.connect() as conn:
        ids = [r[0] for r in conn.execute(text("SELECT id FROM device_documents ORDER BY id"))]
    assert len(ids) == len(bad_docs)
    for doc_id, value in zip(ids, bad_docs):
        _raw_json(cp, "device_documents", "doc", f"id = {doc_id}", value)

    api = [
        "/api/v1/devices",
        "/api/v1/devices?state=accepted",
        "/api/v1/devices?state=pending",
        "/api/v1/devices?q=bad",
        "/api/v1/devices?group=lab",
        "/api/v1/devices?online=false",
        "/api/v1/devices/bad-1",
        "/api/v1/devices/pend-1",
        "/api/v1/devices/ok-1",
        "/api/v1/devices/bad-1/decisions",
        "/api/v1/devices/bad-1/conformance",
        "/api/v1/devices/bad-1/attestations",
        "/api/v1/groups",
        "/api/v1/health",
    ]
    pages = ["/", "/devices", "/devices?state=", "/devices?state=pending", "/pending", "/devices/bad-1", "/rollouts"]
    pages += ["/devices/pend-1", "/devices/ok-1", "/devices?group=lab&target=x"]
    got = {p: client.get(p).status_code for p in api + pages}
    assert got == {p: 200 for p in api + pages}
    listed = {d["device_id"]: d for d in client.get("/api/v1/devices").json()["devices"]}
    assert listed["bad-1"]["hardware"] == {} and any(p.startswith("hardware") for p in listed["bad-1"]["invalid"])
    assert listed["pend-1"]["hardware"] == {} and listed["ok-1"]["groups"] == [] and "invalid" not in listed["ok-1"]
    assert any(p.startswith("status.models") for p in listed["bad-1"]["invalid"])
    shown = client.get("/api/v1/devices/bad-1").json()  # the device itself: its whole status, checked as read
    assert any(p.startswith("status.models") for p in shown["invalid"])
    decisions = [d["doc"] for d in client.get("/api/v1/devices/bad-1").json()["decisions"]]
    marks = sorted(p for d in decisions for p in d.get("invalid", []))
    assert "document: expected an object, got list" in marks
    assert f"document: nested deeper than {32} levels" in marks
    typed = [d for d in decisions if "trial" in d][0]
    assert typed["trial"] is None and typed["decision"]["results"] == [{"coverage": None, "status": "passed"}]
    assert {"decision.results.0.coverage", "decision.results.1", "trial"} <= {p.split(":")[0] for p in typed["invalid"]}
    atts = [d for d in decisions if "attestations" in d][0]["attestations"]["trial"]["summary"]
    assert atts["selected"] is None or atts["attested_at"] is None
    reports = client.get("/api/v1/devices/bad-1/conformance").json()["reports"]
    assert reports[0]["doc"]["ts"] is None and reports[0]["doc"]["invalid"]
    assert client.post("/api/v1/devices/pend-1/reject").json()["state"] == "rejected"  # bad rows still change
    assert client.post("/api/v1/devices/ok-1/decommission").json()["state"] == "decommissioned"
    page = client.get("/devices/bad-1").text
    assert "Invalid fields, not shown: decision.results.0.coverage" in page
    cli = edge_agent(
        "fleet", "status", "--control-plane", client.base_url, "--json", env={"EDGE_AGENT_CP_TOKEN": cp.admin_token}
    )
    assert cli.returncode == 0 and json.loads(cli.stdout)["count"] == 3, cli.stderr
    assert client.delete("/api/v1/devices/bad-1").json()["deleted"]["device_documents"] == 5
    assert client.get("/api/v1/devices").json()["total"] == 2


def test_paging_bounds_are_a_422(svc):
    cp, client, tmp = svc
    for params in ({"offset": 10**23}, {"offset": -1}, {"limit": 10**23}, {"limit": -5}):
        r = client.get("/api/v1/devices", params=params)
        assert r.status_code == 422 and r.json()["error"].startswith(next(iter(params))), (params, r.text)
    for path in ("/devices?page=100000000000000000000000", "/devices?page=-1", "/pending?page=10000000000000000"):
        assert client.get(path).status_code == 422, path
    assert client.get("/api/v1/devices", params={"offset": 10**9}).json()["devices"] == []


def test_delete_a_device_and_its_documents_audited(svc):
    cp, client, tmp = svc
    key = _accepted(client, tmp, "gone-1")
    client.put("/api/v1/devices/gone-1/groups", json={"groups": ["lab"]})
    doc = sign_doc({"device_id": "gone-1", "deployment_id": "m-1-a", "model": "m", "version": "1", "ts": 1.0}, key)
    assert client.post("/api/v1/devices/gone-1/decisions", json=doc).status_code == 201
    operator = client.post("/api/v1/tokens", json={"name": "op", "role": "operator"}).json()["token"]
    r = httpx.delete(f"{client.base_url}/api/v1/devices/gone-1", headers={"Authorization": f"Bearer {operator}"})
    assert r.status_code == 403 and "admin" in r.json()["error"]
    assert counts(cp)["device_documents"] == 1
    r = client.delete("/api/v1/devices/gone-1")
    assert r.status_code == 200 and r.json()["deleted"]["device_documents"] == 1, r.text
    assert r.json()["deleted"]["devices"] == 1 and r.json()["deleted"]["device_groups"] == 1
    left = counts(cp)
    assert (left["devices"], left["device_documents"], left["device_groups"]) == (0, 0, 0)
    audit = [a for a in client.get("/api/v1/audit").json()["entries"] if a["action"] == "device.delete"]
    assert [(a["actor"], a["target"]) for a in audit] == [("operator:admin", "gone-1")]
    assert client.delete("/api/v1/devices/gone-1").status_code == 404
    assert client.post("/api/v1/enroll", json=request("gone-1", key)).json()["state"] == "pending"
    (tmp / "admin.token").write_text(cp.admin_token)
    out = edge_agent(
        "fleet", "delete", "gone-1", "--control-plane", client.base_url, "--token-file", tmp / "admin.token"
    )
    assert out.returncode == 0 and out.stdout.startswith("deleted gone-1"), out.stderr
    assert counts(cp)["devices"] == 0


def test_rate_limits_per_address_and_key_and_the_pending_cap(limited):
    cp, client, tmp = limited
    same = device_key(tmp / "keys" / "same")
    answers = [client.post("/api/v1/enroll", json=request("same-1", same)).status_code for _ in range(3)]
    assert answers == [202, 202, 429]  # the key's burst is 2
    codes = [
        client.post("/api/v1/enroll", json=request(f"d-{i}", device_key(tmp / "keys" / f"d-{i}"))) for i in range(4)
    ]
    assert [r.status_code for r in codes] == [202, 202, 202, 429]  # the address's burst of 6 is spent
    assert (
        codes[-1].json()["error"].startswith("rate: too many requests from")
        and int(codes[-1].headers["Retry-After"]) > 0
    )
    pending = client.get("/api/v1/devices", params={"state": "pending"}).json()
    assert [d["device_id"] for d in pending["devices"]] == ["d-0", "d-1", "d-2"]  # same-1, the oldest, was dropped
    health = client.get("/api/v1/health").json()["limits"]
    assert health == {"pending": 3, "pending_max": 3, "pending_dropped": 1, "rate_limited": 2}
    dropped = [
        a["target"] for a in client.get("/api/v1/audit").json()["entries"] if a["action"] == "device.pending_dropped"
    ]
    assert dropped == ["same-1"]
    assert counts(cp)["devices"] == 3


def test_preregistration_wins_over_a_pending_squatter_and_pending_is_not_told(svc):
    cp, client, tmp = svc
    squatter, real = device_key(tmp / "keys" / "squatter"), device_key(tmp / "keys" / "cam-1")
    assert client.post("/api/v1/enroll", json=request("cam-1", squatter)).json()["state"] == "pending"
    doc = {"device_id": "cam-1", "model": "m", "version": "1", "ts": 1.0}
    anon = httpx.Client(base_url=client.base_url)
    pend = anon.post("/api/v1/devices/cam-1/decisions", json=sign_doc(doc, squatter))
    unknown = anon.post("/api/v1/devices/nobody/decisions", json=sign_doc({**doc, "device_id": "nobody"}, squatter))
    assert pend.status_code == unknown.status_code == 403
    assert pend.json()["error"].replace("cam-1", "X") == unknown.json()["error"].replace("nobody", "X")
    again = anon.post("/api/v1/enroll", json=request("cam-1", device_key(tmp / "keys" / "other")))
    new = anon.post("/api/v1/enroll", json=request("cam-2", device_key(tmp / "keys" / "cam-2")))
    assert (again.status_code, again.json()["state"]) == (new.status_code, new.json()["state"]) == (202, "pending")
    r = client.post("/api/v1/devices", json={"device_id": "cam-1", "public_key": public_pem(real.public_key())})
    assert r.status_code == 201 and r.json()["state"] == "accepted", r.text
    audit = client.get("/api/v1/audit").json()["entries"]
    assert any(a["action"] == "device.pending_dropped" and a["target"] == "cam-1" for a in audit)
    assert client.post("/api/v1/enroll", json=request("cam-1", real)).json()["state"] == "accepted"
    r = client.post("/api/v1/enroll", json=request("cam-1", squatter))
    assert r.status_code == 403 and r.json()["error"].startswith("device_id:")
    anon.close()


def test_device_posts_are_limited_per_address_and_per_device(limited):
    cp, client, tmp = limited
    key = _accepted(client, tmp, "cam-9")
    docs = [  # distinct documents: the same one twice is an idempotent 200 (freshness), not a second post
        sign_doc({"device_id": "cam-9", "deployment_id": "m-1-a", "model": "m", "version": "1", "ts": 1.0 + i}, key)
        for i in range(4)
    ]
    # another loopback source address: a bucket of its own (the admin client's address is not touched)
    other = httpx.Client(base_url=client.base_url, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    codes = [other.post("/api/v1/devices/cam-9/decisions", json=doc).status_code for doc in docs[:3]]
    r = other.post("/api/v1/devices/cam-9/decisions", json=docs[3])
    assert codes + [r.status_code] == [201, 201, 429, 429], r.text  # the device's burst is 2
    assert r.json()["error"].startswith("rate: too many requests for device cam-9")
    assert counts(cp)["device_documents"] == 1  # the second copy replaced the first (same deployment)
    flood = [other.post("/api/v1/enroll", content=b"{}").status_code for _ in range(8)]
    assert flood == [400, 400] + [429] * 6  # the address's burst of 6, four taken above: body checks, then 429
    assert client.post("/api/v1/enroll", json=request("x-1", device_key(tmp / "keys" / "x-1"))).status_code == 202
    other.close()


def test_a_status_over_mqtt_that_does_not_fit_is_not_kept(svc):
    """The fleet loop's intake (agent.controlplane.fleetloop) on the real database, without a broker: a verified
    status of the wrong shape changes nothing; a good one is kept."""
    from agent.controlplane.fleetloop import FleetLoop

    cp, client, tmp = svc
    _accepted(client, tmp, "st-1")
    loop = FleetLoop(cp.factory, cp.settings)
    good = {"trust": "verified", "online": True, "ts": 5.0, "models": {"m": {"version": "2", "state": "committed"}}}
    for bad in ({"models": [1]}, {"hardware": {"a": {"b": 1}}}, {"target": "t" * 65}, {"online": "yes"}):
        loop._ingest({"st-1": {**good, **bad}})
    assert client.get("/api/v1/devices/st-1").json()["status"] is None
    deep: dict = {}
    for _ in range(40):
        deep = {"a": deep}
    loop._ingest({"st-1": {**good, "extra": deep}})
    assert client.get("/api/v1/devices/st-1").json()["status"] is None
    loop._ingest({"st-1": dict(good)})
    got = client.get("/api/v1/devices/st-1").json()
    assert got["online"] is True and got["models"] == {"m": {"version": "2", "state": "committed"}}


def test_a_model_upload_over_max_body_bytes_is_cut_off_and_nothing_kept(tmp_path, db_url):
    with running_service(tmp_path, database={"url": db_url}, max_body_bytes=4096) as (cp, url):
        h = {"Authorization": f"Bearer {cp.admin_token}"}
        for body in (b"\0" * 5000, iter([b"\0" * 1024] * 5)):  # declared, then streamed without a length
            r = httpx.put(url + "/api/v1/models/m/versions/1", content=body, headers=h)
            assert r.status_code == 413 and r.json()["error"] == "body: more than 4096 bytes for this route"
        r = httpx.post(url + "/api/v1/enroll", content=b" " * 4000)  # other routes keep their own caps
        assert r.status_code == 400
        assert httpx.get(url + "/api/v1/models", headers=h).json()["models"] == []
        assert not any(p.is_file() for p in (tmp_path / "store").rglob("*"))
