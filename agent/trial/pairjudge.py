"""The paired judge: is the candidate slower than the incumbent, from pairs of runs timed back to back?

Each pair is the same input run on both versions back to back on one thread (ABBA order across pairs), so what
drifts between pairs (a co-runner, a frequency step, throttling) moves both halves and cancels in the pair's
log ratio log(candidate CPU / incumbent CPU). The judge takes the median of those log ratios and its
distribution-free confidence interval from the sign test (order statistics x_(k), x_(n-k+1) with k from the
Binomial(n, 1/2) tail: no assumption on the noise's shape). A/A pairs (incumbent against incumbent, same
machinery) give the noise floor at that moment.

Verdict: "slower" only when the candidate's interval lies above both the target's factor (serving.probation.ratio;
the window tests' slack_ms is not added: the A/A interval is the noise floor) and the A/A interval; "not slower" when it lies below the line; otherwise (too few
pairs, too few A/A pairs, or an interval across the line) "not judged" with the counts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SLOWER, NOT_SLOWER, NOT_JUDGED = "slower", "not slower", "not judged"


@dataclass(frozen=True)
class Interval:
    """Median of log ratios and its confidence interval (both as ratios), over `pairs` pairs."""

    ratio: float | None
    lo: float | None
    hi: float | None
    pairs: int

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": _r(self.ratio), "ci": [_r(self.lo), _r(self.hi)], "pairs": self.pairs}


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _binom_cdf(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    if k < 0:
        return 0.0
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(0, k + 1)]
    peak = max(terms)
    return min(1.0, math.exp(peak - n * math.log(2.0)) * math.fsum(math.exp(t - peak) for t in terms))


def sign_rank(n: int, confidence: float) -> int | None:
    """The largest k (1-based) with P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2: [x_(k), x_(n-k+1)]
    covers the median with at least `confidence`; None when n is too small for that confidence."""
    tail = (1.0 - confidence) / 2.0
    k = None
    for j in range(1, n // 2 + 1):
        if _binom_cdf(n, j - 1) <= tail:
            k = j
        else:
            break
    return k


def median_interval(log_ratios: Sequence[float], confidence: float) -> Interval:
    """The median ratio of the pairs and its sign-test confidence interval (None where too few pairs)."""
    xs = sorted(log_ratios)
    n = len(xs)
    if not n:
        return Interval(None, None, None, 0)
    mid = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0
    k = sign_rank(n, confidence)
    if k is None:
        return Interval(math.exp(mid), None, None, n)
    return Interval(math.exp(mid), math.exp(xs[k - 1]), math.exp(xs[n - k]), n)


@dataclass(frozen=True)
class PairedRule:
    """What the judge asks of the pairs (serving.probation.paired_*)."""

    factor: float = 1.5  # the target's ratio (serving.probation.ratio); no slack: the A/A floor is the noise
    confidence: float = 0.99  # of each interval (sign test)
    min_pairs: int = 16  # candidate pairs before any verdict
    min_aa: int = 8  # A/A pairs before "slower" (8 is the least that gives a 99 % interval)
    what: str = "compute"  # what the pairs time, as the reason names it ("paired compute ratio", "paired TPOT ratio")


@dataclass(frozen=True)
class PairedVerdict:
    verdict: str  # slower | not slower | not judged
    reason: str
    candidate: Interval
    aa: Interval
    line: float  # the target's factor


def judge(pairs: Sequence[float], aa: Sequence[float], rule: PairedRule) -> PairedVerdict:
    """The verdict from the candidate pairs' and the A/A pairs' log ratios."""
    cand, floor = median_interval(pairs, rule.confidence), median_interval(aa, rule.confidence)
    line = rule.factor

    def said(verdict: str, why: str) -> PairedVerdict:
        return PairedVerdict(verdict, why, cand, floor, line)

    counts = f"{cand.pairs} candidate pairs, {floor.pairs} A/A pairs"
    if cand.pairs < rule.min_pairs or cand.lo is None or cand.hi is None or cand.ratio is None:
        return said(NOT_JUDGED, f"too few pairs to judge ({counts}; need {rule.min_pairs})")
    shown = f"paired {rule.what} ratio {cand.ratio:.2f} [{cand.lo:.2f}, {cand.hi:.2f}] against the incumbent"
    if cand.hi < line:
        return said(NOT_SLOWER, f"{shown} below the line {line:.2f}x ({counts})")
    if cand.lo <= line:
        return said(NOT_JUDGED, f"{shown} spans the line {line:.2f}x: the pairs cannot separate ({counts})")
    if floor.pairs < rule.min_aa or floor.lo is None or floor.hi is None:
        return said(NOT_JUDGED, f"{shown} above the line {line:.2f}x, no A/A floor ({counts}; need {rule.min_aa})")
    aa_said = f"A/A floor [{floor.lo:.2f}, {floor.hi:.2f}]"
    if cand.lo <= floor.hi:
        return said(NOT_JUDGED, f"{shown} does not clear the {aa_said} ({counts})")
    return said(SLOWER, f"{shown} above the line {line:.2f}x and the {aa_said} ({counts})")
