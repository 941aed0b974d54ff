"""What the control plane observes, over real sockets on SQLite and on a real PostgreSQL: devices' signed health
messages over a real Mosquitto kept downsampled with the per-device bound holding, drawn as server-side SVG charts
(per device and per hardware class) with the hostile figures and labels a device may send read as not measured or
escaped; the fleet evidence matrix from signed decision records; alerts for a halted rollout, a rolled-back device
and a device gone silent, shown on the dashboard and POSTed to a real local webhook receiver once per raise (each
alert's first answer a 500, the retry's a 1 MB body); the charts rendered in Debian's chromium (Playwright), screenshots
kept in $EDGE_AGENT_ARTIFACTS/control-plane/; a real daemon's own health messages drawn."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from brokers import Mosquitto
from cp_support import artifacts_dir, browser_page, running_service
from support.httpd import LoopbackHTTP, QuietHandler
from support.wait import wait_for

from agent.artifacts.keys import device_key, generate
from agent.transport.cpclient import enroll_request
from agent.transport.device import DeviceLink
from agent.transport.mqtt import BrokerConfig, MqttLink
from agent.transport.signing import sign_doc

HOSTILE = '<script>alert("x")</script>'
pytestmark = [pytest.mark.timeout(600)]


class Receiver(LoopbackHTTP):
    """A webhook receiver on a free loopback port: the first POST of each alert gets a 500, the next ones 200
    with a 1 MB body."""

    def __init__(self):
        got = self.got = []
        lock = threading.Lock()

        class Handler(QuietHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    got.append(body)
                    first = sum(d["key"] == body["key"] for d in got) == 1
                if first:
                    self.answer(500)
                else:
                    self.answer(200, b"x" * (1 << 20))

        super().__init__(Handler, "/hook")

    def keys(self, key: str) -> list[dict]:
        return [d for d in list(self.got) if d["key"] == key]


def _health(i: int, **over) -> dict:
    doc = {
        "ts": 1_700_000_000.0 + i,
        "cpu": {"percent": 10.0 + i, "load_1m": 0.5},
        "memory": {"used_percent": 40.0, "agent_rss_bytes": 50 * 1048576},
        "temperature_max_c": 50.0 + i,
        "throttling": {"raw": "0x0", "throttled": False},
        "models": {"tiny": {"version": "1", "requests": 100 * i, "errors": i, "p50_ms": 1.5, "p99_ms": 3.0 + i}},
    }
    doc.update(over)
    return doc


def _decision(dev: str, key, selected: str, not_judged: bool) -> dict:
    rows = [
        {"key": selected, "provider": selected, "precision": "fp32", "status": "passed",
         "accuracy": {"max_rel": 2e-7}, "latency_ms": {"p50": 1.25, "p99": 4.5}},
    ]  # fmt: skip
    doc = {"device_id": dev, "model": "tiny", "version": "1", "ts": time.time(), "deployment_id": f"tiny-1-{dev}"}
    doc["decision"] = {"selected": selected, "selected_precision": "fp32", "results": rows, "reason": "fastest"}
    if not_judged:
        doc["probation"] = {"not_judged": {"measured": 3, "needed": 64, "contended": 61}}
    return sign_doc(doc, key)


def test_telemetry_charts_matrix_alerts_and_webhook(tmp_path, db_url):
    from agent.artifacts.packtar import write_targz
    from agent.samples import tiny_model, write_package

    hook = Receiver()
    with Mosquitto(tmp_path / "mosquitto") as broker:
        fleet_key, _, _ = generate(tmp_path / "fleet")
        doc = {
            "database": {"url": db_url},
            "mqtt": {"url": broker.url},
            "signing_key": str(fleet_key),
            "tick_s": 0.2,
            "telemetry": {"bucket_s": 1, "max_points": 4, "retention_s": 3600},
            "alerts": {"check_s": 0.3, "silent_s": 4, "webhook": {"url": hook.url, "backoff_s": 0.05}},
        }
        with running_service(tmp_path / "cp", **doc) as (cp, url):
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
            keys, links = {}, {}
            for dev, target in (("dev-a", "rpi5-8gb"), ("dev-b", HOSTILE)):
                keys[dev] = device_key(tmp_path / "keys" / dev)
                r = api.post("/api/v1/enroll", json=enroll_request(dev, keys[dev], target=target))
                assert r.status_code == 202, r.text
                assert api.post(f"/api/v1/devices/{dev}/accept").status_code == 200
                links[dev] = DeviceLink(broker.url, dev, signer=keys[dev]).start(wait=15)
            try:
                for dev, link in links.items():
                    link.publish_status({"target": "rpi5-8gb" if dev == "dev-a" else HOSTILE, "models": {}})
                wait_for(
                    lambda: all(d["status_ts"] for d in api.get("/api/v1/devices").json()["devices"]), 60, "status"
                )
                _telemetry(api, links, tmp_path, broker.url)
                _matrix(api, keys)
                pkg = write_package(tmp_path / "tiny-1", tiny_model(1.0), name="tiny", version="1")
                write_targz(pkg, tmp_path / "tiny-1.tar.gz")
                r = api.put("/api/v1/models/tiny/versions/1", content=(tmp_path / "tiny-1.tar.gz").read_bytes())
                assert r.status_code == 201, r.text
                _alerts(api, cp, links, hook)
                if db_url.startswith("sqlite"):
                    _browser(url, cp)
            finally:
                for link in links.values():
                    link.stop()
                hook.close()


def _points(api, dev: str) -> dict:
    return api.get(f"/api/v1/devices/{dev}/telemetry").json()


def _telemetry(api, links, tmp_path, broker_url):
    a = links["dev-a"]
    # a message signed by another key for dev-a is not believed
    impostor = MqttLink(BrokerConfig(broker_url), client_id="impostor").start(wait=15)
    forged = sign_doc(dict(_health(90), device_id="dev-a"), device_key(tmp_path / "keys" / "impostor"))
    impostor.publish("edge/devices/dev-a/health", json.dumps(forged).encode(), qos=1).wait_for_publish(10)
    time.sleep(1.5)  # several ticks of the fleet loop
    impostor.stop()
    assert _points(api, "dev-a")["health"] == []
    for i in range(1, 8):  # 7 samples a second apart, each in its own 1 s bucket: those of the newest 4 kept
        time.sleep(1.02 - time.time() % 1.0)  # into the next second
        a.publish_health(_health(i))
    wait_for(lambda: (_points(api, "dev-a")["health"] or [{}])[-1].get("cpu_percent") == 17.0, 60, "sample 7")
    got = _points(api, "dev-a")
    cpus = [p["cpu_percent"] for p in got["health"]]
    assert got["max_points"] == 4 and 2 <= len(cpus) <= 4, got  # a sample ingested late shares a bucket
    assert cpus == sorted(cpus) and cpus[0] >= 14.0 and cpus[-1] == 17.0, cpus  # the newest, in order
    assert got["health"][-1]["ts"] - got["health"][0]["ts"] <= 3.0
    tiny = got["models"]["tiny"]
    assert len(tiny) == len(cpus) and all(p["req_per_s"] and p["req_per_s"] > 0 for p in tiny), tiny
    assert all(p["cpu_percent"] != 100.0 for p in got["health"])  # the forged sample 90 never counted
    # hostile figures and names: out of range is not measured, a name against the rule is dropped
    bad = _health(1, cpu={"percent": 1e308}, temperature_max_c="hot", memory={"used_percent": -3})
    bad["models"] = {HOSTILE: {"requests": 5}, "ok": {"version": "1", "requests": True, "p99_ms": "fast"}}
    links["dev-b"].publish_health(bad)
    wait_for(lambda: _points(api, "dev-b")["models"], 60, "dev-b health")
    b = _points(api, "dev-b")
    assert list(b["models"]) == ["ok"] and b["models"]["ok"][0]["p99_ms"] is None
    assert b["health"][0]["cpu_percent"] is None and b["health"][0]["temp_max_c"] is None
    n = len(_points(api, "dev-a")["health"])  # dev-a reports no more: its points stay until retention
    page = api.get("/devices/dev-a/charts").text
    assert page.count("<svg") >= 6 and f'data-points="{n}"' in page and "<polyline" in page, page
    assert "°C" in page and "req/s" in page and "time (UTC)" in page
    page_b = api.get("/devices/dev-b/charts").text
    assert "not measured" in page_b and "<script>" not in page_b and "&lt;script&gt;" in page_b
    cls = api.get("/charts", params={"target": HOSTILE}).text
    assert "&lt;script&gt;" in cls and "<script>" not in cls and "not measured" in cls  # dev-b's figures
    cls_a = api.get("/charts", params={"target": "rpi5-8gb"}).text
    assert f'data-points="{n}"' in cls_a and "mean of the devices" in cls_a
    classes = api.get("/charts").text
    assert "/charts?target=rpi5-8gb" in classes and "&lt;script&gt;" in classes and "<script>" not in classes


def _matrix(api, keys):
    for dev, selected, nj in (("dev-a", "cpu", False), ("dev-b", "openvino", True)):
        r = api.post(f"/api/v1/devices/{dev}/decisions", json=_decision(dev, keys[dev], selected, nj))
        assert r.status_code == 201, r.text
    m = api.get("/api/v1/evidence").json()
    assert m["classes"] == sorted(["rpi5-8gb", HOSTILE]), m
    (row,) = m["rows"]
    cell_a, cell_b = row["cells"]["rpi5-8gb"], row["cells"][HOSTILE]
    assert cell_a["devices"] == 1 and cell_a["not_judged"] == 0 and cell_a["choices"][0]["provider"] == "cpu"
    assert cell_a["choices"][0]["p99_ms"] == 4.5 and cell_a["choices"][0]["max_rel_worst"] == 2e-7
    assert cell_b["not_judged"] == 1 and cell_b["choices"][0]["provider"] == "openvino"
    page = api.get("/evidence").text
    assert "/evidence/cell?model=tiny&amp;version=1&amp;target=rpi5-8gb" in page and "1 not judged" in page
    assert "<b>cpu</b> fp32" in page and "&lt;script&gt;" in page and "<script>" not in page
    cell = api.get("/evidence/cell", params={"model": "tiny", "version": "1", "target": "rpi5-8gb"}).text
    assert '<a href="/devices/dev-a">dev-a</a>' in cell and "dev-b" not in cell


def _active(api, key: str):
    return next((a for a in api.get("/api/v1/alerts").json()["alerts"] if a["key"] == key), None)


def _alerts(api, cp, links, hook):
    body = {"model": "tiny", "version": "1", "canary": "1", "wave_size": "100%", "deadline_s": 600}
    assert api.post("/api/v1/rollouts", json=body).status_code == 202
    assert api.post("/api/v1/rollouts/tiny-1/halt").status_code == 200
    key = "rollout_halted:tiny-1"
    wait_for(lambda: len(hook.keys(key)) >= 2, 60, "the webhook's second attempt (the first got a 500)")
    wait_for(lambda: (_active(api, key) or {}).get("webhook", {}).get("state") == "sent", 60, "delivery recorded")
    a = _active(api, key)
    assert a["webhook"]["attempts"] == 2 and "halted by an operator" in a["message"]
    page = api.get("/alerts").text
    assert "rollout tiny-1 halted" in page and 'href="/rollouts/tiny-1"' in page
    assert '<b class="count">' in api.get("/").text
    for _ in range(4):  # more checks: still one delivery (two attempts) of this raise
        cp.alerts.checked.clear()
        cp.alerts.checked.wait(10)
    assert len(hook.keys(key)) == 2
    assert api.post("/api/v1/rollouts/tiny-1/resume").status_code == 200
    wait_for(lambda: _active(api, key) is None, 60, "the alert cleared")
    assert api.post("/api/v1/rollouts/tiny-1/halt").status_code == 200
    wait_for(lambda: len(hook.keys(key)) == 3, 60, "raised again after clearing: sent again")
    # a rolled-back device, its reason escaped on the page
    dep = {"tiny": {"version": "2", "state": "rolled_back", "result": "rolled_back", "reason": "<b>p99 x3</b>"}}
    links["dev-a"].publish_status({"target": "rpi5-8gb", "models": {}, "deployments": dep})
    rb = "device_rolled_back:dev-a:tiny"
    wait_for(lambda: len(hook.keys(rb)) == 2, 60, "rolled-back alert sent")
    page = api.get("/alerts").text
    assert "&lt;b&gt;p99 x3&lt;/b&gt;" in page and "<b>p99" not in page
    # a version its probation could not judge
    nj = {"tiny": {"version": "1", "state": "committed", "probation": {"not_judged": {"measured": 3, "needed": 64}}}}
    links["dev-b"].publish_status({"target": HOSTILE, "models": {"tiny": {"version": "1", "state": "committed"}},
                                   "deployments": nj})  # fmt: skip
    wait_for(lambda: _active(api, "device_not_judged:dev-b:tiny"), 60, "not-judged alert")
    assert "not judged" in _active(api, "device_not_judged:dev-b:tiny")["message"]
    # dev-b sent one health message long ago: gone silent; one more and it is back
    wait_for(lambda: _active(api, "device_silent:dev-b"), 60, "dev-b silent")
    links["dev-b"].publish_health(_health(50))
    wait_for(lambda: _active(api, "device_silent:dev-b") is None, 60, "dev-b heard again")
    # a deleted device takes its telemetry and evidence along; its alerts clear
    gone = api.delete("/api/v1/devices/dev-b").json()["deleted"]
    assert gone["telemetry_points"] >= 1 and gone["evidence_rows"] == 1 and gone["telemetry_heads"] == 1, gone
    assert api.get("/api/v1/evidence").json()["classes"] == ["rpi5-8gb"]
    wait_for(lambda: _active(api, "device_not_judged:dev-b:tiny") is None, 60, "a deleted device's alert cleared")


def _browser(url, cp):
    auth = {"Authorization": f"Bearer {cp.admin_token}"}
    shots = artifacts_dir()
    with browser_page() as page:
        page.goto(url + "/login")
        page.fill("input[name=token]", cp.admin_token)
        page.click("button[type=submit]")
        page.goto(url + "/devices/dev-a/charts")
        n = len(httpx.get(url + "/api/v1/devices/dev-a/telemetry", headers=auth).json()["health"])
        cpu = page.locator("#chart-cpu_percent svg")
        assert cpu.get_attribute("data-points") == str(n)
        box = cpu.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 100  # laid out, not an empty element
        assert page.locator("#chart-cpu_percent circle.pt").count() == n
        assert page.locator("svg.chart polyline").count() >= 6
        page.screenshot(path=str(shots / "charts-device.png"), full_page=True)
        page.goto(url + "/evidence")
        assert page.locator("#matrix a").count() == 1 and "cpu fp32" in page.inner_text("#matrix")  # dev-b gone
        page.screenshot(path=str(shots / "evidence-matrix.png"), full_page=True)
        page.goto(url + "/alerts")
        assert "rollout tiny-1 halted" in page.inner_text("#alerts")
        page.screenshot(path=str(shots / "alerts.png"), full_page=True)


def test_a_real_daemons_health_reaches_the_charts(tmp_path):
    """`edge-agent run` with `control_plane` (it enrolls itself with a token) and `telemetry.interval_s: 1`: its
    signed health messages, as the daemon publishes them, become points of its charts: CPU measured by psutil on
    this host, and the served model's requests/s derived from the counter the inference requests below move."""
    from support.daemon import Daemon, write_config

    from agent.artifacts.packtar import write_targz
    from agent.samples import sample_tiny_package

    with Mosquitto(tmp_path / "mosquitto") as broker:
        fleet_key, fleet_pub, _ = generate(tmp_path / "keys")
        doc = {"signing_key": str(fleet_key), "mqtt": {"url": broker.url}, "tick_s": 0.3, "telemetry": {"bucket_s": 1}}
        with running_service(tmp_path / "cp", **doc) as (cp, url):
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30)
            grant = api.post("/api/v1/enroll-tokens", json={"name": "lab", "groups": ["lab"], "uses": 1})
            (tmp_path / "enroll.token").write_text(grant.json()["token"] + "\n")
            extra = {
                "trust": {"public_keys": [str(fleet_pub)]},
                "control_plane": {"url": url, "retry_max_s": 2, "token_file": str(tmp_path / "enroll.token")},
                "telemetry": {"interval_s": 1},
            }
            config = write_config(tmp_path / "dev", mqtt={"url": broker.url}, extra=extra)
            daemon = Daemon(config, tmp_path / "dev" / "state")
            try:
                daemon.wait_ready()
                wait_for(lambda: api.get("/api/v1/devices/dev-1").json().get("state") == "accepted", 60, "enrolled")
                write_targz(sample_tiny_package(tmp_path / "tiny-1", version="1"), tmp_path / "tiny-1.tar.gz")
                r = api.put("/api/v1/models/tiny/versions/1", content=(tmp_path / "tiny-1.tar.gz").read_bytes())
                assert r.status_code == 201, r.text
                r = api.post("/api/v1/push", json={"model": "tiny", "version": "1", "devices": ["dev-1"]})
                assert r.status_code == 200, r.text
                assert daemon.wait_deployment("1", timeout=240)["result"] == "committed", daemon.tail()
                infer = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}

                def served():
                    for _ in range(20):
                        assert httpx.post(f"{daemon.url}/v2/models/tiny/infer", json=infer).status_code == 200
                    tiny = _points(api, "dev-1")["models"].get("tiny") or []
                    return any(p["req_per_s"] for p in tiny) and tiny

                wait_for(served, 120, "requests/s of tiny from the daemon's health messages")
                got = _points(api, "dev-1")
                assert any(p["cpu_percent"] is not None for p in got["health"]), got["health"]
                page = api.get("/devices/dev-1/charts").text
                assert "<polyline" in page and 'id="chart-tiny-req_per_s"' in page
            finally:
                daemon.terminate()
