"""Freshness of signed device documents against the real service (uvicorn on a socket, SQLite and a real
PostgreSQL), with real device keys, the device's own signing code (agent.transport.cpclient, its durable
sequence agent.transport.docseq) and real attestations (agent.evidence.attest): a replayed older decision record
is refused and the newer one stays shown (API and device page); one conformance report posted 50 times is one
row; an attestation of deployment X in deployment Y's record is refused; an equal sequence with other content,
a timestamp far ahead, and an unsequenced document after sequenced ones are refused; a real ControlPlaneSync
restarted on the same state_dir keeps counting, and one restored from an older backup moves above the service's
mark."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from cp_support import running_service
from sqlalchemy import func, select

from agent.artifacts.keys import device_key, public_pem
from agent.controlplane.models import DeviceDocument
from agent.evidence.attest import Attestor
from agent.lifecycle.journal import Deployment
from agent.lifecycle.states import State
from agent.transport import docseq
from agent.transport.cpclient import signed_decision, signed_document
from agent.transport.signing import sign_doc


@pytest.fixture
def svc(tmp_path, db_url):
    # per-device rate limits above what these tests post (tests/test_controlplane_limits.py tests the limits)
    limits = {"key_burst": 100, "key_per_minute": 600}
    with running_service(tmp_path, database={"url": db_url}, limits=limits) as (cp, base_url):
        client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
        yield cp, client, tmp_path
        client.close()


def _device(client, tmp, dev="dev-1"):
    """An accepted device (the operator pre-registered its key): its state_dir and key."""
    state = tmp / "devices" / dev
    key = device_key(state)
    r = client.post("/api/v1/devices", json={"device_id": dev, "public_key": public_pem(key.public_key())})
    assert r.status_code == 201, r.text
    return state, key


def _deployment(state, dep_id, model="m", version="1", sha="ab" * 32):
    dep = Deployment(dep_id, model, version, State.COMMITTED, {"kind": "manifest"}, time.time(), time.time())
    dep.data.update(sha256=sha, selected={"provider": "cpu", "precision": "f32"})
    decision = {"model": {"name": model, "version": version}, "selected": "cpu", "reason": "fastest passing"}
    (state / "decisions").mkdir(parents=True, exist_ok=True)
    (state / "decisions" / f"{dep_id}.json").write_text(json.dumps({**decision, "artifact_sha256": sha}))
    Attestor(state, "dev-1").qualification(dep, decision)
    return dep


def _rows(cp, kind):
    with cp.factory() as s:
        return s.scalar(select(func.count()).select_from(DeviceDocument).where(DeviceDocument.kind == kind))


def test_a_replayed_older_decision_record_is_refused_and_the_newer_stays_shown(svc):
    cp, client, tmp = svc
    state, key = _device(client, tmp)
    dep = _deployment(state, "m-1-abc")
    f = state / "decisions" / "m-1-abc.json"
    qualified = signed_decision("dev-1", key, f, state / "attestations", seq=docseq.take(state))
    assert client.post("/api/v1/devices/dev-1/decisions", json=qualified).status_code == 201
    Attestor(state, "dev-1").trial(dep, "rolled_back", "p99 regressed in probation")  # the record grows
    f.write_text(json.dumps({**json.loads(f.read_text()), "probation": {"verdict": "rolled_back"}}))
    rolled_back = signed_decision("dev-1", key, f, state / "attestations", seq=docseq.take(state))
    r = client.post("/api/v1/devices/dev-1/decisions", json=rolled_back)
    assert r.status_code == 201 and r.json()["document"]["seq"] == 2, r.text

    r = client.post("/api/v1/devices/dev-1/decisions", json=qualified)  # the attacker's captured copy
    assert r.status_code == 409, r.text
    assert "seq: 1 is older" in r.json()["error"] and "highest seen 2" in r.json()["error"]
    got = client.get("/api/v1/devices/dev-1").json()
    assert [(d["seq"], d["doc"]["decision"].get("probation")) for d in got["decisions"]] == [
        (2, {"verdict": "rolled_back"})
    ]
    assert sorted(a["kind"] for a in got["attestations"]) == ["qualification", "trial"]
    page = client.get("/devices/dev-1").text
    assert "<td>trial</td>" in page and "rolled_back" in page
    assert _rows(cp, "decision") == 1
    audit = client.get("/api/v1/audit", params={"limit": 20}).json()["entries"]
    assert any(a["action"] == "decision.refused" and "older" in a["detail"]["reason"] for a in audit)

    r = client.post("/api/v1/devices/dev-1/decisions", json=rolled_back)  # the newer one again: idempotent
    assert r.status_code == 200 and r.json()["duplicate"] is True and r.json()["document"]["seq"] == 2
    assert _rows(cp, "decision") == 1


def test_one_conformance_report_posted_50_times_is_one_row(svc):
    cp, client, tmp = svc
    state, key = _device(client, tmp)
    report = {"kind": "conformance", "summary": {"passed": 41, "failed": 0}, "provider": "cpu"}
    doc = signed_document("dev-1", key, report, seq=docseq.take(state))
    codes = [client.post("/api/v1/devices/dev-1/conformance", json=doc).status_code for _ in range(50)]
    assert codes == [201] + [200] * 49
    assert len(client.get("/api/v1/devices/dev-1/conformance").json()["reports"]) == 1
    assert _rows(cp, "conformance") == 1
    newer = signed_document("dev-1", key, {**report, "summary": {"passed": 40, "failed": 1}}, seq=docseq.take(state))
    assert client.post("/api/v1/devices/dev-1/conformance", json=newer).status_code == 201
    assert _rows(cp, "conformance") == 2


def test_an_attestation_of_another_deployment_or_artifact_is_refused(svc):
    cp, client, tmp = svc
    state, key = _device(client, tmp)
    _deployment(state, "m-1-xxx", version="1", sha="aa" * 32)
    (state / "decisions").mkdir(exist_ok=True)
    (state / "decisions" / "m-2-yyy.json").write_text(
        json.dumps({"model": {"name": "m", "version": "2"}, "selected": "cpu", "artifact_sha256": "bb" * 32})
    )
    x_att = state / "attestations" / "m-1-xxx.qualification.intoto.json"
    (state / "attestations" / "m-2-yyy.qualification.intoto.json").write_bytes(x_att.read_bytes())
    y = signed_decision(
        "dev-1", key, state / "decisions" / "m-2-yyy.json", state / "attestations", seq=docseq.take(state)
    )
    r = client.post("/api/v1/devices/dev-1/decisions", json=y)
    assert r.status_code == 422, r.text
    assert "attests deployment 'm-1-xxx'" in r.json()["error"] and "'m-2-yyy'" in r.json()["error"]

    f = state / "decisions" / "m-1-xxx.json"  # X's own record naming another artifact than its attestation
    f.write_text(json.dumps({**json.loads(f.read_text()), "artifact_sha256": "cc" * 32}))
    x = signed_decision("dev-1", key, f, state / "attestations", seq=docseq.take(state))
    r = client.post("/api/v1/devices/dev-1/decisions", json=x)
    assert r.status_code == 422 and "attests artifact sha256 '" + "aa" * 32 + "'" in r.json()["error"], r.text
    got = client.get("/api/v1/devices/dev-1").json()
    assert (got["decisions"], got["attestations"], _rows(cp, "decision")) == ([], [], 0)

    f.write_text(json.dumps({**json.loads(f.read_text()), "artifact_sha256": "aa" * 32}))  # the true one
    x = signed_decision("dev-1", key, f, state / "attestations", seq=docseq.take(state))
    assert client.post("/api/v1/devices/dev-1/decisions", json=x).status_code == 201
    listed = client.get("/api/v1/devices/dev-1/attestations").json()["attestations"]
    assert [(a["deployment_id"], a["verified"]) for a in listed] == [("m-1-xxx", True)]


def test_equal_sequence_future_timestamp_and_unsequenced_after_sequenced_are_refused(svc):
    cp, client, tmp = svc
    state, key = _device(client, tmp)
    base = {"deployment_id": "d1", "model": "m", "version": "1", "decision": {"selected": "cpu"}}
    legacy = sign_doc({**base, "device_id": "dev-1", "ts": time.time()}, key)  # a device from before `seq`
    assert client.post("/api/v1/devices/dev-1/decisions", json=legacy).status_code == 201
    assert client.post("/api/v1/devices/dev-1/decisions", json=legacy).status_code == 200  # same one: no new row
    seq = docseq.take(state)
    first = signed_document("dev-1", key, base, seq=seq)
    assert client.post("/api/v1/devices/dev-1/decisions", json=first).status_code == 201
    other = signed_document("dev-1", key, {**base, "decision": {"selected": "openvino"}}, seq=seq)
    r = client.post("/api/v1/devices/dev-1/decisions", json=other)
    assert r.status_code == 409 and "seq: 1 was already signed" in r.json()["error"], r.text
    later = sign_doc({**base, "device_id": "dev-1", "ts": time.time() + 3600, "seq": docseq.take(state)}, key)
    r = client.post("/api/v1/devices/dev-1/decisions", json=later)
    assert r.status_code == 422 and "ahead of the service's clock" in r.json()["error"], r.text
    unsequenced = sign_doc({**base, "device_id": "dev-1", "ts": time.time(), "decision": {"n": 2}}, key)
    r = client.post("/api/v1/devices/dev-1/decisions", json=unsequenced)
    assert r.status_code == 409 and "seq: missing" in r.json()["error"], r.text
    for bad in (0, -1, "3", 2.5, True, 2**63):
        r = client.post("/api/v1/devices/dev-1/decisions", json=sign_doc({**first, "seq": bad}, key))
        assert r.status_code == 422 and r.json()["error"].startswith("seq:"), (bad, r.text)
    forged = signed_document("dev-1", device_key(tmp / "someone"), base, seq=docseq.take(state))
    assert client.post("/api/v1/devices/dev-1/decisions", json=forged).status_code == 403
    got = client.get("/api/v1/devices/dev-1/decisions").json()["decisions"]
    assert [(d["seq"], d["doc"]["decision"]) for d in got] == [(1, {"selected": "cpu"})]
    audit = client.get("/api/v1/audit", params={"limit": 30}).json()["entries"]
    reasons = [a["detail"]["reason"].split(":")[0] for a in audit if a["action"] == "decision.refused"]
    assert sorted(set(reasons)) == ["seq", "sig", "ts"] and len(reasons) == 10  # each refusal audited


class _Recording:
    """The daemon's HTTP port (real requests), keeping a copy of each document it posts."""

    def __init__(self, url):
        from agent.services.cpsync import HttpControlPlane

        self.http, self.url, self.posted = HttpControlPlane(url), url, []

    def enroll(self, doc):
        return self.http.enroll(doc)

    def post_decision(self, device_id, doc):
        self.posted.append(doc)
        return self.http.post_decision(device_id, doc)


def _settled(path):
    old = time.time() - 5  # as if written a while ago (the sync leaves records younger than SETTLE_S)
    os.utime(path, (old, old))
    for att in path.parent.parent.glob(f"attestations/{path.stem}.*"):
        os.utime(att, (old, old))


@pytest.mark.parametrize("svc", ["sqlite"], indirect=True)
def test_a_restarted_sync_keeps_counting_and_a_restored_backup_moves_above_the_mark(svc):
    from agent.services.cpsync import ControlPlaneSync

    cp, client, tmp = svc
    state, key = _device(client, tmp)
    _deployment(state, "m-1-abc")
    f = state / "decisions" / "m-1-abc.json"
    _settled(f)
    port = _Recording(str(client.base_url))
    sync = ControlPlaneSync(port, state, "dev-1", key)
    assert sync.round_safely() and sync.last_error is None, sync.last_error
    assert [d["seq"] for d in port.posted] == [1] and docseq.current(state) == 1

    sync = ControlPlaneSync(port, state, "dev-1", key)  # the daemon restarted on the same state_dir
    f.write_text(json.dumps({**json.loads(f.read_text()), "probation": {"verdict": "rolled_back"}}))
    _settled(f)
    sync.round_safely()
    assert sync.last_error is None and [d["seq"] for d in port.posted] == [1, 2], sync.last_error
    assert json.loads((state / docseq.FILE).read_text()) == {"seq": 2}
    r = client.post("/api/v1/devices/dev-1/decisions", json=port.posted[0])  # the first one replayed
    assert r.status_code == 409 and "highest seen 2" in r.json()["error"]

    (state / docseq.FILE).write_text(json.dumps({"seq": 1}))  # state_dir restored from an older backup
    f.write_text(json.dumps({**json.loads(f.read_text()), "probation": {"verdict": "committed"}}))
    _settled(f)
    sync = ControlPlaneSync(port, state, "dev-1", key)
    sync.round_safely()
    assert "HTTP 409" in str(sync.last_error) and docseq.current(state) == 3  # moved above the service's 2
    sync.round_safely()
    assert [d["seq"] for d in port.posted] == [1, 2, 2, 4] and sync.snapshot()["pending"] == 0
    got = client.get("/api/v1/devices/dev-1/decisions").json()["decisions"]
    assert [(d["seq"], d["doc"]["decision"]["probation"]) for d in got] == [(4, {"verdict": "committed"})]


def test_a_database_from_before_freshness_is_upgraded_and_its_devices_move_to_sequences(tmp_path):
    """Revision 0001 with an accepted device and its unsequenced record: the service migrates it; the old row
    lists with seq null; the device's unsequenced posts still count until its first sequenced one; after that
    an unsequenced copy (the one an attacker captured before the upgrade) is refused."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from agent.artifacts.keys import key_id
    from agent.controlplane import db

    url = f"sqlite:///{tmp_path / 'cp.db'}"
    state = tmp_path / "devices" / "dev-1"
    key = device_key(state)
    base = {"device_id": "dev-1", "deployment_id": "d1", "model": "m", "version": "1"}
    captured = sign_doc({**base, "decision": {"selected": "cpu"}, "ts": time.time()}, key)
    engine = db.make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(db.MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
        conn.execute(
            text(
                "INSERT INTO devices (device_id, state, public_key, key_id, groups, online, hardware, requested_at)"
                " VALUES ('dev-1', 'accepted', :pem, :kid, '[]', 0, '{}', 1.0)"
            ),
            {"pem": public_pem(key.public_key()), "kid": key_id(key.public_key())},
        )
        conn.execute(
            text(
                "INSERT INTO device_documents (device_id, kind, model, version, doc, ts)"
                " VALUES ('dev-1', 'decision', 'm', '1', :doc, 1.0)"
            ),
            {"doc": json.dumps({k: v for k, v in captured.items() if k != "sig"})},
        )
    engine.dispose()
    # per-device rate limits above what these tests post (tests/test_controlplane_limits.py tests the limits)
    limits = {"key_burst": 100, "key_per_minute": 600}
    with running_service(tmp_path, database={"url": url}, limits=limits) as (cp, base_url):
        client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
        got = client.get("/api/v1/devices/dev-1/decisions").json()["decisions"]
        assert [(d["seq"], d["doc"]["decision"]) for d in got] == [(None, {"selected": "cpu"})]
        grown = sign_doc({**base, "decision": {"selected": "cpu", "probation": "rolled_back"}, "ts": time.time()}, key)
        assert client.post("/api/v1/devices/dev-1/decisions", json=grown).status_code == 201  # not upgraded yet
        upgraded = signed_document("dev-1", key, {**base, "decision": {"probation": "rolled_back"}}, docseq.take(state))
        assert client.post("/api/v1/devices/dev-1/decisions", json=upgraded).status_code == 201
        r = client.post("/api/v1/devices/dev-1/decisions", json=captured)
        assert r.status_code == 409 and "seq: missing" in r.json()["error"], r.text
        got = client.get("/api/v1/devices/dev-1/decisions").json()["decisions"]
        assert [(d["seq"], d["doc"]["decision"]) for d in got] == [(1, {"probation": "rolled_back"})]
        client.close()
