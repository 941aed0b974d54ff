"""`edge-agent conformance`: run the hardware conformance suites and write report.json, junit.xml, report.html."""

from __future__ import annotations

import json
import sys
import time

import click

from agent.cli.table import duration


class _Progress:
    """Progress on stderr: a live counter on a terminal, a line every 10% otherwise."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()

    def __call__(self, event: str, **f) -> None:
        if event == "suite":
            click.echo(f"conformance: {f['suite']}: {f.get('stage', '')}", err=True)
        elif event == "variant":
            click.echo(f"conformance: {f['suite']} on {f['provider']} ({f['total']} cases)", err=True)
        elif event == "case":
            self._case(f)
        elif event == "model":
            eta = f", about {duration(f['eta_s'])} left" if f.get("eta_s") is not None else ""
            took = f" ({duration(f['elapsed_s'])} so far{eta})" if f.get("elapsed_s") else ""
            click.echo(f"conformance: models [{f['index']}/{f['total']}] {f['model']}{took}", err=True)
        elif event == "row" and f.get("status") != "running":
            prec = f" ({f['precision']})" if f.get("precision") else ""
            click.echo(f"  {f.get('provider')}{prec}: {f.get('status')}", err=True)

    def _case(self, f) -> None:
        i, n = f["index"], f["total"]
        if i == 1 or f["provider"] != getattr(self, "_variant", None):
            self._variant, self._v0 = f["provider"], time.monotonic()
        spent = time.monotonic() - self._v0
        eta = f" ~{duration(spent / i * (n - i))} left" if i < n else f" in {duration(spent)}"
        line = f"  {f['provider']}: {i}/{n} {f['case']} {f['status']}{eta}"
        if self.tty:
            click.echo(f"\r{line[:110]}\x1b[K", err=True, nl=(i == n))  # rewrite the line, clear what was longer
        elif i == n or i % max(n // 10, 1) == 0:
            click.echo(line, err=True)


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C: the suites' finally blocks close their workers (a busy one is killed), and a
    worker whose parent dies anyway is killed by the kernel (agent.isolate.worker: PR_SET_PDEATHSIG)."""
    import signal

    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)


@click.command("conformance")
@click.option("--suite", type=click.Choice(["onnx-node", "models", "all"]), default="all", show_default=True)
@click.option(
    "--provider",
    "providers",
    multiple=True,
    metavar="NAME",
    help="Providers to test (repeatable). Default: every available provider, every precision variant.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="conformance-report",
    show_default=True,
    help="Directory for report.json, junit.xml and report.html.",
)
@click.option(
    "-k",
    "--case",
    "patterns",
    multiple=True,
    metavar="GLOB",
    help="Only node cases whose name matches (shell glob, repeatable), e.g. 'test_conv*'.",
)
@click.option(
    "--models-dir",
    type=click.Path(exists=True, file_okay=False),
    help="Also qualify every package in DIR (models suite).",
)
@click.option(
    "--budget",
    type=click.FloatRange(0.1, 600),
    default=2.0,
    show_default=True,
    help="Seconds of timed runs per model and provider (models suite).",
)
@click.option(
    "--case-timeout",
    type=click.FloatRange(1, 3600),
    default=60.0,
    show_default=True,
    help="Deadline per node case; a hang errors the case and the run continues.",
)
@click.option(
    "--model-budget",
    type=click.FloatRange(5, 3600),
    default=90.0,
    show_default=True,
    help="Wall-clock seconds per model, all providers together (models suite); rows past it are skipped.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help="Reuse reference outputs and compiled blobs across runs (models suite). Default: OUT/.cache.",
)
@click.option(
    "--with-report",
    "with_reports",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    metavar="REPORT_JSON",
    help="Add another device's report.json (e.g. from an Arm board) as columns, and list the cases that differ.",
)
@click.option(
    "--from-report",
    type=click.Path(exists=True, dir_okay=False),
    metavar="REPORT_JSON",
    help="Run nothing: write this report again to --out (with any --with-report columns added).",
)
@click.option("--target", "target_name", metavar="NAME", help="Use this target profile instead of the matched one.")
@click.option("--json", "as_json", is_flag=True, help="Print the provider counts as JSON.")
def conformance(
    suite,
    providers,
    out_dir,
    patterns,
    models_dir,
    budget,
    case_timeout,
    model_budget,
    cache_dir,
    with_reports,
    from_report,
    target_name,
    as_json,
):
    """Run the ONNX node suite (onnx's own test cases and tolerances) and/or the models suite (onnx's
    light_* models, generated samples, your packages) on every provider, each case isolated in a child
    process. Writes OUT/report.json, OUT/junit.xml and OUT/report.html."""
    from pathlib import Path

    from agent.conformance.compare import load_report
    from agent.conformance.report import from_dict
    from agent.conformance.runner import run_conformance
    from agent.errors import EdgeAgentError
    from agent.targets import detect_device as detect
    from agent.targets import resolve

    try:
        others = [(p, load_report(Path(p))) for p in with_reports]
        base = load_report(Path(from_report)) if from_report else None
    except EdgeAgentError as exc:
        raise click.UsageError(str(exc)) from exc
    _stop_on_sigterm()
    if base is not None:
        report = from_dict(base)
        _emit(report, others, Path(out_dir), as_json)
        return
    profile = detect("/")
    target = resolve(profile, target_name)
    report = run_conformance(
        suite,
        list(providers) or None,
        profile=profile,
        target=target,
        models_dir=Path(models_dir) if models_dir else None,
        patterns=list(patterns) or None,
        budget_s=budget,
        case_timeout=case_timeout,
        progress=_Progress(),
        model_budget_s=model_budget,
        cache_dir=Path(cache_dir) if cache_dir else Path(out_dir) / ".cache",
    )
    _emit(report, others, Path(out_dir), as_json)


def _emit(report, others, out_dir, as_json) -> None:
    from agent.conformance.compare import include
    from agent.conformance.report import write_all

    for path, doc in others:
        include(report, doc, source=str(path))
    paths = write_all(report, out_dir)
    counts = report.counts()
    if as_json:
        ran = sorted({c["suite"] for c in report.cases})
        click.echo(
            json.dumps(
                {
                    "providers": counts,
                    "suites": {s: report.counts(s) for s in ran},
                    "precision_differences": report.precision_differences(),
                    "platform_differences": report.platform_differences(),
                    "emulated": report.meta.get("emulated"),
                    "files": {k: str(v) for k, v in paths.items()},
                },
                indent=2,
            )
        )
        return
    ran = sorted({c["suite"] for c in report.cases})
    for suite_name in ran:
        if len(ran) > 1:
            click.echo(f"[{suite_name}]")
        click.echo(_table(report.counts(suite_name), report.variants))
    for base, d in report.precision_differences().items():
        click.echo(
            f"{base}: {d['default_precision']} passes {d['passed_default']}/{d['cases']} node cases, "
            f"{d['variant_precision']} passes {d['passed_variant']}/{d['cases']} "
            f"({d['fail_only_at_default']} fail only at {d['default_precision']})"
        )
    for key, by_status in report.explanations().items():
        for status, causes in by_status.items():
            parts = "; ".join(f"{n} {cause}" for cause, n in list(causes.items())[:4])
            more = f"; {sum(list(causes.values())[4:])} other" if len(causes) > 4 else ""
            click.echo(f"{key} {status} {sum(causes.values())}: {parts}{more}")
    for key, d in report.platform_differences().items():
        click.echo(f"{key}: {d['same']} of {d['cases']} node cases as on this host's {d['here']}, {d['differ']} differ")
    for name, why in report.meta.get("unavailable_providers", {}).items():
        click.echo(f"not run: {name}: {why}")
    if report.meta.get("emulated"):
        click.echo(f"emulated ({report.meta['emulated']}): statuses are real, case times are not")
    click.echo(f"wrote {paths['json']}, {paths['junit']}, {paths['html']}")


def _table(counts: dict, variants: dict) -> str:
    head = ("PROVIDER", "PRECISION", "PASSED", "FAILED", "ERRORED", "SKIPPED", "TOTAL")
    from agent.cli.table import render_table

    rows = [
        (
            k,
            (variants.get(k) or {}).get("precision"),
            *(c[s] for s in ("passed", "failed", "errored", "skipped", "total")),
        )
        for k, c in counts.items()
    ]
    return render_table(head, rows)
