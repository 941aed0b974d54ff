"""The qualification harness: one row per (provider, precision), each in a child process; then selection."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import ProviderError
from agent.isolate import forkserver
from agent.isolate.runner import IsolatedResult, run_isolated
from agent.package import variants as var
from agent.package.load import ModelPackage, load_package
from agent.qualify import coverage_set, latency, probes, reference, select
from agent.qualify import optimize as opt
from agent.qualify import outputs as io
from agent.qualify.decision import Decision, Row
from agent.qualify.keptrows import KeptRows
from agent.qualify.options import QualifyOptions
from agent.qualify.rowrunner import RowRunner

CLOSE_CALL = 0.25  # the two fastest rows within 25% of each other get a confirmation round
DEFAULT = QualifyOptions()


def qualify(
    package: ModelPackage | str | Path,
    profile: Any,
    target: Any = None,
    providers: list[str] | None = None,
    *,
    options: QualifyOptions = DEFAULT,
    progress: Callable[..., None] | None = None,
) -> Decision:
    """Measure the package on each candidate provider and select one. Rows never raise; bad arguments do.

    A provider's non-default precision (OpenVINO f32 on bf16 CPUs) is measured when the default fails
    accuracy, or always with options.all_precisions (the conformance report). When the two fastest passing
    rows are within CLOSE_CALL of each other, both are measured again in reverse order and their samples
    merged, so load drift during the first pass cannot decide alone. How rows are measured, within which
    budgets and limits, and which optimised variants are measured too: `options` (agent.qualify.options)."""
    if options.isolate:
        forkserver.prewarm()  # the row workers' server imports the runtimes while the package loads and probes run
    pkg = package if isinstance(package, ModelPackage) else load_package(package)
    target = target if target is not None else _match_target(profile)
    found = var.variants_of(pkg)
    for v in found:
        io.check_servable(v.model_path)  # outputs OIP cannot carry: refused with the remedy, never served wrong
    names = candidates(target, providers, pkg)
    deadline = time.monotonic() + options.deadline_s if options.deadline_s is not None else None
    kinds = options.kinds(target)
    built: list[dict[str, Any]] = []
    if kinds:
        more, built = opt.variants_for(found, kinds, options.cache_dir, _child_runner(options))
        found = found + more
    asked = set(providers or select.preference_of(target) or ["cpu"])  # rows even when unavailable

    def runner() -> RowRunner:
        run = RowRunner(pkg, profile, target, options, progress)
        run.deadline, run.asked = deadline, asked
        return run

    # with a confirmation round possible, the fastest passing rows' workers keep their sessions until it is done
    # (not in the daemon, keep_sessions=False: one row process at a time there, and no idle session's memory beside
    # the serving model)
    keep = options.isolate and deadline is None and options.keep_sessions
    kept = KeptRows(options.memory_max) if keep else None
    try:
        run, rows, refs = _measure(runner, found, names, kept)
    finally:
        if kept is not None:
            kept.close()
    model = pkg.to_dict()
    if pkg.variants or built:
        model["variants"] = {v.name: v.to_dict() for v in found if v.name}
    return _decide(run, rows, model, built, "; ".join(refs))


def _measure(
    runner: Callable[[], RowRunner], found: list[var.Variant], names: list[str], kept: KeptRows | None
) -> tuple[RowRunner, list[Row], list[str]]:
    """Every variant's rows on every candidate (each variant against its own reference, described in the list
    returned), then the close-call round: (the last variant's runner, the rows, the references)."""
    rows: list[Row] = []
    reruns: dict[str, Callable[..., Row]] = {}
    refs: list[str] = []
    originals: dict[str, IsolatedResult] = {}
    probed: dict[str, Any] | None = None
    for v in found:
        run = runner()
        run.originals = originals
        run.kept = None if run.emulated else kept
        if probed is None:  # once per qualification, in a worker: this process never imports a runtime
            probed = probes.probe_all(run.profile, run.probe_options(names), run.isolate)
        run.probes = probed
        if not refs:
            run.warn_assumed()
        run.use_variant(v, reruns)  # its own file, input types, reference (golden, itself, or its fp32 original)
        refs.append(f"{v.name}: {run.ref_desc}" if v.name else run.ref_desc)
        for name in names:
            rows.extend(run.provider_rows(name))
    _confirm_close_call(run, rows, reruns, kept)
    return run, rows, refs


def _decide(run: RowRunner, rows: list[Row], model: dict[str, Any], built: list[dict[str, Any]], refs: str) -> Decision:
    """Selection among the rows (the target decides whether an unchecked row may be selected), as the Decision."""
    target, pkg = run.target, run.pkg
    reference.apply_rule(rows, target)
    winner, why, losers = select.choose(rows, select.preference_of(target))
    why = why if winner else select.no_winner_hint(rows, why, run.golden is not None, Path(pkg.model_path).name)
    chosen = {"variant": winner.variant} if winner and winner.variant else {}
    run.say("selected", provider=winner.provider if winner else None, reason=why, **chosen)
    return Decision(
        model=model,
        results=rows,
        selected=winner.provider if winner else None,
        selected_precision=winner.precision if winner else None,
        selected_key=winner.key if winner else None,
        reason=why,
        losers=losers,
        noise_rule=select.NOISE_RULE,
        target=getattr(target, "name", None),
        versions=run.versions,
        reference=refs,
        inputs=run.inputs_desc,
        timestamp=time.time(),
        hardware=_hw(run.profile),
        selected_variant=winner.variant if winner else None,
        assumed_shapes=run.plan.assumed,
        memory_max=run.memory_max,
        emulated=run.emulated,
        optimizations=built,
        graph=opt.serving_graph(winner, built) if built else {},
        accuracy_checked=winner.accuracy_checked if winner else None,
    )


def _child_runner(options: QualifyOptions) -> Callable[..., Any]:
    return lambda func, kwargs, tag: run_isolated(
        func, kwargs, timeout=options.row_timeout_s, isolate=options.isolate, tag=tag, memory_max=options.memory_max
    )


def _match_target(profile: Any) -> Any:
    try:
        from agent.targets import match
    except ImportError:
        return None
    return match(profile)


def candidates(target: Any, providers: list[str] | None, pkg: ModelPackage) -> list[str]:
    """Requested providers, else the target's preference order then every other provider (each measured
    where available: agent.qualify.coverage_set); model.yaml required_providers restrict both."""
    from agent.providers import PROVIDER_NAMES

    names = list(providers) if providers else coverage_set.with_unlisted(select.preference_of(target) or ["cpu"])
    unknown = [n for n in names if n not in PROVIDER_NAMES]
    if unknown:
        raise ProviderError(f"unknown provider {unknown[0]!r}; known: {', '.join(PROVIDER_NAMES)}")
    if pkg.required_providers:
        names = [n for n in names if n in pkg.required_providers]
        if not names:
            raise ProviderError(f"model.yaml required_providers {pkg.required_providers} excludes every candidate")
    return list(dict.fromkeys(names))


def _confirm_close_call(
    run: RowRunner, rows: list[Row], reruns: dict[str, Callable[..., Row]], kept: KeptRows | None = None
) -> None:
    """Re-measure the two fastest passing rows (reverse order) when within CLOSE_CALL; merge samples. A row
    whose worker was kept is re-timed there, on the session it still holds (no new fork, no second compile)."""
    passing = sorted(
        (r for r in rows if r.status == "passed" and (r.latency_ms or {}).get("samples_ms")),
        key=lambda r: r.latency_ms["p50"],
    )
    if (
        run.emulated
        or run.deadline is not None
        or len(passing) < 2
        or passing[1].latency_ms["p50"] > passing[0].latency_ms["p50"] * (1 + CLOSE_CALL)
    ):
        return
    if kept is not None:
        for key in set(kept.keys()) - {passing[0].key, passing[1].key}:
            worker = kept.pop(key)
            if worker is not None:
                worker.close()  # not confirmed: let its session go before the round
    for row in (passing[1], passing[0]):
        run.say("confirm", provider=row.provider, precision=row.precision)
        worker = kept.pop(row.key) if kept is not None else None
        again = reruns[row.key](confirm=True, worker=worker)  # timed runs only: the rest holds from round one
        if again.status != "passed":
            continue
        stale = latency.phrase(row.latency_ms)
        merged = row.latency_ms["samples_ms"] + again.latency_ms["samples_ms"]
        warm = row.latency_ms.get("warmup_runs", 0) + again.latency_ms.get("warmup_runs", 0)
        row.latency_ms = {
            **latency.summarize(merged, warmup_runs=warm, batch=row.latency_ms.get("batch", 1)),
            "rounds": 2,
        }
        row.throughput_ips = row.latency_ms.get("throughput_ips")
        if row.reason and stale in row.reason:  # the reason states the merged figures, not round one's
            row.reason = row.reason.replace(stale, latency.phrase(row.latency_ms))
        orig_p50 = (row.original or {}).get("p50_ms")
        if orig_p50 and row.latency_ms.get("p50"):  # the speed-up follows the merged samples
            row.original = {**(row.original or {}), "speedup": round(orig_p50 / row.latency_ms["p50"], 3)}


def _hw(profile: Any) -> dict[str, Any]:
    cpu = getattr(profile, "cpu", None)
    board = getattr(profile, "board", None)
    return {
        "arch": getattr(profile, "arch", None),
        "cpu": getattr(cpu, "model", None),
        "board": getattr(board, "model", None) if board else None,
        "software": dict(getattr(profile, "software", None) or {}),
    }
