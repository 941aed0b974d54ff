"""Reading the kept telemetry: one device's series, or a hardware class's (its rollup, agent.controlplane
.telemetry_rollup: the mean CPU and memory of its devices, the hottest temperature, requests summed, the worst
p99), as data for the API and as charts (agent.controlplane.charts) for the pages. Bounded: at most
`telemetry.max_points` buckets, read from rows of that device or that class only."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.controlplane import telemetry_rollup as rollup
from agent.controlplane.charts import layout
from agent.controlplane.obs_tables import ClassModelPoint, ClassPoint, ModelPoint, TelemetryPoint
from agent.controlplane.telemetry_intake import MAX_MODELS

PCT = (0.0, 100.0)
# (field, title, unit, how it was obtained: on a device, over a class), fixed range
HEALTH = (
    ("cpu_percent", "CPU", "%", "psutil CPU times between two samples, mean per bucket", "mean of the devices", PCT),
    ("temp_max_c", "Temperature", "°C", "hottest thermal zone (sysfs), mean per bucket", "hottest device", None),
    ("mem_used_percent", "Memory used", "%", "psutil virtual_memory, mean per bucket", "mean of the devices", PCT),
    ("rss_mib", "Agent memory", "MiB", "resident set of the agent process, mean per bucket", "mean", None),
    ("disk_used_percent", "Disk used", "%", "filesystem of the state_dir, mean per bucket", "mean of the devices", PCT),
    ("gpu_load_percent", "GPU load", "%", "devfreq load (Jetson iGPU), mean per bucket", "mean of the devices", PCT),
    ("throttled", "Throttled", "0/1", "Pi firmware get_throttled: 1 when a 'now' flag was set", "any device", (0, 1)),
)
MODEL = (
    ("req_per_s", "Requests", "req/s", "from the device's request counter between two health messages", "sum"),
    ("err_per_s", "Errors", "errors/s", "from the device's error counter between two health messages", "sum"),
    ("p50_ms", "Latency p50", "ms", "the serving window's p50 as the device reported it", "mean of the devices"),
    ("p99_ms", "Latency p99", "ms", "the serving window's p99 as the device reported it", "worst device"),
)


def _health_rows(s: Session, device_id: str, limit: int) -> list[dict[str, Any]]:
    p = TelemetryPoint
    cols = [p.ts, p.cpu_percent, p.temp_max_c, p.mem_used_percent, p.rss_bytes, p.disk_used_percent]
    stmt = select(*cols, p.gpu_load_percent, p.throttled).where(p.device_id == device_id)
    rows: list[Any] = list(s.execute(stmt.order_by(p.ts.desc()).limit(limit)).all())
    return [
        {
            "ts": ts,
            "cpu_percent": cpu,
            "temp_max_c": temp,
            "mem_used_percent": mem,
            "rss_mib": None if rss is None else rss / 1048576.0,
            "disk_used_percent": disk,
            "gpu_load_percent": gpu,
            "throttled": thr,
        }
        for ts, cpu, temp, mem, rss, disk, gpu, thr in reversed(rows)
    ]


def _class_health_rows(s: Session, target: str | None, limit: int) -> list[dict[str, Any]]:
    c = ClassPoint
    rows = s.scalars(select(c).where(c.target == (target or "")).order_by(c.ts.desc()).limit(limit)).all()
    out = []
    for r in reversed(rows):
        rss = rollup.mean(r, "rss_bytes")
        point = {"ts": r.ts, "temp_max_c": r.temp_max_c, "throttled": r.throttled}
        point.update({g: rollup.mean(r, g) for g in ("cpu_percent", "mem_used_percent", "disk_used_percent")})
        point.update(
            gpu_load_percent=rollup.mean(r, "gpu_load_percent"), rss_mib=None if rss is None else rss / 1048576.0
        )
        out.append(point)
    return out


def _model_rows(s: Session, device_id: str, limit: int) -> dict[str, list[dict]]:
    m = ModelPoint
    cols = [m.model, m.ts, m.req_per_s, m.err_per_s, m.p50_ms, m.p99_ms, m.version]
    stmt = select(*cols).where(m.device_id == device_id)
    rows: list[Any] = list(s.execute(stmt.order_by(m.ts.desc()).limit(limit * MAX_MODELS)).all())
    out: dict[str, list[dict]] = {}
    for model, ts, req, err, p50, p99, version in reversed(rows):
        out.setdefault(model, []).append(
            {"ts": ts, "req_per_s": req, "err_per_s": err, "p50_ms": p50, "p99_ms": p99, "version": version}
        )
    return {k: v[-limit:] for k, v in sorted(out.items())}


def _class_model_rows(s: Session, target: str | None, limit: int) -> dict[str, list[dict]]:
    c = ClassModelPoint
    stmt = select(c).where(c.target == (target or "")).order_by(c.ts.desc()).limit(limit * MAX_MODELS)
    out: dict[str, list[dict]] = {}
    for r in reversed(s.scalars(stmt).all()):
        out.setdefault(r.model, []).append(
            {
                "ts": r.ts,
                "req_per_s": rollup.total(r, "req_per_s"),
                "err_per_s": rollup.total(r, "err_per_s"),
                "p50_ms": rollup.mean(r, "p50_ms"),
                "p99_ms": r.p99_ms,
                "version": r.version,
            }
        )
    return {k: v[-limit:] for k, v in sorted(out.items())}


def series(s: Session, limit: int, device_id: str | None = None, target: str | None = None) -> dict[str, Any]:
    """{"health": [point...], "models": {model: [point...]}} of a device, or of a class (device_id None)."""
    if device_id is not None:
        return {"health": _health_rows(s, device_id, limit), "models": _model_rows(s, device_id, limit)}
    return {"health": _class_health_rows(s, target, limit), "models": _class_model_rows(s, target, limit)}


def charts(data: dict[str, Any], per_device: bool) -> dict[str, Any]:
    """The charts of series(): health charts, then each model's."""
    health = [
        layout(f, title, unit, dev_how if per_device else f"{class_how} per bucket", _pts(data["health"], f), fixed)
        for f, title, unit, dev_how, class_how, fixed in HEALTH
    ]
    models = {}
    for model, rows in data["models"].items():
        models[model] = [
            layout(f"{model}-{f}", title, unit, how if per_device else f"{agg} over the class's devices", _pts(rows, f))
            for f, title, unit, how, agg in MODEL
        ]
    return {"health": health, "models": models}


def _pts(rows: list[dict[str, Any]], field: str) -> list[tuple[float, float | None]]:
    return [(r["ts"], r.get(field)) for r in rows]
