"""Health telemetry in: the retained `devices/+/health` messages devices publish (agent.telemetry: CPU, memory,
disk, temperature, throttling, GPU load, per-model requests, errors and latency), each verified against the
accepted device's key like its status, read as hostile (size, depth, every number finite and in its range, model
names by the name rule), and kept downsampled: one point per device (and per device and model) per
`telemetry.bucket_s` of the service's clock, at most `telemetry.max_points` of them and none older than
`telemetry.retention_s` (docs/control-plane.md, "Telemetry, charts and alerts")."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from agent.controlplane import telemetry_rollup as rollup
from agent.controlplane.limits import TooComplex, check_json
from agent.controlplane.obs_tables import ClassModelPoint, ClassPoint, ModelPoint, TelemetryHead, TelemetryPoint
from agent.controlplane.observe_settings import TelemetrySettings
from agent.names import is_valid_name
from agent.transport.topics import Topics

MAX_BYTES = 64 * 1024  # a health message is a few hundred bytes; a larger one is dropped unread
MAX_DEVICES = 100_000  # devices waiting in the inbox between two ticks (only each one's latest message is kept)
MAX_MODELS = 16  # models taken from one message (sorted by name), the rest ignored
BIG = float(1 << 53)
GAUGES = (
    "cpu_percent",
    "load_1m",
    "mem_used_percent",
    "rss_bytes",
    "disk_used_percent",
    "temp_max_c",
    "gpu_load_percent",
)


def num(value: Any, lo: float, hi: float) -> float | None:
    """A finite number within [lo, hi], else None (not measured): booleans, strings, NaN and 1e308 are not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and lo <= v <= hi else None


def _count(value: Any) -> int | None:
    v = num(value, 0, BIG)
    return int(v) if v is not None and isinstance(value, int) else None


@dataclass
class ModelSample:
    version: str | None
    requests: int | None
    errors: int | None
    p50_ms: float | None
    p99_ms: float | None


@dataclass
class Sample:
    device_ts: float | None
    gauges: dict[str, float | None] = field(default_factory=dict)
    throttled: int | None = None
    models: dict[str, ModelSample] = field(default_factory=dict)


def _dict(doc: dict[str, Any], key: str) -> dict[str, Any]:
    v = doc.get(key)
    return v if isinstance(v, dict) else {}


def sample(doc: dict[str, Any]) -> Sample:
    """The figures of a health document, each checked (a figure out of its range is not measured)."""
    cpu, mem, disk, gpu = _dict(doc, "cpu"), _dict(doc, "memory"), _dict(doc, "disk"), _dict(doc, "gpu")
    gauges = {
        "cpu_percent": num(cpu.get("percent"), 0, 100),
        "load_1m": num(cpu.get("load_1m"), 0, 1e4),
        "mem_used_percent": num(mem.get("used_percent"), 0, 100),
        "rss_bytes": num(mem.get("agent_rss_bytes"), 0, float(1 << 50)),
        "disk_used_percent": num(disk.get("used_percent"), 0, 100),
        "temp_max_c": num(doc.get("temperature_max_c"), -100, 300),
        "gpu_load_percent": num(gpu.get("load_percent"), 0, 100),
    }
    thr = doc.get("throttling")
    throttled = None
    if isinstance(thr, dict):
        now_flags = ("under_voltage", "freq_capped", "throttled", "soft_temp_limit")
        throttled = int(any(thr.get(k) is True for k in now_flags))
    models: dict[str, ModelSample] = {}
    for name in sorted(k for k in _dict(doc, "models") if is_valid_name(k) and len(k) <= 64)[:MAX_MODELS]:
        m = doc["models"][name]
        if not isinstance(m, dict):
            continue
        version = m.get("version")
        models[name] = ModelSample(
            version=str(version) if isinstance(version, (str, int)) and len(str(version)) <= 64 else None,
            requests=_count(m.get("requests")),
            errors=_count(m.get("errors")),
            p50_ms=num(m.get("p50_ms"), 0, 1e7),
            p99_ms=num(m.get("p99_ms"), 0, 1e7),
        )
    return Sample(num(doc.get("ts"), 0, 1e11), gauges, throttled, models)


def parse(payload: bytes, json_depth: int = 16) -> dict[str, Any] | None:
    """The JSON object of a health message within the size and depth limits, else None."""
    if len(payload) > MAX_BYTES:
        return None
    try:
        check_json(payload, json_depth, 5000)
        doc = json.loads(payload)
    except (TooComplex, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


class HealthInbox:
    """The MQTT side: the network thread only keeps each device's latest payload (bounded in size and number);
    the fleet loop takes them all each tick."""

    def __init__(self, prefix: str):
        self.topics = Topics(prefix)
        self._latest: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.dropped = 0

    def topic_filter(self) -> str:
        return f"{self.topics.prefix}/devices/+/health"

    def on_message(self, topic: str, payload: bytes, retained: bool) -> None:
        parsed = self.topics.parse(topic)
        if parsed is None or parsed.kind != "health" or parsed.device is None:
            return
        with self._lock:
            if len(payload) > MAX_BYTES or (parsed.device not in self._latest and len(self._latest) >= MAX_DEVICES):
                self.dropped += 1
                return
            self._latest[parsed.device] = payload

    def take(self) -> dict[str, bytes]:
        with self._lock:
            out, self._latest = self._latest, {}
        return out


def _mean(old: float | None, new: float | None, n: int) -> float | None:
    if new is None:
        return old
    if old is None:
        return new
    return (old * n + new) / (n + 1)


def record(
    s: Session, device_id: str, smp: Sample, now: float, cfg: TelemetrySettings, target: str | None = None
) -> bool:
    """Merge one verified sample into its bucket (and its class's, `target`); False when it is the same message
    again (a retained copy)."""
    head = s.get(TelemetryHead, device_id)
    if head is not None and smp.device_ts is not None and head.device_ts == smp.device_ts:
        return False
    ts = float(math.floor(now / cfg.bucket_s) * cfg.bucket_s)
    point = s.get(TelemetryPoint, (device_id, ts))
    if point is None:
        point = TelemetryPoint(device_id=device_id, ts=ts, n=0)
        s.add(point)
    old = {g: getattr(point, g) for g in GAUGES}
    for name in GAUGES:
        setattr(point, name, _mean(getattr(point, name), smp.gauges.get(name), point.n))
    if smp.throttled is not None:
        point.throttled = max(point.throttled or 0, smp.throttled)
    point.n += 1
    rollup.health(s, target, ts, old, {g: getattr(point, g) for g in GAUGES}, smp)
    before = dict(head.counters) if head is not None and isinstance(head.counters, dict) else {}
    counters = _models(s, (device_id, target), smp, ts, now, before, cfg)
    if head is None:
        s.add(TelemetryHead(device_id=device_id, heard_at=now, device_ts=smp.device_ts, counters=counters))
    else:
        head.heard_at, head.device_ts, head.counters = now, smp.device_ts, counters
    return True


def _rate(new: int | None, old: Any, dt: float) -> float | None:
    if new is None or not isinstance(old, int) or new < old or dt <= 0:
        return None  # no earlier count, a restart (the counter went down) or no time between
    return (new - old) / dt


MODEL_FIELDS = ("req_per_s", "err_per_s", "p50_ms", "p99_ms", "version")


def _models(
    s: Session,
    who: tuple[str, str | None],
    smp: Sample,
    ts: float,
    now: float,
    before: dict[str, Any],
    cfg: TelemetrySettings,
) -> dict[str, Any]:
    device_id, target = who
    counters: dict[str, Any] = {}
    for name, m in smp.models.items():
        prev: dict[str, Any] = before[name] if isinstance(before.get(name), dict) else {}
        same = prev.get("version") == m.version
        dt = now - prev["at"] if isinstance(prev.get("at"), (int, float)) else 0.0
        row = s.get(ModelPoint, (device_id, name, ts))
        if row is None:
            row = ModelPoint(device_id=device_id, model=name, ts=ts)
            s.add(row)
        old = {f: getattr(row, f) for f in MODEL_FIELDS}
        row.version, row.requests, row.errors = m.version, m.requests, m.errors
        row.p50_ms, row.p99_ms = m.p50_ms, m.p99_ms
        if same:
            row.req_per_s = _rate(m.requests, prev.get("requests"), dt) if dt else row.req_per_s
            row.err_per_s = _rate(m.errors, prev.get("errors"), dt) if dt else row.err_per_s
        rollup.model(s, target, name, ts, old, {f: getattr(row, f) for f in MODEL_FIELDS})
        counters[name] = {"version": m.version, "requests": m.requests, "errors": m.errors, "at": now}
    return counters


def prune(s: Session, cfg: TelemetrySettings, now: float, devices: list[str], targets: list[str]) -> None:
    """The bound of the devices (and classes) that reported in this tick: their points of the newest `max_points`
    buckets of the service's clock kept (one row per bucket: at most `max_points`), older ones deleted by the
    primary key's range, a thousand devices a statement."""
    newest = math.floor(now / cfg.bucket_s) * cfg.bucket_s
    cut = newest - (cfg.max_points - 1) * cfg.bucket_s
    by: list[tuple[list[str], Any, Any]] = [
        (devices, TelemetryPoint, TelemetryPoint.device_id),
        (devices, ModelPoint, ModelPoint.device_id),
        (targets, ClassPoint, ClassPoint.target),
        (targets, ClassModelPoint, ClassModelPoint.target),
    ]
    for keys, table, column in by:
        for i in range(0, len(keys), 1000):
            stmt = delete(table).where(column.in_(keys[i : i + 1000]), table.ts < cut)
            s.execute(stmt.execution_options(synchronize_session=False))


def prune_all(s: Session, cfg: TelemetrySettings, now: float) -> None:
    """Points past `retention_s`, of every device and class (also those that stopped reporting)."""
    for table in (TelemetryPoint, ModelPoint, ClassPoint, ClassModelPoint):
        stmt = delete(table).where(table.ts < now - cfg.retention_s)
        s.execute(stmt.execution_options(synchronize_session=False))


def ingest(factory: Any, registry: Any, inbox: HealthInbox, settings: Any, now: float) -> int:
    """Take the inbox, keep the messages verified by an accepted device's key; returns the samples recorded."""
    from agent.controlplane.db import write
    from agent.controlplane.models import ACCEPTED, Device

    samples: dict[str, Sample] = {}
    for dev, payload in inbox.take().items():
        doc = parse(payload, settings.limits.json_depth)
        if doc is None or registry.apply(dev, doc).get("trust") != "verified":
            continue
        samples[dev] = sample(doc)
    if not samples:
        return 0
    n = 0
    with write(factory) as s:
        wanted = select(Device.device_id, Device.target).where(
            Device.device_id.in_(sorted(samples)), Device.state == ACCEPTED
        )
        rows = s.execute(wanted).all()
        with s.no_autoflush:  # one flush at the end, not one before each lookup
            for dev, target in rows:
                n += record(s, dev, samples[dev], now, settings.telemetry, target)
        prune(s, settings.telemetry, now, [d for d, _ in rows], sorted({t or "" for _, t in rows}))
    return n
