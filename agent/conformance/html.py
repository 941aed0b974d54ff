"""Self-contained HTML report (inline CSS + SVG, no scripts, no network): pass matrix, latency, accuracy drift."""

from __future__ import annotations

import math
from collections import defaultdict
from html import escape
from typing import Any

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f4f4f4}.num{text-align:right;font-variant-numeric:tabular-nums}
.passed{color:#1a7f37}.failed{color:#cf222e}.errored{color:#9a6700}.skipped{color:#777}
.note{color:#555;font-size:13px}svg text{font:11px system-ui,sans-serif}
details{margin:6px 0}code{background:#f4f4f4;padding:0 3px}
.mx{max-height:80vh;overflow:auto;border:1px solid #ddd;display:inline-block}
table.matrix{margin:0;font-size:13px}table.matrix th,table.matrix td{padding:2px 8px}
table.matrix thead th{position:sticky;top:0;z-index:1;background:#f4f4f4;text-align:center;vertical-align:bottom}
table.matrix th.op{position:sticky;left:0;background:#fafafa;font-weight:normal;font-family:ui-monospace,monospace}
table.matrix thead th.op{z-index:2}.where{color:#0969da;font-weight:normal}.sub{color:#555;font-weight:normal;font-size:12px}
td.m{text-align:center;font-variant-numeric:tabular-nums;min-width:64px}
td.all{background:#dafbe1;color:#116329}td.zero{background:#ffebe9;color:#a40e26;font-weight:600}
td.some{background:#fff8c5;color:#7a4d00;font-weight:600}td.none{background:#f6f8fa;color:#8c959f}
"""
COLORS = {"passed": "#2da44e", "failed": "#cf222e", "errored": "#d4a72c", "skipped": "#bbb"}
PALETTE = ["#0969da", "#8250df", "#bf3989", "#1a7f37", "#bc4c00", "#57606a", "#0a3069", "#953800"]


def render_html(doc: dict[str, Any]) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>edge-agent conformance</title>"
        f"<style>{CSS}</style></head><body>",
        _header(doc),
        _summary(doc),
        _precision(doc),
        _matrix(doc),
        _platforms(doc),
        _latency(doc),
        _drift(doc),
        _failures(doc),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _header(doc: dict[str, Any]) -> str:
    hw = doc.get("hardware") or {}
    vers = ", ".join(f"{escape(str(k))} {escape(str(v))}" for k, v in sorted((doc.get("versions") or {}).items()))
    return (
        f"<h1>edge-agent conformance: {escape(str(doc.get('suite')))}</h1><p>target <b>{escape(str(doc.get('target')))}</b>"
        f" &middot; {escape(str(hw.get('arch')))} &middot; {escape(str(hw.get('cpu')))} &middot; {escape(str(doc.get('created_iso', '')))}"
        f"</p><p class='note'>{vers}. Node cases are judged with onnx's own tolerances "
        f"(rtol {doc.get('node_rtol', 1e-3)}, atol {doc.get('node_atol', 1e-7)}).</p>"
    )


def _summary(doc: dict[str, Any]) -> str:
    rows = []
    for key, c in (doc.get("providers") or {}).items():
        info = (doc.get("variants") or {}).get(key, {})
        bar = _stacked_bar(c)
        note = "" if info.get("available", True) else f"unavailable: {escape(str(info.get('reason')))}<br>"
        for status, causes in ((doc.get("explanations") or {}).get(key) or {}).items():
            items = ", ".join(f"{n} {escape(cause)}" for cause, n in causes.items())
            note += f"<span class='{status}'>{status}</span>: {items}<br>"
        cells = "".join(f"<td class='num {s}'>{c[s]}</td>" for s in ("passed", "failed", "errored", "skipped"))
        rows.append(
            f"<tr><td><b>{escape(key)}</b></td><td>{escape(str(info.get('precision') or '-'))}</td>{cells}"
            f"<td class='num'>{c['total']}</td><td>{bar}</td><td class='note'>{note}</td></tr>"
        )
    return (
        "<h2>Summary by provider</h2><table><tr><th>provider</th><th>precision</th><th>passed</th><th>failed</th>"
        "<th>errored</th><th>skipped</th><th>total</th><th>share</th><th>why not passed</th></tr>"
        + "".join(rows)
        + "</table>"
        "<p class='note'>failed = ran but outputs differ beyond tolerance; errored = could not run (session refused, "
        "unsupported op, crash, timeout); skipped = provider unavailable or feature missing.</p>"
    )


def _stacked_bar(c: dict[str, int], width: int = 240) -> str:
    total = max(c.get("total", 0), 1)
    x, rects = 0.0, []
    for s in ("passed", "failed", "errored", "skipped"):
        w = width * c.get(s, 0) / total
        if w > 0:
            rects.append(
                f"<rect x='{x:.1f}' y='0' width='{w:.1f}' height='14' fill='{COLORS[s]}'><title>{s}: {c[s]}</title></rect>"
            )
        x += w
    return f"<svg width='{width}' height='14' role='img'>{''.join(rects)}</svg>"


def _precision(doc: dict[str, Any]) -> str:
    diffs = doc.get("precision_differences") or {}
    if not diffs:
        return ""
    out = ["<h2>Precision: runtime default vs f32</h2>"]
    for base, d in diffs.items():
        out.append(
            f"<p><b>{escape(base)}</b> at its default precision <b>{escape(str(d['default_precision']))}</b> passes "
            f"{d['passed_default']} of {d['cases']} node cases; at <b>{escape(str(d['variant_precision']))}</b> "
            f"({escape(d['variant'])}) {d['passed_variant']}. {d['fail_only_at_default']} cases fail only at the "
            f"default precision, {d['fail_only_at_variant']} only at {escape(str(d['variant_precision']))}.</p>"
        )
        if d["examples_fail_only_at_default"]:
            names = ", ".join(f"<code>{escape(n)}</code>" for n in d["examples_fail_only_at_default"])
            out.append(
                f"<details><summary>cases that fail only at {escape(str(d['default_precision']))}</summary>{names}</details>"
            )
    return "".join(out)


def _matrix(doc: dict[str, Any]) -> str:
    """Operators x provider columns as an HTML table: every cell shows passed/run as text (13 px, no hovering)."""
    node = [c for c in doc.get("cases", []) if c["suite"] == "onnx-node"]
    if not node:
        return ""
    keys = list((doc.get("suites") or {}).get("onnx-node", {}))
    variants = doc.get("variants") or {}
    cells: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for c in node:
        cell = cells[c["op"]][c["provider"]]
        if c["status"] != "skipped":
            cell[0] += c["status"] == "passed"
            cell[1] += 1
    ops = sorted(cells)
    head = "".join(f"<th class='col'>{_column_label(k, variants.get(k) or {})}</th>" for k in keys)
    body = []
    for op in ops:
        tds = []
        for k in keys:
            ok, n = cells[op].get(k, [0, 0])
            cls = "none" if n == 0 else _ratio_class(ok / n)
            text = f"{ok}/{n}" if n else "&ndash;"
            tds.append(f"<td class='m {cls}' title='{escape(op)} on {escape(k)}: {ok} of {n} passed'>{text}</td>")
        body.append(f"<tr><th class='op'>{escape(op)}</th>{''.join(tds)}</tr>")
    return (
        f"<h2>Pass matrix by operator and provider ({len(ops)} operators)</h2><p class='note'>each cell: node cases "
        "passed / run for the operator; green = all passed, red = none, amber = some, &ndash; = not run "
        "(provider unavailable). Columns marked @ come from another device's report.</p>"
        f"<div class='mx'><table class='matrix'><thead><tr><th class='op'>operator</th>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _column_label(key: str, info: dict[str, Any]) -> str:
    base, _, where = key.partition("@")
    prec = info.get("precision")
    sub = escape(str(prec)) if prec else ""
    if where:
        arch = info.get("arch") or ""
        emu = " emulated" if info.get("emulated") else ""
        sub = " &middot; ".join(x for x in (sub, f"{escape(str(arch))}{emu}".strip()) if x)
        return f"{escape(base)}<br><span class='where'>@{escape(where)}</span><br><span class='sub'>{sub}</span>"
    return f"{escape(base)}<br><span class='sub'>{sub}</span>"


def _ratio_class(r: float) -> str:
    if r >= 1.0:
        return "all"
    if r <= 0.0:
        return "zero"
    return "some"


def _platforms(doc: dict[str, Any]) -> str:
    """What differs on another device (e.g. an Arm board) from this host, case by case."""
    diffs = doc.get("platform_differences") or {}
    included = doc.get("included") or []
    if not included:
        return ""
    out = ["<h2>Other devices in this report</h2><ul>"]
    for inc in included:
        hw = inc.get("hardware") or {}
        emu = (
            f" &middot; <b>emulated</b> ({escape(str(inc['emulated']))}): statuses are real, times are not"
            if inc.get("emulated")
            else ""
        )
        vers = ", ".join(f"{escape(str(k))} {escape(str(v))}" for k, v in sorted((inc.get("versions") or {}).items()))
        out.append(
            f"<li><b>@{escape(str(inc['label']))}</b>: {escape(str(hw.get('arch')))} &middot; {escape(str(hw.get('cpu')))}"
            f" &middot; {escape(str(hw.get('board') or ''))}{emu}<br><span class='note'>{vers}; "
            f"{escape(str(inc.get('created_iso') or ''))}</span></li>"
        )
    out.append("</ul>")
    for d in diffs.values():
        flips = ", ".join(f"{escape(k)}: {v}" for k, v in d["flips"].items()) or "none"
        out.append(
            f"<h3>{escape(d['there'])} against {escape(d['here'])} on this host</h3><p>{d['cases']} node cases in both: "
            f"<b>{d['same']}</b> the same, <b>{d['differ']}</b> differ ({flips}).</p>"
        )
        if d["examples"]:
            rows = "".join(
                f"<tr><td>{escape(e['case'])}</td><td>{escape(str(e['op']))}</td><td class='{e['here']}'>{e['here']}</td>"
                f"<td class='{e['there']}'>{e['there']}</td><td class='note'>{escape(e['reason_there'] or e['reason_here'])}</td></tr>"
                for e in d["examples"]
            )
            out.append(
                f"<details open><summary>the {len(d['examples'])} cases that differ</summary><table><tr><th>case</th>"
                f"<th>op</th><th>here</th><th>@{escape(d['label'])}</th><th>reason</th></tr>{rows}</table></details>"
            )
    return "".join(out)


def _log_x(v: float, lo: float, hi: float, width: float) -> float:
    v = min(max(v, lo), hi)
    return width * (math.log10(v) - math.log10(lo)) / max(math.log10(hi) - math.log10(lo), 1e-9)


def _bars(
    title: str,
    note: str,
    groups: list[tuple[str, list[tuple[str, float | None, float | None, str]]]],
    unit: str,
    marker_label: str = "",
) -> str:
    """Horizontal log-scale bars: per group, per provider (label, value, marker/whisker, color)."""
    vals = [v for _, rows in groups for _, v, m, _ in rows for v in (v, m) if v]
    if not vals:
        return ""
    lo, hi = 10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals)))
    hi = max(hi, lo * 10)
    left, width, rh = 320, 560, 14
    n_rows = sum(len(r) + 1 for _, r in groups)
    svg = [f"<svg width='{left + width + 80}' height='{n_rows * rh + 40}' role='img'>"]
    e = lo
    while e <= hi * 1.0001:
        x = left + _log_x(e, lo, hi, width)
        svg.append(
            f"<line x1='{x:.1f}' x2='{x:.1f}' y1='0' y2='{n_rows * rh + 4}' stroke='#eee'/>"
            f"<text x='{x:.1f}' y='{n_rows * rh + 18}' text-anchor='middle'>{e:g}{unit}</text>"
        )
        e *= 10
    y = 0
    for name, rows in groups:
        svg.append(f"<text x='0' y='{y + 11}' font-weight='bold'>{escape(name)}</text>")
        y += rh
        for label, v, m, color in rows:
            svg.append(f"<text x='{left - 6}' y='{y + 10}' text-anchor='end'>{escape(label)}</text>")
            if v is not None:
                w = max(_log_x(v, lo, hi, width), 1)
                svg.append(
                    f"<rect x='{left}' y='{y + 1}' width='{w:.1f}' height='{rh - 3}' fill='{color}'>"
                    f"<title>{escape(label)}: {v:.4g}{unit}</title></rect>"
                )
            if m is not None:
                x = left + _log_x(m, lo, hi, width)
                svg.append(
                    f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{y}' y2='{y + rh - 1}' stroke='#000' stroke-width='2'>"
                    f"<title>{escape(marker_label)} {m:.4g}{unit}</title></line>"
                )
            y += rh
    svg.append("</svg>")
    return f"<h2>{escape(title)}</h2><p class='note'>{note}</p>" + "".join(svg)


def _color_map(doc: dict[str, Any]) -> dict[str, str]:
    keys = sorted({r["provider"] for m in doc.get("models", []) for r in m["rows"]})
    return {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(keys)}


def _latency(doc: dict[str, Any]) -> str:
    colors = _color_map(doc)
    groups = [
        (m["model"], [(r["provider"], r["p50"], r["p99"], colors[r["provider"]]) for r in m["rows"] if r["p50"]])
        for m in doc.get("models", [])
    ]
    return _bars(
        "Latency per model and provider",
        "bar = p50, black tick = p99 (log scale). Selected provider per model is listed in the table below.",
        [g for g in groups if g[1]],
        " ms",
        "p99",
    )


def _drift(doc: dict[str, Any]) -> str:
    colors = _color_map(doc)
    groups = [
        (
            m["model"],
            [
                (
                    r["provider"],
                    max(r["max_rel"], 1e-9) if r["max_rel"] is not None else None,
                    r.get("tolerance_max_rel"),
                    colors[r["provider"]],
                )
                for r in m["rows"]
                if r["max_rel"] is not None
            ],
        )
        for m in doc.get("models", [])
    ]
    chart = _bars(
        "Accuracy drift per model and provider",
        "bar = max_rel (max error / max |reference|, log scale, "
        "floored at 1e-9); black tick = the tolerance's max_rel.",
        [g for g in groups if g[1]],
        "",
        "tolerance",
    )
    rows = "".join(
        f"<tr><td>{escape(m['model'])}</td><td><b>{escape(str(m['selected']))}</b></td>"
        f"<td class='note'>{escape(str(m['reason']))}</td></tr>"
        for m in doc.get("models", [])
    )
    table = f"<table><tr><th>model</th><th>selected</th><th>why</th></tr>{rows}</table>" if rows else ""
    return chart + table


def _failures(doc: dict[str, Any], limit: int = 800) -> str:
    bad = [c for c in doc.get("cases", []) if c["status"] in ("failed", "errored")]
    if not bad:
        return "<h2>Failures</h2><p>none</p>"
    rows = "".join(
        f"<tr><td>{escape(c['suite'])}</td><td>{escape(c['case'])}</td><td>{escape(c['provider'])}</td>"
        f"<td class='{c['status']}'>{c['status']}</td><td class='note'>{escape(str(c.get('reason', ''))[:300])}</td></tr>"
        for c in bad[:limit]
    )
    more = f"<p class='note'>{len(bad) - limit} more in report.json</p>" if len(bad) > limit else ""
    return (
        f"<h2>Failures and errors ({len(bad)})</h2><details><summary>show</summary><table><tr><th>suite</th><th>case</th>"
        f"<th>provider</th><th>status</th><th>reason</th></tr>{rows}</table>{more}</details>"
    )
