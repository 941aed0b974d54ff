"""The per-class rollup of telemetry, kept as each device's bucket changes (agent.controlplane.telemetry_intake
calls it with the device's bucket before and after a sample): a class's chart then reads its own `max_points` rows
whatever the number of its devices. Means are sums and counts of the devices' bucket means (a device's share is
replaced, not added again, when its mean moves within the bucket); the hottest temperature and the worst p99 are
maxima of the samples. What a device reported stays in its class's buckets until they age out, also after the
device is deleted or changes class."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from agent.controlplane.obs_tables import ClassModelPoint, ClassPoint

MEANS = ("cpu_percent", "load_1m", "mem_used_percent", "rss_bytes", "disk_used_percent", "gpu_load_percent")
MODEL_SUMS = ("req_per_s", "err_per_s", "p50_ms")


def _zeroed(names: tuple[str, ...]) -> dict[str, Any]:
    return {**{f"{n}_sum": 0.0 for n in names}, **{f"{n}_n": 0 for n in names}}


def _replace(row: Any, name: str, old: float | None, new: float | None) -> None:
    """A device's share of `name` in the bucket: its old value taken out, its new one put in."""
    total, n = getattr(row, f"{name}_sum"), getattr(row, f"{name}_n")
    if old is not None:
        total, n = total - old, n - 1
    if new is not None:
        total, n = total + new, n + 1
    setattr(row, f"{name}_sum", total if n else 0.0)  # no share left: exactly 0, no rounding residue
    setattr(row, f"{name}_n", n)


def _max(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None else max(current, value)


def health(s: Session, target: str | None, ts: float, old: dict[str, Any], new: dict[str, Any], sample: Any) -> None:
    """The class bucket of a device's changed bucket."""
    row = s.get(ClassPoint, (target or "", ts))
    if row is None:
        row = ClassPoint(target=target or "", ts=ts, **_zeroed(MEANS))
        s.add(row)
        s.flush()  # the next device of the class in this transaction finds it (once per class and bucket)
    for name in MEANS:
        _replace(row, name, old.get(name), new.get(name))
    row.temp_max_c = _max(row.temp_max_c, sample.gauges.get("temp_max_c"))
    if sample.throttled is not None:
        row.throttled = max(row.throttled or 0, sample.throttled)


def model(s: Session, target: str | None, name: str, ts: float, old: dict[str, Any], new: dict[str, Any]) -> None:
    """The class bucket of one model of a device's changed bucket."""
    row = s.get(ClassModelPoint, (target or "", name, ts))
    if row is None:
        row = ClassModelPoint(target=target or "", model=name, ts=ts, **_zeroed(MODEL_SUMS))
        s.add(row)
        s.flush()
    for field in MODEL_SUMS:
        _replace(row, field, old.get(field), new.get(field))
    row.p99_ms = _max(row.p99_ms, new.get("p99_ms"))
    row.version = new.get("version") or row.version


def mean(row: Any, name: str) -> float | None:
    n = getattr(row, f"{name}_n")
    return getattr(row, f"{name}_sum") / n if n else None


def total(row: Any, name: str) -> float | None:
    return getattr(row, f"{name}_sum") if getattr(row, f"{name}_n") else None
