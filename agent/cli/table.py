"""The CLI's one way to print a table and a duration: headers always, every column as wide as its widest cell,
times in the unit a person reads."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def render_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], indent: str = "", right: Sequence[int] = ()
) -> str:
    """Left-aligned columns (the indices in `right` right-aligned) sized to their widest cell, header first;
    None prints as '-'. The last column is not padded."""
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append((indent + "  ".join(parts)).rstrip())
    return "\n".join(lines)


def render_fields(pairs: Iterable[tuple[str, object]]) -> str:
    """Label/value lines (a record, not a table): the values start in one column, after the widest label."""
    pairs = [(str(k), "-" if v is None else str(v)) for k, v in pairs]
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)} {v}".rstrip() for k, v in pairs)


def duration(seconds: float | None) -> str:
    """A duration as a person reads it: < 1 ms, 3.70 ms, 840 ms, 3.70 s, 12.5 min, 2.1 h ('-' for None)."""
    if seconds is None:
        return "-"
    s = float(seconds)
    if s < 0.001:
        return "< 1 ms"
    if s < 1:
        return f"{ms(s * 1000)} ms"
    if s < 60:
        return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def ms(value_ms: float | None) -> str:
    """Milliseconds in a fixed-point form (never 3.7e+03): 0.0412, 3.70, 3700."""
    if value_ms is None:
        return "-"
    v = float(value_ms)
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}" if v >= 0.001 else f"{v:.2e}"
