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
FLOOR_RUNS = 3  # a point's run-count floor: runs taken even past its soft budget when the hard limit holds them


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
    """Time `run_once` and return the pinned latency_ms block plus throughput and support flags.

    The first run is timed on its own and decides this point's course: one longer than the budget whose
    FLOOR_RUNS would not fit in the hard limit (3x budget, at least 2 s) is the point's one figure (`stopped`
    says so); else warm-up takes at most a quarter of the budget and the timed runs stop at the budget once
    `min_runs` are in, at the latest at the hard limit, and no run starts that the time left cannot hold once
    FLOOR_RUNS are in."""
    t_first = time.perf_counter()
    run_once()
    first_s = time.perf_counter() - t_first
    hard_s = max(3 * budget_s, 2.0)
    if first_s >= budget_s and first_s * FLOOR_RUNS > hard_s:
        lat = summarize([first_s * 1e3], warmup_runs=0, total_s=first_s, batch=batch)
        lat["stopped"] = (
            f"one run took {first_s:.3g} s, over this point's budget {budget_s:.3g} s: the figure is that run's"
        )
        return lat
    warmup = 1 + _warm_up(run_once, min(warmup_s, budget_s / 4), first_s, budget_s)
    samples: list[float] = []
    t_start = time.perf_counter()
    hard_stop = t_start + hard_s
    soft_stop = t_start + budget_s
    next_report = t_start + 1.0
    while len(samples) < target_runs:
        now = time.perf_counter()
        if (now >= soft_stop and len(samples) >= min_runs) or now >= hard_stop:
            break
        if len(samples) >= FLOOR_RUNS and now + (samples[-1] / 1e3) > hard_stop:
            break  # the next run would overrun the point's deadline
        t0 = time.perf_counter()
        run_once()
        samples.append((time.perf_counter() - t0) * 1e3)
        if progress is not None and t0 >= next_report:
            progress(
                "latency", runs=len(samples), target=target_runs, elapsed_s=round(t0 - t_start, 2), budget_s=budget_s
            )
            next_report = t0 + 1.0
    total_s = time.perf_counter() - t_start
    lat = summarize(samples, warmup_runs=warmup, total_s=total_s, batch=batch)
    lat["first_run_ms"] = round(first_s * 1e3, 3)
    return lat


def phrase(lat: dict[str, Any]) -> str:
    """How a passed row's reason states its latency (rewritten after a close call's confirmation round)."""
    return f"p50 {lat['p50']:.3g} ms over {lat['runs']} runs"


def _warm_up(run_once: Callable[[], Any], warmup_s: float, first_s: float, budget_s: float) -> int:
    """After the first run: 2 more when they fit in a quarter of the budget, then more until warmup_s has
    passed (50 runs in all at most)."""
    t0 = time.perf_counter()
    n = 0
    while n < 49:
        now = time.perf_counter()
        if (n < 2 and now + first_s > t0 + budget_s / 4) or (n >= 2 and now >= t0 + warmup_s):
            break
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
