"""The paired ratio of a trial in words, read from a device's status (issue 36): probation and shadow time the
incumbent and the candidate side by side, and the device reports

    "paired": {"ratio": r, "ci": [lo, hi], "pairs": N, "aa": {"ratio": r, "ci": [lo, hi], "pairs": M},
               "conditions": {...}, "verdict": "slower" | "not slower" | "not judged", "reason": "..."}

under `deployments.NAME` (or `deployments.NAME.probation`). One reading for the dashboard's device and rollout
pages: "paired ratio 1.97 [1.91, 2.04] over 213 pairs; A/A floor [0.97, 1.03] over 40 pairs; slower", and
"not measured" when a device reports none. Every value is checked for its type here too (a status stored
before its schema was checked must not break a page)."""

from __future__ import annotations

import math
from typing import Any

NOT_MEASURED = "not measured"


def of(status: Any, name: str) -> dict[str, Any] | None:
    """The paired block of model `name` in a status document (None: none reported)."""
    deps = status.get("deployments") if isinstance(status, dict) else None
    return of_deployment(deps.get(name) if isinstance(deps, dict) else None)


def of_deployment(dep: Any) -> dict[str, Any] | None:
    """The paired block of one `deployments.NAME` entry: its own, its probation's or its shadow's."""
    if not isinstance(dep, dict):
        return None
    for where in (dep, dep.get("probation"), dep.get("shadow")):
        if isinstance(where, dict) and isinstance(where.get("paired"), dict):
            paired: dict[str, Any] = where["paired"]
            return paired
    return None


def _num(x: Any) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def _interval(side: dict[str, Any]) -> str | None:
    ci = side.get("ci")
    if not isinstance(ci, list) or len(ci) != 2 or None in (_num(ci[0]), _num(ci[1])):
        return None
    return f"[{_num(ci[0]):.2f}, {_num(ci[1]):.2f}]"


def _pairs(side: dict[str, Any]) -> str:
    n = side.get("pairs")
    return f" over {n} pairs" if isinstance(n, int) and not isinstance(n, bool) else ""


def words(block: Any) -> str:
    """The paired block in words ("not measured" when absent or unreadable)."""
    if not isinstance(block, dict):
        return NOT_MEASURED
    ratio, ci = _num(block.get("ratio")), _interval(block)
    if ratio is None:
        head = f"paired ratio {NOT_MEASURED}"
    else:
        head = f"paired ratio {ratio:.2f}" + (f" {ci}" if ci else "") + _pairs(block)
    raw = block.get("aa")
    aa: dict[str, Any] = raw if isinstance(raw, dict) else {}
    floor = _interval(aa)
    parts = [head, f"A/A floor {floor}{_pairs(aa)}" if floor else f"A/A floor {NOT_MEASURED}"]
    verdict = block.get("verdict")
    if verdict in ("slower", "not slower", "not judged"):
        reason = block.get("reason")
        parts.append(verdict + (f" ({reason[:300]})" if isinstance(reason, str) and reason else ""))
    return "; ".join(parts)


def status_words(status: Any, name: str) -> str:
    return words(of(status, name))


def deployment_words(dep: Any) -> str:
    return words(of_deployment(dep))
