"""`edge-agent qualify PACKAGE`: measure a model on each provider, select one, show the evidence."""

from __future__ import annotations

import json
import sys
import tempfile

import click

from agent.cli.table import duration, ms, render_table


def _render(event: str, f: dict) -> str | None:
    """One progress line per harness step (None: nothing to say): provider, precision, the shapes timed, runs
    done against the target, and the time left at the pace so far."""
    from agent.cli.progress import eta

    name = (f"{f['variant']}/" if f.get("variant") else "") + str(f.get("provider") or "")
    name += f"@{f['device']}" if f.get("device") else ""
    head = f"qualify: {name}" + (f" ({f['precision']})" if f.get("precision") else "")
    if event == "row" and f.get("status") == "running":
        return f"{head}: running"
    if event == "row":
        reason = f" - {f['reason']}" if f.get("reason") and f.get("status") != "passed" else ""
        return f"{head}: {f.get('status')}{reason}"
    if event == "warning":
        return f"warning: {f.get('reason')}"
    if event == "confirm":
        return f"{head}: close call, measuring again"
    if event == "original":
        return f"{head}: measuring the fp32 original for the speed-up"
    if event == "session":
        return f"{head}: " + ("the session its row kept" if f.get("kept") else "creating session")
    if event == "session_times":
        return f"{head}: timing session creation, cold and warm"
    at = " at max" if f.get("shape") == "max" else ""
    if event == "latency" and "runs" in f:
        left = eta(f["runs"], f["target"], f.get("elapsed_s") or 0, f.get("budget_s") or 0)
        est = f", about {duration(left)} left" if left is not None else ""
        return f"{head}: latency{at} {f['runs']}/{f['target']} runs{est}"
    if event == "latency":
        budget = f" for up to {duration(f['budget_s'])}" if f.get("budget_s") else ""
        return f"{head}: measuring latency{at} on {f.get('inputs') or 'the planned inputs'}{budget}"
    if event == "selected":
        return f"qualify: selected {f.get('provider') or 'none'}"
    if event == "start":
        return f"qualify: reading {f['package']} and this device's profile"
    if event == "plan":
        return (
            f"qualify: {f['model']} v{f['version']} on target {f.get('target') or '?'}: finding the available providers"
        )
    return None


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
    help="What one model may use (512M, 2G; default: the target's memory limit, else 80% of MemAvailable or the cgroup room).",
)
@click.option(
    "--optimize",
    "optimize",
    multiple=True,
    type=click.Choice(["all", "ort-basic", "ort-extended", "ort-all", "slim", "fusions"]),
    help="Also measure offline-optimised graphs (repeatable; default: the target's qualify.optimize).",
)
def qualify(package, providers, as_json, target_name, sysroot, cache_dir, budget, timeout, save, memory_max, optimize):
    """Measure PACKAGE (directory, .tar.gz or .onnx) on each provider: compatibility, accuracy against
    golden data or onnx's reference evaluator (ORT CPU fp32 when it cannot run), latency (p50/p90/p99); select the fastest that passes. Exits 3 when no
    provider passes. A generative package (model.yaml `kind: generative`) gets TTFT, TPOT, peak RSS and fidelity
    rows instead (docs/generative.md)."""
    from agent.generative.package import is_generative

    if is_generative(package):
        from agent.cli.genqualify import GenOptions, run_generative

        ignored = _given(("cache_dir", "budget", "optimize"))
        o = GenOptions(list(providers), as_json, save, timeout, ignored, target_name, sysroot, _memory_size(memory_max))
        return run_generative(package, o, _render)
    from agent.isolate import forkserver

    forkserver.prewarm()  # the row workers' server imports the runtimes while the package loads and checks
    from agent.cli.progress import Progress

    given = _memory_size(memory_max)  # a bad flag is refused before any progress line
    with (
        tempfile.TemporaryDirectory(prefix="edge-agent-qualify-") as tmp,
        Progress("qualify", _render, as_json) as progress,
    ):
        progress.quietly(f"qualify: reading {package} and this device's profile")  # said if it takes a while
        from agent.package.load import load_package
        from agent.qualify.harness import qualify as run_qualify  # the runtimes' imports count as work too
        from agent.qualify.options import QualifyOptions
        from agent.targets import detect_device

        pkg = load_package(package, extract_to=tmp)
        profile = detect_device(sysroot or "/")
        target = _resolve_target(profile, target_name)
        measuring = QualifyOptions(
            cache_dir=cache_dir,
            latency_budget_s=budget,
            row_timeout_s=timeout,
            memory_max=_memory_max(given, target),
            optimize=(True if "all" in optimize else list(optimize)) if optimize else None,
        )
        progress.quietly(f"qualify: {pkg.name} v{pkg.version} on {getattr(target, 'name', '?')}: finding providers")
        decision = run_qualify(pkg, profile, target, list(providers) or None, options=measuring, progress=progress)
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


def _given(names: tuple[str, ...]) -> list[str]:
    """The options among `names` given on the command line (not left at their defaults), as --flags."""
    ctx = click.get_current_context()
    default = click.core.ParameterSource.DEFAULT
    return [
        "--" + p.opts[0].lstrip("-")
        for p in ctx.command.params
        if p.name in names and ctx.get_parameter_source(p.name) != default
    ]


def _memory_size(text: str | None) -> int | None:
    from agent.errors import ConfigError
    from agent.util.sizes import parse_size

    try:
        return parse_size(text) if text else None
    except ValueError as exc:
        raise ConfigError(f"--memory-max: {exc}") from None


def _memory_max(given: int | None, target) -> int | None:
    from agent.serving.memory import resolve_memory_max

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
        "MAX_P50ms",
        "COMPILE_s",
        "COLD_s",
        "WARM_s",
        "SQNR_dB",
        "RSS+MB",
    )
    table = [head] + [_row_cells(r) for r in doc["results"]]
    lines.append(render_table(head, table[1:]))
    if doc.get("emulated"):
        lines.append(f"latency measured under emulation ({doc['emulated']}): labelled emulated, not used to select")
    if any("*" in str(r[9]) or "*" in str(r[8]) for r in table[1:]):
        lines.append("* not statistically supported: p90 needs >= 64 runs, p99 >= 662 (raise --budget)")
    lines += _original_lines(doc["results"])
    lines += _own_golden_lines(doc)
    lines += _point_lines(doc["results"])
    if (doc.get("graph") or {}).get("why"):
        lines.append(f"graph: {doc['graph']['why']}")
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
        speed = f"; original p50 {ms(o.get('p50_ms'))} ms, speed-up {_fmt(o.get('speedup'), '.2f')}x" if o else ""
        if o.get("error"):
            speed = f"; {o['error']}"
        out.append(f"  {r['key']} ({r.get('precision')}) vs fp32 original: {agree} over {acc.get('sets')} sets{speed}")
    return out


def _own_golden_lines(doc: dict) -> list[str]:
    """Rows whose golden data their own runtime and provider made (agent.qualify.owngolden): said, with the
    independent check that stood in for it, or that it was not checked."""
    made = (doc.get("model") or {}).get("golden_made_by") or {}
    who = " ".join(str(made[k]) for k in ("runtime", "version", "provider") if made.get(k)) or "unknown"
    out = []
    for r in doc["results"]:
        if not r.get("accuracy_basis"):
            continue
        ind = (r.get("accuracy") or {}).get("independent")
        also = (
            f"vs onnx reference evaluator max_rel {_fmt(ind.get('max_rel'), '.2g')}" if ind else "not checked otherwise"
        )
        out.append(f"  {r['key']}: accuracy vs {r['accuracy_basis']} (golden made by {who}); {also}")
    return out


def _point_lines(rows: list[dict]) -> list[str]:
    """Each row's latency at every declared shape point and how many runs it rests on; generated inputs."""
    out = []
    for r in rows:
        for p in r.get("latency_points") or []:
            fig = f"p50 {ms(p.get('p50'))} ms over {p.get('runs')} runs" if p.get("runs") else "-"
            note = p.get("skipped") or p.get("stopped")
            out.append(
                f"  {r['key']} at {p['point']} {p['inputs']}: {fig} ({p.get('source')})" + (f"; {note}" if note else "")
            )
        for where, how in (r.get("generated_inputs") or {}).items() if r.get("latency_points") else ():
            out.append(f"  {r['key']} generated {where}: {how}")
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
        ms(lat.get("p50")),
        ms(lat.get("p90")) + ("" if sup.get("p90", True) else "*"),
        ms(lat.get("p99")) + ("" if sup.get("p99", True) else "*"),
        lat.get("runs", "-"),
        ms((r.get("latency_max_ms") or {}).get("p50")) if r.get("latency_max_ms") else "-",
        _fmt(r.get("compile_s"), ".3f"),
        _fmt((r.get("session_s") or {}).get("cold_s"), ".3f"),
        _fmt((r.get("session_s") or {}).get("warm_s"), ".3f"),
        ("exact" if acc["sqnr_db"] is None else f"{acc['sqnr_db']:.1f}") if "sqnr_db" in acc else "-",
        _fmt(r.get("rss_growth_mb"), ".1f"),
    )
