"""Is the candidate slower? A one-sided binomial test on a compute-time quantile against a reference value."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from agent.serving.metrics import percentile


def exceed_pvalue(n: int, k: int, p: float) -> float:
    """P(Binomial(n, p) >= k), summed in log space (n up to a few thousand)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq, top = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    terms = [top - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq for i in range(k, n + 1)]
    peak = max(terms)
    return min(1.0, math.exp(peak) * math.fsum(math.exp(t - peak) for t in terms))


@dataclass(frozen=True)
class QuantileTest:
    """The candidate's q-th percentile against `factor` x the reference's + slack: H0 "P(run > limit) <= 1 - q/100"
    is rejected (slower) when P(Binomial(n, 1 - q/100) >= k) < alpha, k = runs above the limit."""

    q: int
    candidate_ms: float
    reference_ms: float
    ratio: float  # candidate / reference
    limit_ms: float
    above: int  # candidate runs above limit_ms
    samples: int
    p_value: float
    slower: bool

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("candidate_ms", "reference_ms", "limit_ms"):
            d[k] = round(d[k], 4)
        d["ratio"] = round(d["ratio"], 3)
        d["p_value"] = float(f"{d['p_value']:.3g}")
        return d


def limit_ms(reference_ms: float, factor: float, slack_ms: float) -> float:
    """The one "too slow" line of probation and shadow: factor x the reference + slack_ms (scheduler noise and
    a rarely-run session's cold caches dominate sub-millisecond models)."""
    return factor * reference_ms + slack_ms


def quantile_test(
    candidate_s: list[float], reference_ms: float, q: int, factor: float, slack_ms: float, alpha: float
) -> QuantileTest:
    """candidate_s: sorted compute times in seconds (at least one)."""
    limit = limit_ms(reference_ms, factor, slack_ms)
    cut = limit / 1000.0
    above = len(candidate_s) - _count_at_most(candidate_s, cut)
    value_ms = (percentile(candidate_s, q) or 0.0) * 1000.0
    pv = exceed_pvalue(len(candidate_s), above, 1.0 - q / 100.0)
    ratio = value_ms / reference_ms if reference_ms > 0 else math.inf
    return QuantileTest(q, value_ms, reference_ms, ratio, limit, above, len(candidate_s), pv, pv < alpha)


def _count_at_most(sorted_values: list[float], cut: float) -> int:
    import bisect

    return bisect.bisect_right(sorted_values, cut)


def rate(stamps_span_s: float, samples: int) -> float | None:
    """Requests per second over a span (None when the span or the samples are too few to say)."""
    if samples < 2 or stamps_span_s <= 0:
        return None
    return (samples - 1) / stamps_span_s
