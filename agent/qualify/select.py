"""Measured provider selection: fastest p50 (p99 tie-break) among passing rows; near-ties go to target order.

Noise rule: a passing row B is a near-tie of the fastest row A when B's p50 is within 5% of A's, or the
two p50 bootstrap 95% confidence intervals overlap. Among A and its near-ties the provider that comes
first in the target's preference order wins (then lower p50, then lower p99).

Among near-ties on one provider the graph as delivered beats an offline-optimised one (agent.qualify.optimize):
an optimised graph serves only when it is faster beyond noise.

Rows measured under an emulator (qemu-user) carry `emulated`: their latency says nothing about the real
device, so it is never compared; the first passing row in the target's preference order is selected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.qualify.decision import Row

NOISE_FRACTION = 0.05
NOISE_RULE = "near-tie: p50 within 5% or overlapping bootstrap 95% CIs of p50 -> target preference order"


def _p(row: Row, key: str) -> float:
    v = (row.latency_ms or {}).get(key)
    return float("inf") if v is None else float(v)


def is_near_tie(fast: Row, other: Row) -> bool:
    a, b = _p(fast, "p50"), _p(other, "p50")
    if b <= a * (1 + NOISE_FRACTION):
        return True
    ci_a = (fast.latency_ms or {}).get("p50_ci95") or [a, a]
    ci_b = (other.latency_ms or {}).get("p50_ci95") or [b, b]
    return bool(ci_b[0] <= ci_a[1])


def choose(rows: list[Row], preference: list[str]) -> tuple[Row | None, str, dict[str, str]]:
    """(winner, why it won, {row key: why it lost})."""
    order = {name: i for i, name in enumerate(preference)}

    def rank(r: Row) -> int:
        return order.get(r.provider, len(order))

    passing = sorted((r for r in rows if r.status == "passed"), key=lambda r: (_p(r, "p50"), _p(r, "p99")))
    losers = {r.key: f"{r.status}: {r.reason}" for r in rows if r.status != "passed"}
    if not passing:
        return None, "no provider passed compatibility and accuracy", losers
    emulated = next((r.emulated for r in passing if r.emulated), None)
    if emulated:
        return _by_preference(passing, rank, emulated, losers)
    fastest = passing[0]
    ties = [r for r in passing if r is fastest or is_near_tie(fastest, r)]
    winner = min(ties, key=lambda r: (rank(r), r.optimization is not None, _p(r, "p50"), _p(r, "p99")))
    optimised, winner = winner, _delivered_if_tied(winner, passing)
    ties = ties if any(r is winner for r in ties) else [*ties, winner]
    why = _why_won(winner, fastest)
    if optimised is not winner:
        why += f"; {optimised.key} is within noise of it: the graph as delivered serves"
    for r in passing:
        if r is not winner:
            losers[r.key] = _why_lost(r, winner, any(r is t for t in ties), rank(r) > rank(winner))
    return winner, why, losers


def _delivered_if_tied(winner: Row, passing: list[Row]) -> Row:
    """An optimised graph serves only when it beats the graph as delivered on the same provider beyond noise."""
    if winner.optimization is None:
        return winner
    same = [
        r
        for r in passing
        if r.optimization is None
        and (r.provider, r.requested_device, r.requested_precision)
        == (winner.provider, winner.requested_device, winner.requested_precision)
        and (_p(r, "p50") <= _p(winner, "p50") or is_near_tie(winner, r))
    ]
    return min(same, key=lambda r: (_p(r, "p50"), _p(r, "p99"))) if same else winner


def _by_preference(
    passing: list[Row], rank: Callable[[Row], int], emulated: str, losers: dict[str, str]
) -> tuple[Row | None, str, dict[str, str]]:
    """Selection without latency claims: the first passing row in preference order (then row order)."""
    winner = min(passing, key=lambda r: (rank(r), passing.index(r)))
    why = (
        f"first passing provider in the target's preference order; latency measured under emulation "
        f"({emulated}) is not compared"
    )
    for r in passing:
        if r is not winner:
            losers[r.key] = "passed, but later in the target's preference order (emulated latency is not compared)"
    return winner, why, losers


def _ms(x: float) -> str:
    return f"{x:.3g} ms"


def _why_won(winner: Row, fastest: Row) -> str:
    if winner is fastest:
        return f"fastest passing provider: p50 {_ms(_p(winner, 'p50'))}, p99 {_ms(_p(winner, 'p99'))}"
    return (
        f"within noise of the fastest ({fastest.key}: p50 {_ms(_p(fastest, 'p50'))} vs {_ms(_p(winner, 'p50'))}) "
        "and first in the target's preference order"
    )


def _why_lost(row: Row, winner: Row, tied: bool, later: bool) -> str:
    a, b = _p(row, "p50"), _p(winner, "p50")
    if tied and not later and row.optimization and not winner.optimization:
        return (
            f"within noise of {winner.key} (p50 {_ms(a)} vs {_ms(b)}): on a near-tie the graph as delivered serves, "
            "not the optimised one"
        )
    if tied and later:
        return f"within noise of {winner.key} (p50 {_ms(a)} vs {_ms(b)}) but later in the target's preference order"
    if tied:
        return f"within noise of {winner.key} and same preference; slower p50/p99 ({_ms(a)} vs {_ms(b)})"
    pct = (a / b - 1) * 100 if b > 0 else float("inf")
    return f"slower: p50 {_ms(a)} vs {_ms(b)} for {winner.key} (+{pct:.0f}%)"


def preference_of(target: Any) -> list[str]:
    """Provider names in the target's preference order."""
    prefs = getattr(target, "providers", None) or []
    return [getattr(p, "name", p) for p in prefs]


def no_winner_hint(rows: list[Row], why: str, golden: bool, model_file: str) -> str:
    """Why nothing was selected, taught: when every provider that ran failed only on accuracy against a
    reference computed from seeded inputs (no golden data), the reference itself may not suit this model."""
    ran = [r for r in rows if r.status == "failed"]
    if golden or not ran or any(r.status == "passed" for r in rows):
        return why
    if not all((r.reason or "").startswith("accuracy:") for r in ran):
        return why
    return (
        f"{why}: every provider disagrees with the reference outputs computed from seeded random inputs, so the "
        "reference may not suit this model (random inputs can drive it where its outputs are unstable or "
        "meaningless, or the model is not deterministic); package it with real inputs, whose outputs become the "
        f"golden data, and qualify the package: edge-agent package {model_file} --inputs sample.npy --out "
        "my-model, then edge-agent qualify my-model"
    )
