"""What both runtimes' row processes (agent.generative.rowproc, agent.generative.ovrow) measure alike: the process's
peak RSS, percentiles of timings, and timed prompts of a given length."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import numpy as np


def peak_rss() -> tuple[int, str]:
    """This process's peak RSS: VmHWM (its own address space's; getrusage's ru_maxrss survives execve, so a child
    started by a large parent would report the parent's peak), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024, "VmHWM"
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "ru_maxrss"


def measured_row(
    load_s: float, ttft: Any, tpot: Any, prompts: list[list[int]], greedy: list[list[int]], held: Any, kv_tokens: int
) -> dict[str, Any]:
    """What every runtime's row process reports once it measured (its peak RSS read now, after the generation to
    max_length), before its own keys."""
    peak, peak_source = peak_rss()
    return {
        "status": "measured",
        "load_s": load_s,
        "ttft_ms": ttft,
        "tpot_ms": tpot,
        "prompts": prompts,
        "greedy": greedy,
        "held": held,
        "peak_rss_bytes": peak,
        "peak_rss_source": peak_source,
        "kv_tokens_at_peak": kv_tokens,
    }


def prompt_of(seed: list[int], n: int) -> list[int]:
    reps = -(-n // max(1, len(seed)))
    return (seed * reps)[:n]


def pct(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"p50_ms": None, "p90_ms": None, "n": 0}
    arr = np.asarray(values) * 1000.0
    return {"p50_ms": float(np.percentile(arr, 50)), "p90_ms": float(np.percentile(arr, 90)), "n": len(values)}
