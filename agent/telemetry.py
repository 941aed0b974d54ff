"""Health telemetry: CPU, memory, disk, temperatures, throttling, Jetson GPU load, per-model serving stats.

The daemon publishes `Telemetry.collect()` every `telemetry.interval_s` as the retained health message and
passes `Telemetry.collector` to the HTTP server so /metrics carries the same figures as gauges:

    tele = Telemetry(cfg.state_dir, profile=profile, stats=lambda: registry_stats(registry))
    link.publish_health(tele.collect())            # dict, JSON-ready
    OIPServer(registry, host, port, collectors=[tele.collector])

Sysfs facts (thermal zones, the Pi's get_throttled, Jetson devfreq load) are read under `root` with
agent.hardware's readers; CPU and memory come from psutil and only when `root` is the host.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from agent import __version__
from agent.hardware.jetson import GPU_ARCH
from agent.hardware.sysroot import Sysroot
from agent.hardware.thermal import read_temperatures, read_throttled

_GPU_NODES = set(GPU_ARCH) | {"gpu"}
_MODEL_FIELDS = (
    "version",
    "requests",
    "errors",
    "rejected",
    "nonfinite",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "latency_samples",
)


class CpuSampler:
    """CPU utilisation between two calls, from psutil.cpu_times deltas (private state, no global priming)."""

    def __init__(self) -> None:
        self._last = psutil.cpu_times()
        self._lock = threading.Lock()

    def percent(self) -> float | None:
        now = psutil.cpu_times()
        with self._lock:
            last, self._last = self._last, now
        busy = _busy(now) - _busy(last)
        total = sum(now) - sum(last)
        return None if total <= 0 else round(max(0.0, min(100.0, 100.0 * busy / total)), 1)


def _busy(t) -> float:
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def collect(
    profile=None,
    registry_stats: Mapping[str, Mapping[str, Any]] | None = None,
    root: str | os.PathLike = "/",
    *,
    state_dir: str | os.PathLike | None = None,
    cpu: CpuSampler | None = None,
) -> dict[str, Any]:
    """One health document. `registry_stats` maps model name -> ModelRegistry.stats(name) snapshot."""
    sr = Sysroot(root)
    health: dict[str, Any] = {"ts": round(time.time(), 3), "agent_version": __version__}
    if sr.is_host:
        health["cpu"] = _cpu(cpu)
        health["memory"] = _memory()
    if state_dir is not None:
        health["disk"] = _disk(Path(state_dir))
    temps = read_temperatures(sr)
    health["temperatures_c"] = temps
    health["temperature_max_c"] = max(temps.values()) if temps else None
    health["throttling"] = read_throttled(sr)  # None where the firmware does not report it (non-Pi)
    health["gpu"] = gpu_load(sr, profile)
    health["models"] = {
        name: {k: s.get(k) for k in _MODEL_FIELDS if k in s} for name, s in sorted((registry_stats or {}).items())
    }
    return health


def registry_stats(registry) -> dict[str, dict[str, Any]]:
    """{model: stats snapshot} of every model a ModelRegistry is serving (a model gone meanwhile is skipped)."""
    out = {}
    for name in sorted(registry.models()):
        try:
            out[name] = registry.stats(name)
        except Exception:  # noqa: BLE001 - swapped out between the two calls
            continue
    return out


def _cpu(sampler: CpuSampler | None) -> dict[str, Any]:
    load1, load5, load15 = psutil.getloadavg()
    return {
        "percent": sampler.percent() if sampler else None,
        "cores": psutil.cpu_count(),
        "load_1m": round(load1, 2),
        "load_5m": round(load5, 2),
        "load_15m": round(load15, 2),
    }


def _memory() -> dict[str, Any]:
    vm = psutil.virtual_memory()
    try:
        rss = psutil.Process().memory_info().rss
    except psutil.Error:
        rss = None
    return {
        "total_bytes": vm.total,
        "available_bytes": vm.available,
        "used_percent": vm.percent,
        "agent_rss_bytes": rss,
    }


def _disk(path: Path) -> dict[str, Any]:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # state_dir not created yet: report its filesystem
    try:
        du = shutil.disk_usage(probe)
    except OSError as exc:
        return {"path": str(path), "error": exc.strerror or str(exc)}
    return {
        "path": str(path),
        "total_bytes": du.total,
        "free_bytes": du.free,
        "used_percent": round(100.0 * du.used / du.total, 1) if du.total else None,
    }


def gpu_load(sr: Sysroot, profile=None) -> dict[str, Any] | None:
    """Jetson iGPU load from devfreq (`device/load` is per-mille) and current clock; None when absent."""
    candidates = [
        a.device.lstrip("/")
        for a in getattr(profile, "accelerators", ())
        if a.kind == "gpu" and a.vendor == "nvidia" and (a.device or "").startswith("/sys/class/devfreq/")
    ]
    if not candidates:
        candidates = [
            e for e in sr.glob("sys/class/devfreq/*") if sr.read_text(f"{e}/device/of_node/name") in _GPU_NODES
        ]
    for entry in candidates:
        permille = sr.read_value(f"{entry}/device/load", int, "expected GPU load in per-mille")
        if permille is None:
            continue
        freq = sr.read_text(f"{entry}/cur_freq")
        return {
            "device": "/" + entry,
            "load_percent": round(min(max(permille, 0), 1000) / 10.0, 1),
            "freq_hz": int(freq) if freq and freq.isdigit() else None,
        }
    return None


def to_metrics(health: Mapping[str, Any]) -> list:
    """The system part of a health document as Prometheus gauges (per-model figures come from serving)."""
    from agent.serving.metrics import Metric

    fams: list[Metric] = []

    def add(name: str, help_: str, value, labels: dict[str, str] | None = None) -> None:
        if value is None:
            return
        fam = next((f for f in fams if f.name == name), None)
        if fam is None:
            fam = Metric(name, "gauge", help_)
            fams.append(fam)
        fam.samples.append(("", dict(labels or {}), float(value)))

    cpu, mem, disk = health.get("cpu") or {}, health.get("memory") or {}, health.get("disk") or {}
    add("edge_agent_cpu_percent", "CPU utilisation since the previous sample, percent.", cpu.get("percent"))
    add("edge_agent_load1", "1-minute load average.", cpu.get("load_1m"))
    add("edge_agent_memory_total_bytes", "Physical memory.", mem.get("total_bytes"))
    add("edge_agent_memory_available_bytes", "Memory available without swapping.", mem.get("available_bytes"))
    add("edge_agent_resident_bytes", "Resident memory of the agent process.", mem.get("agent_rss_bytes"))
    for key, name in (("total_bytes", "disk_total_bytes"), ("free_bytes", "disk_free_bytes")):
        add(
            f"edge_agent_{name}",
            f"Filesystem holding state_dir: {key.split('_')[0]} bytes.",
            disk.get(key),
            {"path": str(disk.get("path"))},
        )
    for zone, celsius in (health.get("temperatures_c") or {}).items():
        add("edge_agent_temperature_celsius", "Thermal zone temperature.", celsius, {"zone": zone})
    for flag, value in (health.get("throttling") or {}).items():
        if isinstance(value, bool):
            add("edge_agent_throttled", "Raspberry Pi firmware throttling flags (1 = set).", int(value), {"flag": flag})
    gpu = health.get("gpu") or {}
    add(
        "edge_agent_gpu_load_ratio",
        "Integrated GPU load (devfreq), 0-1.",
        None if gpu.get("load_percent") is None else gpu["load_percent"] / 100.0,
        {"device": str(gpu.get("device"))},
    )
    return fams


class Telemetry:
    """Holds what collect() needs between calls: where state lives, the profile, a stats source, a CPU sampler."""

    def __init__(
        self,
        state_dir: str | os.PathLike,
        *,
        profile=None,
        root: str | os.PathLike = "/",
        stats: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
        device_id: str | None = None,
    ):
        self.state_dir, self.profile, self.root = Path(state_dir), profile, root
        self.stats, self.device_id = stats, device_id
        self._cpu, self._scrape_cpu = CpuSampler(), CpuSampler()  # publish and scrape cadences differ

    def collect(self) -> dict[str, Any]:
        """The health message (JSON-ready)."""
        doc = collect(
            self.profile, self.stats() if self.stats else None, self.root, state_dir=self.state_dir, cpu=self._cpu
        )
        return {"device_id": self.device_id, **doc} if self.device_id else doc

    def collector(self) -> list:
        """A /metrics collector hook: fresh system gauges on each scrape."""
        return to_metrics(collect(self.profile, None, self.root, state_dir=self.state_dir, cpu=self._scrape_cpu))
