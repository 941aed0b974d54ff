"""`edge-agent qualify PACKAGE`: measure a model on each provider, select one, show the evidence."""

from __future__ import annotations

import json
import sys
import tempfile

import click


def _progress(event: str, **f) -> None:
    """Render harness progress on stderr (one line per step; live run counts only on a terminal)."""
    tty = sys.stderr.isatty()
    name = (f"{f['variant']}/" if f.get("variant") else "") + str(f.get("provider") or "")
    name += f"@{f['device']}" if f.get("device") else ""
    prec = f" ({f['precision']})" if f.get("precision") else ""
    if event == "row" and f.get("status") == "running":
        click.echo(f"qualify: {name}{prec}: running", err=True)
    elif event == "row":
        reason = f" - {f['reason']}" if f.get("reason") and f.get("status") != "passed" else ""
        lead = "\r" if tty else ""
        click.echo(f"{lead}qualify: {name}{prec}: {f.get('status')}{reason}", err=True)
    elif event == "warning":
        click.echo(f"warning: {f.get('reason')}", err=True)
    elif event == "confirm":
        click.echo(f"qualify: {name}{prec}: close call, measuring again", err=True)
    elif event == "original":
        click.echo(f"qualify: {name}{prec}: measuring the fp32 original for the speed-up", err=True)
    elif event == "session":
        click.echo(f"qualify: {name}{prec}: creating session", err=True)
    elif event == "latency" and "runs" in f and tty:
        click.echo(f"\rqualify: latency {f['runs']}/{f['target']} runs", err=True, nl=False)
    elif event == "latency" and "runs" not in f:
        click.echo(f"qualify: {name}{prec}: measuring latency", err=True)


def _resolve_target(profile, name):
    from agent import targets

    return targets.resolve(profile, name)


@click.command("qualify")
@click.argument("package", type=click.Path())
@click.option(
    "--provider",
    "providers",
    multiple=True,
    metavar="NAME",
    help="Qualify only these providers (repeatable). Default: every available provider, the target's order first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the decision record as JSON.")
@click.option("--target", "target_name", metavar="NAME", help="Use this target profile instead of the matched one.")
@click.option(
    "--sysroot", type=click.Path(exists=True, file_okay=False), help="Detect hardware under DIR instead of /."
)
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Build compiled caches under DIR.")
@click.option(
    "--budget",
    type=click.FloatRange(0.1, 600),
    default=5.0,
    show_default=True,
    help="Seconds of timed runs per provider (p99 needs 662 runs).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(1, 7200),
    default=600.0,
    show_default=True,
    help="Deadline per provider row; a hung runtime becomes an error row.",
)
@click.option("--save", type=click.Path(dir_okay=False), help="Also write the decision JSON to FILE (atomically).")
@click.option(
    "--memory-max",
    metavar="SIZE",
    help="What one model may use (512M, 2G; default: the target's memory limit, else 80% of MemTotal).",
)
def qualify(package, providers, as_json, target_name, sysroot, cache_dir, budget, timeout, save, memory_max):
    """Measure PACKAGE (directory, .tar.gz or .onnx) on each provider: compatibility, accuracy against
    golden data or onnx's reference evaluator (ORT CPU fp32 when it cannot run), latency (p50/p90/p99); select the fastest that passes. Exits 3 when no
    provider passes."""
    from agent.qualify.harness import qualify as run_qualify
    from agent.qualify.package import load_package
    from agent.targets import detect_device

    with tempfile.TemporaryDirectory(prefix="edge-agent-qualify-") as tmp:
        pkg = load_package(package, extract_to=tmp)
        profile = detect_device(sysroot or "/")
        target = _resolve_target(profile, target_name)
        cap = _memory_max(memory_max, target)
        decision = run_qualify(
            pkg,
            profile,
            target,
            providers=list(providers) or None,
            cache_dir=cache_dir,
            progress=_progress,
            latency_budget_s=budget,
            row_timeout_s=timeout,
            memory_max=cap,
        )
    doc = decision.to_dict()
    if save:
        from agent.util.atomic import atomic_write_json

        atomic_write_json(save, doc)
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        click.echo(render(doc))
    if decision.selected is None:
        sys.exit(3)


def _memory_max(text, target) -> int | None:
    from agent.errors import ConfigError
    from agent.serving.memory import resolve_memory_max
    from agent.util.sizes import parse_size

    try:
        given = parse_size(text) if text else None
    except ValueError as exc:
        raise ConfigError(f"--memory-max: {exc}") from None
    return resolve_memory_max(given, getattr(target, "serving", None))[0]


def _fmt(v, spec=".3g", suffix="") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def render(doc: dict) -> str:
    """The human view: model line, a table of rows, the decision and why each loser lost."""
    m = doc["model"]
    lines = [
        f"model {m['name']} v{m['version']}  sha256 {m['sha256'][:16]}  target {doc.get('target') or '?'}",
        f"inputs {doc.get('inputs')}; reference {doc.get('reference')}",
        "",
    ]
    head = (
        "PROVIDER",
        "PRECISION",
        "STATUS",
        "COVER",
        "MAX_REL",
        "COSINE",
        "TOP1",
        "P50ms",
        "P90ms",
        "P99ms",
        "RUNS",
        "COMPILE_s",
        "RSS+MB",
    )
    table = [head] + [_row_cells(r) for r in doc["results"]]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    if doc.get("emulated"):
        lines.append(f"latency measured under emulation ({doc['emulated']}): labelled emulated, not used to select")
    if any("*" in str(r[9]) or "*" in str(r[8]) for r in table[1:]):
        lines.append("* not statistically supported: p90 needs >= 64 runs, p99 >= 662 (raise --budget)")
    lines += _original_lines(doc["results"])
    busy = [r["key"] for r in doc["results"] if r.get("contended")]
    if busy:
        lines.append(f"contended (other processes used > 25% of the CPU, or throttled): {', '.join(busy)}")
    if doc.get("assumed_shapes"):
        dims = "; ".join(
            f"{n}: {', '.join(f'{d}={v}' for d, v in ds.items())}" for n, ds in doc["assumed_shapes"].items()
        )
        lines.append(f"shapes assumed ({dims}): declare input_shapes in model.yaml")
    lines.append("")
    sel = doc.get("selected_key")
    lines.append(f"selected: {sel} - {doc['reason']}" if sel else f"selected: none - {doc['reason']}")
    for key, why in doc.get("losers", {}).items():
        lines.append(f"  {key}: {why}")
    vers = ", ".join(f"{k} {v}" for k, v in sorted(doc.get("versions", {}).items()))
    lines.append(f"versions: {vers}")
    return "\n".join(lines)


def _original_lines(rows: list[dict]) -> list[str]:
    """Rows compared with an fp32 original: agreement and the speed-up on the same provider."""
    out = []
    for r in rows:
        o, acc = r.get("original") or {}, r.get("accuracy") or {}
        if acc.get("against") != "fp32 original":
            continue
        agree = f"top-1 {_fmt(acc.get('top1_agreement'), '.2f')}, top-5 {_fmt(acc.get('top5_agreement'), '.2f')}"
        if acc.get("top1_agreement") is None:
            agree = f"max_rel {_fmt(acc.get('max_rel'), '.2g')}"
        speed = f"; original p50 {_fmt(o.get('p50_ms'))} ms, speed-up {_fmt(o.get('speedup'), '.2f')}x" if o else ""
        if o.get("error"):
            speed = f"; {o['error']}"
        out.append(f"  {r['key']} ({r.get('precision')}) vs fp32 original: {agree} over {acc.get('sets')} sets{speed}")
    return out


def _row_cells(r: dict) -> tuple:
    acc, lat = r.get("accuracy") or {}, r.get("latency_ms") or {}
    sup = lat.get("supported") or {}
    return (
        r["key"],
        r.get("precision") or "-",
        r["status"],
        _fmt(r.get("coverage"), ".0%"),
        _fmt(acc.get("max_rel"), ".2g"),
        _fmt(acc.get("cosine"), ".6f"),
        _fmt(acc.get("top1_agreement"), ".2f"),
        _fmt(lat.get("p50")),
        _fmt(lat.get("p90")) + ("" if sup.get("p90", True) else "*"),
        _fmt(lat.get("p99")) + ("" if sup.get("p99", True) else "*"),
        lat.get("runs", "-"),
        _fmt(r.get("compile_s"), ".3f"),
        _fmt(r.get("rss_growth_mb"), ".1f"),
    )
