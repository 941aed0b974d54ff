"""Latency measurement: warm-up, timed runs within a budget, percentiles with their statistical support.

A percentile is only claimed when enough samples back it (MLPerf's rule): p90 needs >= 64 timed runs,
p99 >= 662. Runs continue until 662 samples or the time budget is spent, but never stop before 64 unless
the hard limit (3x budget, at least 2 s) is hit. The p50 gets a bootstrap 95% confidence interval used to decide
near-ties during selection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

P90_MIN_RUNS = 64
P99_MIN_RUNS = 662


def measure(
    run_once: Callable[[], Any],
    *,
    budget_s: float = 5.0,
    min_runs: int = P90_MIN_RUNS,
    target_runs: int = P99_MIN_RUNS,
    warmup_s: float = 0.5,
    batch: int = 1,
    progress: Callable[..., None] | None = None,
) -> dict[str, Any]:
    """Time `run_once` and return the pinned latency_ms block plus throughput and support flags."""
    warmup = _warm_up(run_once, warmup_s)
    samples: list[float] = []
    hard_stop = time.perf_counter() + max(3 * budget_s, 2.0)
    soft_stop = time.perf_counter() + budget_s
    next_report = time.perf_counter() + 1.0
    t_start = time.perf_counter()
    while len(samples) < target_runs:
        now = time.perf_counter()
        if (now >= soft_stop and len(samples) >= min_runs) or now >= hard_stop:
            break
        t0 = time.perf_counter()
        run_once()
        samples.append((time.perf_counter() - t0) * 1e3)
        if progress is not None and t0 >= next_report:
            progress(
                "latency", runs=len(samples), target=target_runs, elapsed_s=round(t0 - t_start, 2), budget_s=budget_s
            )
            next_report = t0 + 1.0
    total_s = time.perf_counter() - t_start
    return summarize(samples, warmup_runs=warmup, total_s=total_s, batch=batch)


def phrase(lat: dict[str, Any]) -> str:
    """How a passed row's reason states its latency (rewritten after a close call's confirmation round)."""
    return f"p50 {lat['p50']:.3g} ms over {lat['runs']} runs"


def _warm_up(run_once: Callable[[], Any], warmup_s: float) -> int:
    """At least 3 runs, then until warmup_s has passed (at most 50 runs)."""
    t_end = time.perf_counter() + warmup_s
    n = 0
    while n < 3 or (time.perf_counter() < t_end and n < 50):
        run_once()
        n += 1
    return n


def summarize(
    samples: list[float], *, warmup_runs: int = 0, total_s: float | None = None, batch: int = 1
) -> dict[str, Any]:
    arr = np.asarray(samples, dtype=np.float64)
    n = int(arr.size)
    if n == 0:
        return {
            "runs": 0,
            "p50": None,
            "p90": None,
            "p99": None,
            "supported": {"p50": False, "p90": False, "p99": False},
        }
    total_s = float(arr.sum() / 1e3) if total_s is None else total_s
    lo, hi = bootstrap_ci(arr, 50.0)
    return {
        "p50": _pct(arr, 50),
        "p90": _pct(arr, 90),
        "p99": _pct(arr, 99),
        "mean": float(arr.mean()),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "std": float(arr.std()),
        "p50_ci95": [lo, hi],
        "runs": n,
        "warmup_runs": warmup_runs,
        "supported": {"p50": n >= 1, "p90": n >= P90_MIN_RUNS, "p99": n >= P99_MIN_RUNS},
        "throughput_ips": (n * batch / total_s) if total_s > 0 else None,
        "batch": batch,
        "samples_ms": [round(x, 6) for x in arr.tolist()],  # kept for merging rounds; dropped from JSON
    }


def _pct(arr: np.ndarray, q: float) -> float:
    return float(np.percentile(arr, q))


def bootstrap_ci(arr: np.ndarray, q: float, *, resamples: int = 400, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap confidence interval of the q-th percentile (deterministic seed)."""
    if arr.size < 2:
        v = float(arr[0]) if arr.size else float("nan")
        return v, v
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(resamples, arr.size))
    stats = np.percentile(arr[idx], q, axis=1)
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))
