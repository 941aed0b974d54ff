"""The pieces behind the control plane's charts, matrix and alerts, without a service: chart geometry, hostile
health figures read as not measured, the bucket merge and the retention bounds on a real migrated SQLite
database (the service's clock injected), the config sections, and the webhook's POST against real local HTTP
servers (a 3xx is not followed, a receiver that never answers times out, a huge answer is read only to its
bound)."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import func, select
from support.httpd import LoopbackHTTP, QuietHandler

from agent.controlplane import charts, db, matrix
from agent.controlplane.obs_tables import ModelPoint, TelemetryPoint
from agent.controlplane.observe_settings import TelemetrySettings, parse_alerts, parse_telemetry
from agent.controlplane.telemetry_intake import parse, prune, prune_all, record, sample
from agent.controlplane.webhook import post
from agent.errors import ConfigError


def test_a_chart_has_one_vertex_per_point_axes_with_units_and_says_not_measured_without_data():
    c = charts.layout("cpu", "CPU", "%", "psutil", [(100.0, 10.0), (160.0, None), (220.0, 30.0)], (0, 100))
    assert c["n"] == 2 and len(c["path"].split()) == 2 and len(c["dots"]) == 2 and not c["empty"]
    assert c["yticks"][0]["label"] == "0" and c["yticks"][-1]["label"] == "100"
    assert "10 % at" in c["dots"][0]["label"]
    assert charts.layout("t", "Temperature", "°C", "sysfs", [(1.0, None)])["empty"]
    flat = charts.layout("t", "T", "°C", "x", [(1.0, 5.0)])  # one point, one value: still a range to draw in
    assert flat["n"] == 1 and flat["yticks"][0]["label"] != flat["yticks"][-1]["label"]
    many = charts.layout("r", "R", "req/s", "x", [(float(i), float(i)) for i in range(2000)])
    assert many["n"] == charts.MAX_DRAWN and many["dots"] == []


def test_hostile_health_figures_are_not_measured():
    doc = {
        "ts": "yesterday",
        "cpu": {"percent": 1e308, "load_1m": -1},
        "memory": {"used_percent": True, "agent_rss_bytes": 2**60},
        "temperature_max_c": 71.5,
        "gpu": "busy",
        "throttling": {"throttled": True},
        "models": {
            "<b>x</b>": {"requests": 1},
            "ok": {"version": {"v": 1}, "requests": 1.5, "errors": 2, "p50_ms": float("inf"), "p99_ms": 9.0},
            **{f"m{i:02d}": {"requests": i} for i in range(40)},
        },
    }
    smp = sample(doc)
    assert smp.device_ts is None and smp.throttled == 1
    assert smp.gauges["temp_max_c"] == 71.5
    assert all(v is None for k, v in smp.gauges.items() if k != "temp_max_c")
    assert "<b>x</b>" not in smp.models and len(smp.models) == 16
    assert parse(b"[" * 100 + b"]" * 100) is None and parse(b"{" + b" " * 70_000 + b"}") is None
    assert parse(b'{"cpu": {"percent": 5}}') == {"cpu": {"percent": 5}}


def _health(i: int, requests: int) -> dict:
    return {"ts": float(i), "cpu": {"percent": float(i)}, "models": {"m": {"version": "1", "requests": requests}}}


def test_samples_merge_per_bucket_and_the_bounds_hold(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    db.migrate(engine)
    factory = db.sessions(engine)
    cfg = TelemetrySettings(bucket_s=10, max_points=3, retention_s=3600)
    with db.write(factory) as s:
        assert record(s, "d", sample(_health(1, 0)), 1000.0, cfg)
        assert not record(s, "d", sample(_health(1, 0)), 1001.0, cfg)  # the same message again (retained copy)
        assert record(s, "d", sample(_health(3, 50)), 1005.0, cfg)  # same bucket: merged (mean of 1 and 3)
        for i in range(4, 10):
            record(s, "d", sample(_health(i, 50 + 100 * i)), 1000.0 + 10 * i, cfg)
        prune(s, cfg, 1090.0, ["d"], [""])  # after each tick's samples (telemetry_intake.ingest)
    with factory() as s:
        rows = s.scalars(select(TelemetryPoint).order_by(TelemetryPoint.ts)).all()
        assert [r.ts for r in rows] == [1070.0, 1080.0, 1090.0]  # 3 kept of 7 buckets
        assert [r.cpu_percent for r in rows] == [7.0, 8.0, 9.0]
        first = s.get(ModelPoint, ("d", "m", 1080.0))
        assert first is not None and first.req_per_s == pytest.approx(10.0)  # 100 requests in 10 s
        assert s.scalar(select(func.count()).select_from(ModelPoint)) == 3
    with db.write(factory) as s:
        record(s, "d", sample(_health(20, 0)), 1000.0 + 7200, cfg)  # two hours later: the old ones expire
        prune_all(s, cfg, 1000.0 + 7200)  # retention, at each alert check
    with factory() as s:
        assert s.scalars(select(TelemetryPoint.ts)).all() == [8200.0]
        (m,) = s.scalars(select(ModelPoint)).all()
        assert m.req_per_s is None  # the counter went down (a restart): no rate
    engine.dispose()


def test_config_sections_name_the_bad_key():
    assert parse_telemetry({"bucket_s": 30}).bucket_s == 30
    alerts = parse_alerts({"silent_s": 60, "webhook": {"url": "https://hooks.example/x", "max_attempts": 3}})
    assert alerts.silent_s == 60.0 and alerts.webhook.max_attempts == 3
    for doc, key in (
        ({"bucket_s": 0}, "telemetry.bucket_s"),
        ({"max_points": "many"}, "telemetry.max_points"),
        ({"retain": 1}, "telemetry.retain"),
    ):
        with pytest.raises(ConfigError, match=key):
            parse_telemetry(doc)
    for doc, key in (
        ({"webhook": {"url": "file:///etc/passwd"}}, "alerts.webhook.url"),
        ({"webhook": {"timeout_s": 0}}, "alerts.webhook.timeout_s"),
        ({"check_s": True}, "alerts.check_s"),
    ):
        with pytest.raises(ConfigError, match=key):
            parse_alerts(doc)


def test_matrix_figures_of_a_decision_record():
    row = {"key": "cpu", "precision": "fp32", "latency_ms": {"p50": 1.0, "p99": "slow"}, "accuracy": {"max_rel": 1e-6}}
    doc = {"decision": {"selected": "cpu", "results": [{"key": "gpu"}, row]}, "probation": {"not_judged": {}}}
    assert matrix.figures(doc) == {
        "provider": "cpu", "precision": "fp32", "p50_ms": 1.0, "p99_ms": None, "max_rel": 1e-6, "not_judged": True,
    }  # fmt: skip
    assert matrix.figures({"decision": "none"})["provider"] is None


def test_the_webhook_post_reads_the_answer_as_hostile():
    seen = []

    class Handler(QuietHandler):
        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            if self.path == "/redirect":
                self.send_response(307)
                self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/stall":
                time.sleep(3)
            else:
                self.answer(200, b"y" * (50 << 20))

    srv = LoopbackHTTP(Handler)
    try:
        assert post(srv.url + "ok", {"key": "a"}, 5.0, 4096) == (True, "HTTP 200")
        ok, note = post(srv.url + "redirect", {"key": "b"}, 5.0, 4096)
        assert not ok and note == "HTTP 307" and len(seen) == 2  # not followed
        ok, note = post(srv.url + "stall", {"key": "c"}, 0.5, 4096)
        assert not ok and "timed out" in note
        ok, note = post("http://127.0.0.1:9/", {"key": "d"}, 1.0, 10)
        assert not ok and note
    finally:
        srv.close()


def test_the_matrix_groups_evidence_rows_by_version_and_class_and_fills_in_older_records(tmp_path):
    from agent.controlplane.models import Device, DeviceDocument

    engine = db.make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    db.migrate(engine)
    factory = db.sessions(engine)

    def record_doc(dev: str, selected: str, p99: float, nj: bool) -> dict:
        row = {"key": selected, "precision": "fp16", "latency_ms": {"p50": 1.0, "p99": p99}}
        doc = {"model": "m", "version": "2", "decision": {"selected": selected, "results": [row]}}
        return {**doc, "probation": {"not_judged": {"measured": 1}}} if nj else doc

    with db.write(factory) as s:
        for i, (target, sel, p99, nj) in enumerate(
            (
                ("pi5", "cpu", 4.0, False),
                ("pi5", "cpu", 6.0, True),
                ("pi5", "qnn", 2.0, False),
                (None, "cpu", 1.0, False),
            )
        ):
            s.add(Device(device_id=f"d{i}", state="accepted", public_key="k", target=target, requested_at=0.0))
            doc = record_doc(f"d{i}", sel, p99, nj)
            s.add(DeviceDocument(device_id=f"d{i}", kind="decision", model="m", version="2", doc=doc, ts=float(i)))
    with db.write(factory) as s:  # stored before the evidence table existed: filled in
        assert matrix.backfill(s) == 4 and matrix.backfill(s) == 0
    with factory() as s:
        m = matrix.matrix(s)
        assert m["classes"] == ["", "pi5"] and len(m["rows"]) == 1
        pi5 = m["rows"][0]["cells"]["pi5"]
        assert pi5["devices"] == 3 and pi5["not_judged"] == 1
        cpu = next(c for c in pi5["choices"] if c["provider"] == "cpu")
        assert cpu["devices"] == 2 and cpu["p99_ms"] == 5.0 and cpu["p99_ms_worst"] == 6.0
        assert [e.device_id for e, _ in matrix.cell_devices(s, "m", "2", None, 0, 50)] == ["d3"]
    engine.dispose()


def test_a_class_rollup_holds_each_devices_share_once(tmp_path):
    from agent.controlplane import telemetry_query

    engine = db.make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    db.migrate(engine)
    factory = db.sessions(engine)
    cfg = TelemetrySettings(bucket_s=10, max_points=2, retention_s=3600)

    def h(ts: float, cpu: float, temp: float, requests: int) -> dict:
        return {"ts": ts, "cpu": {"percent": cpu}, "temperature_max_c": temp,
                "models": {"m": {"version": "1", "requests": requests, "p99_ms": temp / 10}}}  # fmt: skip

    with db.write(factory) as s:
        record(s, "a", sample(h(1, 10.0, 40.0, 0)), 1000.0, cfg, "pi")
        record(s, "b", sample(h(1, 30.0, 60.0, 0)), 1001.0, cfg, "pi")
        record(s, "a", sample(h(2, 30.0, 45.0, 0)), 1002.0, cfg, "pi")  # a's mean moves to 20: its share replaced
        record(s, "c", sample(h(1, 90.0, 99.0, 0)), 1003.0, cfg, "other")
        record(s, "a", sample(h(3, 20.0, 40.0, 100)), 1010.0, cfg, "pi")  # next bucket: a's requests/s
        record(s, "b", sample(h(3, 20.0, 40.0, 50)), 1011.0, cfg, "pi")
    with factory() as s:
        pi = telemetry_query.series(s, 10, target="pi")
        first, second = pi["health"]
        assert first["cpu_percent"] == pytest.approx(25.0) and first["temp_max_c"] == 60.0  # (20 + 30) / 2; hottest
        assert second["cpu_percent"] == pytest.approx(20.0)
        rates = [p["req_per_s"] for p in pi["models"]["m"]]
        assert rates[0] == 0.0 and rates[1] == pytest.approx(100 / 8 + 50 / 10)  # each device's rate, summed
        assert pi["models"]["m"][0]["p99_ms"] == 6.0  # the worst sample
        assert telemetry_query.series(s, 10, target="other")["health"][0]["cpu_percent"] == 90.0
        assert telemetry_query.series(s, 10, target=None)["health"] == []
    with db.write(factory) as s:
        record(s, "a", sample(h(4, 20.0, 40.0, 100)), 1020.0, cfg, "pi")
        prune(s, cfg, 1020.0, ["a"], ["pi"])
    with factory() as s:
        assert len(telemetry_query.series(s, 10, target="pi")["health"]) == 2  # max_points per class too
    engine.dispose()


def test_one_tick_of_many_devices_of_one_class(tmp_path):
    """As the fleet loop records a tick (telemetry_intake.ingest: one sample per device, no flush before each
    lookup): the class's bucket is made once and every device's share lands in it."""
    from agent.controlplane import telemetry_query

    engine = db.make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    db.migrate(engine)
    factory = db.sessions(engine)
    cfg = TelemetrySettings(bucket_s=60)
    with db.write(factory) as s, s.no_autoflush:
        for i in range(5):
            doc = {"ts": 1.0, "cpu": {"percent": 10.0 * i}, "models": {"m": {"version": "1", "p50_ms": 1.0 * i}}}
            record(s, f"d{i}", sample(doc), 6000.0, cfg, "pi")
    with factory() as s:
        pi = telemetry_query.series(s, 10, target="pi")
        assert [p["cpu_percent"] for p in pi["health"]] == [20.0]
        assert [p["p50_ms"] for p in pi["models"]["m"]] == [2.0]
    engine.dispose()
