"""Server-side SVG charts: the geometry of a line chart (a polyline, dots, axes with ticks and units) computed here
from (time, value) points as numbers only; templates/_chart.html draws it, autoescaped like every page, so a
label a device supplied can never become markup. No JavaScript, nothing from a CDN. A chart with no measured
point says "not measured"."""

from __future__ import annotations

import datetime
import math
from typing import Any

WIDTH, HEIGHT = 560, 190
LEFT, RIGHT, TOP, BOTTOM = 60, 14, 12, 34
MAX_DRAWN = 720  # points drawn at most (evenly thinned beyond)
MAX_DOTS = 120  # each point gets a dot with its value as a tooltip up to this many


def _nice_step(span: float, ticks: int = 4) -> float:
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e5 else f"{v:.2e}"


def _tick(v: float, step: float) -> str:
    """A tick's label with as many decimals as its step needs (99.15 and 99.2 stay apart)."""
    if abs(v) >= 1e5 or 0 < step < 1e-6:
        return f"{v:.2e}"
    mag = math.floor(math.log10(step))
    extra = 0 if round(step / 10**mag, 6) in (1, 2, 5) else 1  # a step of 2.5 needs one decimal more
    decimals = min(6, max(0, extra - mag))
    return f"{v:.{decimals}f}"


def _utc(ts: float, with_date: bool = False) -> str:
    t = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    return t.strftime("%m-%d %H:%M" if with_date else "%H:%M:%S")


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_DRAWN:
        return points
    step = len(points) / MAX_DRAWN
    return [points[int(i * step)] for i in range(MAX_DRAWN - 1)] + [points[-1]]


def _y_range(values: list[float], fixed: tuple[float, float] | None) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if fixed is not None:
        lo, hi = min(lo, fixed[0]), max(hi, fixed[1])
    if hi - lo < 1e-9:
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = _nice_step(hi - lo)
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def layout(
    key: str,
    title: str,
    unit: str,
    how: str,
    points: list[tuple[float, float | None]],
    fixed: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The chart of `points` (time, value; None is a bucket where it was not measured) for templates/_chart.html."""
    measured = _thin([(t, float(v)) for t, v in points if v is not None])
    out: dict[str, Any] = {"key": key, "title": title, "unit": unit, "how": how, "n": len(measured)}
    out.update(width=WIDTH, height=HEIGHT, empty=not measured)
    if not measured:
        return out
    x0, x1 = measured[0][0], measured[-1][0]
    if x1 - x0 < 1e-9:
        x0, x1 = x0 - 30, x1 + 30
    y0, y1 = _y_range([v for _, v in measured], fixed)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return round(LEFT + (t - x0) / (x1 - x0) * pw, 1)

    def y(v: float) -> float:
        return round(TOP + ph - (v - y0) / (y1 - y0) * ph, 1)

    step = _nice_step(y1 - y0)
    yticks = [y0 + i * step for i in range(int(round((y1 - y0) / step)) + 1)]
    days = x1 - x0 > 86400
    out.update(
        plot={"x": LEFT, "y": TOP, "w": pw, "h": ph},
        path=" ".join(f"{x(t)},{y(v)}" for t, v in measured),
        dots=[{"x": x(t), "y": y(v), "label": f"{_fmt(v)} {unit} at {_utc(t, True)} UTC"} for t, v in measured]
        if len(measured) <= MAX_DOTS
        else [],
        yticks=[{"y": y(v), "label": _tick(v, step)} for v in yticks],
        xticks=[
            {"x": x(t), "label": _utc(t, days), "anchor": a}
            for t, a in ((x0, "start"), ((x0 + x1) / 2, "middle"), (x1, "end"))
        ],
        last=f"{_fmt(measured[-1][1])} {unit}",
        axis_y={"x": 12, "y": TOP + ph / 2},
        axis_x={"x": LEFT + pw / 2, "y": HEIGHT - 4},
    )
    return out
