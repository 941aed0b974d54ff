"""The conditions a row was measured under (load, other processes' CPU use, its own threads' waits for the
cores, throttling) and whether they were contended: a contended row still decides pass/fail, but its latency
is no baseline for probation."""

from __future__ import annotations

import os
import time
from typing import Any

from agent.schedstat import run_queue_wait_s

CONTENDED_SHARE = 0.25  # other processes used more than this share of the machine's CPU time meanwhile
# ... or the row's own threads waited on a run queue (runnable, not running) for more than this many seconds
# per second, summed over them: each wait is in a timed run's wall time (and spun on by its pool)
WAIT_SHARE = 0.05
_NOW_FLAGS = ("under_voltage", "freq_capped", "throttled", "soft_temp_limit")


def _busy_jiffies() -> int | None:
    """Busy CPU time of the whole machine in clock ticks (/proc/stat: all but idle and iowait)."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    return sum(values) - values[3] - (values[4] if len(values) > 4 else 0)


def _throttled() -> dict[str, Any] | None:
    try:
        from agent.hardware.sysroot import Sysroot
        from agent.hardware.thermal import read_throttled

        return read_throttled(Sysroot("/"))
    except Exception:  # noqa: BLE001 - evidence only
        return None


class Sampler:
    """Started before the timed runs of a row and stopped after them, in the process that runs them."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0 = _busy_jiffies()
        self.own0 = _own_cpu_s()
        self.wait0 = run_queue_wait_s()

    def stop(self) -> dict[str, Any]:
        wall = max(time.monotonic() - self.t0, 1e-6)
        busy1, own1, wait1 = _busy_jiffies(), _own_cpu_s(), run_queue_wait_s()
        waited = None if self.wait0 is None or wait1 is None else round(max(0.0, wait1 - self.wait0) / wall, 3)
        ncpu = os.cpu_count() or 1
        share = None
        if self.busy0 is not None and busy1 is not None:
            hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
            others = (busy1 - self.busy0) / hz - (own1 - self.own0)
            share = round(min(1.0, max(0.0, others / (wall * ncpu))), 3)
        try:
            load = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            load = None
        throttled = _throttled()
        return {
            "loadavg": load,
            "nice": os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else None,
            "cpu_count": ncpu,
            "others_cpu_share": share,
            "own_wait_share": waited,
            "throttled": throttled,
            "window_s": round(wall, 3),
        }


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def contended(conditions: dict[str, Any]) -> bool:
    """Other processes took more than CONTENDED_SHARE of the CPU, the row's threads waited for the cores more
    than WAIT_SHARE, or the firmware throttles right now."""
    share, waited = conditions.get("others_cpu_share"), conditions.get("own_wait_share")
    throttled = conditions.get("throttled") or {}
    return bool(
        (share is not None and share > CONTENDED_SHARE)
        or (waited is not None and waited > WAIT_SHARE)
        or any(throttled.get(f) for f in _NOW_FLAGS)
    )
