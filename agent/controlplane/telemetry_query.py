"""Reading the kept telemetry: one device's series, or a hardware class's (aggregated per bucket in the database:
the mean CPU and memory of its devices, the hottest temperature, requests summed, the worst p99), as data for the
API and as charts (agent.controlplane.charts) for the pages. Bounded: at most `telemetry.max_points` buckets."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agent.controlplane.charts import layout
from agent.controlplane.models import ACCEPTED, Device
from agent.controlplane.obs_tables import ModelPoint, TelemetryPoint
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


def _health_rows(s: Session, device_id: str | None, target: str | None, limit: int) -> list[dict[str, Any]]:
    p = TelemetryPoint
    stmt: Any
    if device_id is not None:
        cols = [p.ts, p.cpu_percent, p.temp_max_c, p.mem_used_percent, p.rss_bytes, p.disk_used_percent]
        stmt = select(*cols, p.gpu_load_percent, p.throttled).where(p.device_id == device_id)
    else:
        stmt = (
            select(
                p.ts,
                func.avg(p.cpu_percent),
                func.max(p.temp_max_c),
                func.avg(p.mem_used_percent),
                func.avg(p.rss_bytes),
                func.avg(p.disk_used_percent),
                func.avg(p.gpu_load_percent),
                func.max(p.throttled),
            )
            .join(Device, Device.device_id == p.device_id)
            .where(Device.state == ACCEPTED, Device.target.is_(None) if target is None else Device.target == target)
            .group_by(p.ts)
        )
    rows: list[Any] = list(s.execute(stmt.order_by(p.ts.desc()).limit(limit)).all())
    out = []
    for ts, cpu, temp, mem, rss, disk, gpu, thr in reversed(rows):
        out.append(
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
        )
    return out


def _model_rows(s: Session, device_id: str | None, target: str | None, limit: int) -> dict[str, list[dict]]:
    m = ModelPoint
    stmt: Any
    if device_id is not None:
        cols = [m.model, m.ts, m.req_per_s, m.err_per_s, m.p50_ms, m.p99_ms, m.version]
        stmt = select(*cols).where(m.device_id == device_id)
    else:
        stmt = (
            select(
                m.model,
                m.ts,
                func.sum(m.req_per_s),
                func.sum(m.err_per_s),
                func.avg(m.p50_ms),
                func.max(m.p99_ms),
                func.max(m.version),
            )
            .join(Device, Device.device_id == m.device_id)
            .where(Device.state == ACCEPTED, Device.target.is_(None) if target is None else Device.target == target)
            .group_by(m.model, m.ts)
        )
    rows: list[Any] = list(s.execute(stmt.order_by(m.ts.desc()).limit(limit * MAX_MODELS)).all())
    out: dict[str, list[dict]] = {}
    for model, ts, req, err, p50, p99, version in reversed(rows):
        out.setdefault(model, []).append(
            {"ts": ts, "req_per_s": req, "err_per_s": err, "p50_ms": p50, "p99_ms": p99, "version": version}
        )
    return {k: v[-limit:] for k, v in sorted(out.items())}


def series(s: Session, limit: int, device_id: str | None = None, target: str | None = None) -> dict[str, Any]:
    """{"health": [point...], "models": {model: [point...]}} of a device, or of a class (device_id None)."""
    return {
        "health": _health_rows(s, device_id, target, limit),
        "models": _model_rows(s, device_id, target, limit),
    }


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
