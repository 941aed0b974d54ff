"""Latency at each declared shape point (golden, opt, max) inside a row's child, and the check before the max.

Every point is timed by agent.qualify.latency.measure (a run-count floor, a deadline from its first run; one run
over the budget is the point's one figure). A run at the declared max can cost far more than the row has left,
so before it runs its time and memory are estimated from the measured points: the inputs' growth (the largest
element ratio of any input, max over the measured point) raised to the cost exponent fitted between two
measured points of different sizes (clamped to [1, 3]), else ASSUMED_EXPONENT; memory scales what the timed runs
added to the session as built, beyond ALLOCATOR_SLACK, by the same factor. A point whose estimate is over
the time left of the row or over the memory budget is not run, and says why; the row stands on the others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.isolate.runner import size_text
from agent.qualify import latency

ASSUMED_EXPONENT = 2.0  # cost ~ size^2 (attention-like) when no two measured points of different sizes say
TIME_MARGIN = 0.8  # a run at max is started only when its estimate fits this share of the row's time left
MAX_SHAPE_BUDGET = 0.25  # latency at the declared max shape: this share of the row's budget
ALLOCATOR_SLACK = 32 << 20  # RSS the runs add at any size (arenas, thread stacks): not scaled with the inputs
MIN_BUDGET = 0.1  # the declared min (timed before the max only to fit the estimate's exponent): this share
GOLDEN_BUDGET = 0.25  # the golden point, when it is not the opt point: this share


def shapes(feeds: dict[str, Any]) -> str:
    """x[1, 3, 224, 224], ids[1, 64]: the shapes a point times."""
    return ", ".join(f"{k}{list(getattr(v, 'shape', ()))}" for k, v in feeds.items())


def entry(point: str, feeds: dict[str, Any], lat: dict[str, Any], source: str | None) -> dict[str, Any]:
    """One `latency_points` item: where, on what, the figures and how many runs they rest on."""
    out: dict[str, Any] = {"point": point, "inputs": shapes(feeds), "source": source}
    out.update({k: lat.get(k) for k in ("p50", "p90", "p99", "runs")})
    if lat.get("stopped"):
        out["stopped"] = lat["stopped"]
    return out


def skipped(point: str, feeds: dict[str, Any], source: str | None, why: str) -> dict[str, Any]:
    return {"point": point, "inputs": shapes(feeds), "source": source, "runs": 0, "p50": None, "skipped": why}


def _sizes(feeds: dict[str, Any]) -> dict[str, int]:
    return {k: int(np.size(v)) for k, v in feeds.items()}


def growth(small: dict[str, Any], large: dict[str, Any]) -> float:
    """The largest element ratio of any input from `small` to `large` (1.0 when nothing grows)."""
    a, b = _sizes(small), _sizes(large)
    return max([b[k] / a[k] for k in b if a.get(k)] + [1.0])


def exponent(measured: list[tuple[dict[str, Any], float]]) -> tuple[float, str]:
    """(cost exponent, how it was found) from measured (feeds, p50 ms) points: fitted between the two largest
    sizes (a fixed overhead flattens the smallest ones), clamped to [1, 3]."""
    by_size = sorted(measured, key=lambda m: sum(_sizes(m[0]).values()))
    large = by_size[-1] if by_size else None
    for small in reversed(by_size[:-1]):
        assert large is not None
        r = growth(small[0], large[0])
        if r > 1.0 and small[1] > 0 and large[1] > 0:
            k = min(3.0, max(1.0, math.log(large[1] / small[1]) / math.log(r)))
            return k, f"fitted {k:.2f} between {shapes(small[0])} and the larger point"
    return ASSUMED_EXPONENT, f"assumed {ASSUMED_EXPONENT:g} (one measured size)"


def estimate(
    measured: list[tuple[dict[str, Any], float]], at_max: dict[str, Any], peak_bytes: int, base_bytes: int
) -> dict[str, Any]:
    """What one run at max should take: seconds and peak memory growth, from the largest measured point."""
    ref_feeds, ref_ms = max(measured, key=lambda m: sum(_sizes(m[0]).values()))
    r = growth(ref_feeds, at_max)
    k, how = exponent(measured)
    factor = r**k
    activations = max(0, peak_bytes - base_bytes - ALLOCATOR_SLACK)  # what the runs added to the session as built
    return {
        "run_s": round(ref_ms / 1e3 * factor, 4),
        "memory_bytes": int(peak_bytes + activations * (factor - 1)),
        "growth": round(r, 3),
        "exponent": round(k, 3),
        "how": f"inputs {r:.3g}x the measured {shapes(ref_feeds)}, cost exponent {how}",
    }


def check(est: dict[str, Any], time_left_s: float | None, memory_budget: tuple[int, str]) -> str:
    """Why the max point must not run ("" when it may)."""
    limit, source = memory_budget
    if est["memory_bytes"] > limit:
        return (
            f"not run: one run at max needs about {size_text(est['memory_bytes'])} ({est['how']}), over "
            f"{source} {size_text(limit)}"
        )
    if time_left_s is not None and est["run_s"] > TIME_MARGIN * time_left_s:
        return (
            f"not run: one run at max would take about {est['run_s']:.3g} s ({est['how']}), more than the "
            f"{max(0.0, time_left_s):.0f} s left of the row's time"
        )
    return ""


@dataclass(frozen=True)
class MaxBudget:
    """What the max point is checked against before it runs: the points measured so far, the time (its latency
    budget, the row's deadline) and the memory (the row's peak and the opened session's, the budget)."""

    measured: list[tuple[dict[str, Any], float]]
    budget_s: float
    batch: int
    deadline: float | None
    peak_bytes: int
    base_bytes: int
    memory_budget: tuple[int, str]


def at_max(
    run: Callable[[dict[str, Any]], Any],
    max_feeds: dict[str, Any],
    limits: MaxBudget,
    *,
    source: str | None,
    progress: Callable[..., None],
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(latency_max_ms or None, its latency_points item): checked against the budgets, then timed."""
    measured, budget_s, batch, deadline = limits.measured, limits.budget_s, limits.batch, limits.deadline
    peak_bytes, base_bytes, memory_budget = limits.peak_bytes, limits.base_bytes, limits.memory_budget
    est = estimate(measured, max_feeds, peak_bytes, base_bytes)
    left = deadline - time.monotonic() if deadline is not None else None
    why = check(est, left, memory_budget)
    if why:
        return None, {**skipped("max", max_feeds, source, why), "estimate": est}
    progress("latency", shape="max", inputs=shapes(max_feeds), budget_s=budget_s, estimate_s=est["run_s"])
    lat = latency.measure(
        lambda: run(max_feeds),
        budget_s=budget_s,
        batch=batch,
        progress=lambda event, **f: progress(event, shape="max", **f),
    )
    return {k: v for k, v in lat.items() if k != "samples_ms"}, {
        **entry("max", max_feeds, lat, source),
        "estimate": est,
    }


def catching(say: Callable[..., None], partial: dict[str, Any]) -> Callable[..., None]:
    """The parent's progress callback that keeps a child's `row_partial` (the row before its max point) in
    `partial` instead of passing it on."""

    def progress(event: str, **fields: Any) -> None:
        if event == "row_partial":
            partial["row"] = fields.get("row")
        else:
            say(event, **fields)

    return progress


def kept_partial(row: dict[str, Any], error: str, plan: Any) -> dict[str, Any]:
    """A row whose child was killed at its max point: the points measured stand, the max point says why."""
    at = plan.at_max or {}
    why = f"not measured: a run at max did not finish before the row's deadline ({error})"
    row = dict(row)
    row["latency_points"] = [*row.get("latency_points", []), skipped("max", at, plan.sources.get("max"), why)]
    row["latency_max_ms"] = None
    if row.get("status") == "passed":
        row["reason"] = f"{row.get('reason', '')}, at max not measured (the run outlasted the row's deadline)"
    return row
