"""`edge-agent qualify DIR` for a generative package (model.yaml `kind: generative`): rows per runtime, provider
and precision with load time, TTFT, TPOT, peak RSS and fidelity (agent.generative.qualify)."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from agent.cli.table import ms, render_table


@dataclass(frozen=True)
class GenOptions:
    """What `edge-agent qualify` passes on for a generative package; `ignored`: flags given that it does not use."""

    providers: list[str]
    as_json: bool
    save: str | None
    timeout: float
    ignored: list[str]
    target_name: str | None
    sysroot: str | None
    memory_max: int | None  # --memory-max, else the target's serving memory_max, else 80 % of what is available


def run_generative(package: str, o: GenOptions, say: Callable[..., Any]) -> None:
    """`say` renders progress events as `edge-agent qualify` does for any package."""
    from agent.cli.progress import Progress
    from agent.generative.package import load_generative
    from agent.generative.qualify import RowLimits, qualify_generative
    from agent.serving.memory import resolve_memory_max

    pkg = load_generative(package)
    gates_from, target = _target_gates(pkg, o.target_name, o.sysroot)
    limits = RowLimits(o.timeout, resolve_memory_max(o.memory_max, getattr(target, "serving", None))[0])
    with (
        tempfile.TemporaryDirectory(prefix="edge-agent-qualify-") as tmp,
        Progress("qualify", say, o.as_json) as progress,
    ):
        progress("plan", model=pkg.name, version=pkg.version, target=target.name)
        if o.ignored:
            progress("warning", reason=f"not used for a generative package: {', '.join(o.ignored)}")
        doc = qualify_generative(pkg, Path(tmp), providers=o.providers or None, progress=progress, limits=limits)
    doc["target"], doc["gates_from"], doc["memory_max"] = target.name, gates_from, limits.memory_max
    if o.save:
        from agent.util.atomic import atomic_write_json

        atomic_write_json(o.save, doc)
    click.echo(json.dumps(doc, indent=2, default=str) if o.as_json else render(doc))
    if doc["selected"] is None:
        sys.exit(3)


def _target_gates(pkg: Any, target_name: str | None, sysroot: str | None) -> tuple[dict[str, str], Any]:
    """Apply the matched (or named) target's qualify.generative gates over model.yaml's; where each gate came from."""
    from agent.generative.package import apply_target_gates
    from agent.targets import detect_device, resolve

    target = resolve(detect_device(sysroot or "/"), target_name)
    return apply_target_gates(pkg, target), target


def _f(v: float | None, spec: str = ".3g") -> str:
    return "-" if v is None else f"{v:{spec}}"


def _cells(r: dict[str, Any], lengths: list[int]) -> tuple[str, ...]:
    fid = r.get("fidelity") or {}
    ttft = r.get("ttft_ms") or {}
    tpot = r.get("tpot_ms") or {}
    rss = r.get("peak_rss_bytes")
    cells = [r["key"], r["status"], _f(r.get("load_s"), ".3f")]
    for n in lengths:
        t = ttft.get(str(n)) or {}
        cells += [ms(t.get("p50_ms")), ms(t.get("p90_ms"))]
    cells += [ms(tpot.get("p50_ms")), ms(tpot.get("p90_ms")), _f(rss / 2**20 if rss else None, ".1f")]
    cells += [_f(fid.get("top1"), ".3f"), _f(fid.get("max_logit_diff"), ".3g")]
    g = fid.get("greedy") or {}
    div = g.get("first_divergence")
    cells += [_f(g.get("match"), ".3f"), "-" if not fid else ("none" if div is None else str(div))]
    return tuple(cells)


def render(doc: dict[str, Any]) -> str:
    m = doc["model"]
    lengths = [int(n) for n in doc["timing"]["prompt_lengths"]]
    head = ["ROW", "STATUS", "LOAD_s"]
    for n in lengths:
        head += [f"TTFT@{n} p50ms", "p90ms"]
    head += ["TPOT p50ms", "p90ms", "PEAK_RSS_MB", "TF_TOP1", "MAX|dLOGIT|", "GREEDY", "DIVERGES@"]
    lines = [
        f"model {m['name']} v{m['version']} ({m['runtime']}, max_length {m['max_length']})  sha256 {m['sha256'][:16]}",
        f"reference: {doc['reference']}; target {doc.get('target') or '?'}; gates: "
        + ", ".join(f"{k} {v} ({(doc.get('gates_from') or {}).get(k, '?')})" for k, v in doc["gates"].items()),
        "",
        render_table(tuple(head), [_cells(r, lengths) for r in doc["results"]]),
        "",
    ]
    for r in doc["results"]:
        if r["status"] != "passed" and r.get("reason"):
            fix = f" (fix: {r['fix']})" if r.get("fix") else ""
            lines.append(f"  {r['key']}: {r['status']}: {r['reason']}{fix}")
    t = doc["timing"]
    lines.append(
        f"TTFT over {t['repeats']} runs per length; TPOT over {t['tpot_tokens']} greedy tokens x {t['repeats']} runs x "
        f"{len(lengths)} lengths; peak RSS after a generation to max_length; GREEDY: match over the first "
        f"{t['greedy_tokens']} tokens (reported, not gated)"
    )
    sel = doc.get("selected")
    lines.append(f"selected: {sel} (lowest TPOT p50 of the rows that pass)" if sel else "selected: none")
    return "\n".join(lines)
