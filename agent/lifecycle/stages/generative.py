"""The lifecycle of a generative package (model.yaml `kind: generative`, docs/generative.md): QUALIFYING runs its
rows (TTFT, TPOT, peak RSS, fidelity; agent.generative.qualify), ACTIVATING loads the selected row beside the
serving version and swaps between requests, PROBATION judges it on paired TPOT against the incumbent kept loaded
(agent.trial.genprobation) and commits it or rolls it back. The stage modules hand over to these."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle.cleanup import collect_garbage
from agent.lifecycle.context import StepContext
from agent.lifecycle.genserve import serve_generative
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.record import Activated, Qualified, Record, Trial
from agent.lifecycle.states import Event
from agent.trial import unjudged
from agent.trial.probation import PASSED, TROUBLE, compute_measure
from agent.util.atomic import atomic_write_json


def is_generative_deployment(dep: Deployment) -> bool:
    from agent.generative.package import is_generative

    pkg = dep.data.get("package_dir")
    return isinstance(pkg, str) and is_generative(pkg)


def _providers(parts: Parts) -> list[str] | None:
    """The genai providers the device's configured providers name (None: every one the runtime has)."""
    from agent.generative.runtimes import GENAI_PROVIDERS

    chosen = {p.lower() for p in parts.config.providers or []}
    named = [p for p in GENAI_PROVIDERS if p.lower() in chosen]
    return named or None


def on_qualifying(parts: Parts, dep: Deployment, ctx: StepContext) -> tuple[Event, Qualified]:
    from agent import targets
    from agent.generative.package import apply_target_gates, load_generative
    from agent.generative.qualify import RowLimits, qualify_generative

    pkg = load_generative(Record(dep).package_dir)
    target = targets.resolve(parts.profile, parts.target_name)
    gates_from = apply_target_gates(pkg, target)
    window: dict[str, Any] = {}
    with parts.qualify_queue.turn(f"{dep.model} {dep.version} ({dep.id})", ctx) as turn:
        if ctx.deadline is not None:
            ctx.deadline += turn["queued_s"]
        ctx.report("qualify_start", queued_s=turn["queued_s"])
        left = ctx.remaining()
        limits = RowLimits(600.0 if left is None else max(1.0, left), parts.config.memory_max)
        parts.registry.gate.busy(True)  # no serving run is measured for CPU time meanwhile (rungate.py)
        try:
            with tempfile.TemporaryDirectory(prefix="genqualify-", dir=parts.state_dir / "tmp") as tmp:
                decision = qualify_generative(pkg, Path(tmp), providers=_providers(parts), progress=ctx.report,
                                              limits=limits)  # fmt: skip
        finally:
            parts.registry.gate.busy(False)
            window.update(turn, finished=time.time())
            ctx.report("qualify_end", seconds=round(window["finished"] - window["started"], 3))
    decision.update(target=target.name, gates_from=gates_from, artifact_sha256=dep.data.get("sha256"))
    atomic_write_json(parts.state_dir / "decisions" / f"{dep.id}.json", decision, mode=0o600)
    parts.attest(dep, "qualification", decision)
    rows = decision["results"]
    why = "; ".join(f"{r['key']}: {r['status']} ({r.get('reason') or '-'})" for r in rows if r["status"] != "passed")
    if not decision.get("selected"):
        raise LifecycleError(f"no runtime, provider and precision passed qualification: {why}")
    row = next(r for r in rows if r["key"] == decision["selected"])
    summary = {"kind": "generative", "selected": decision["selected"], "reason": "lowest TPOT p50 of the rows that pass",
               "rows": [{k: r.get(k) for k in ("key", "status", "reason", "tpot_ms")} for r in rows]}  # fmt: skip
    selected = {
        "provider": row["provider"],
        "precision": row["precision"],
        "variant": None if row["precision"] == "fp32" else row["precision"],
        "model_path": row["model_dir"],
        "memory_peak_bytes": row.get("peak_rss_bytes"),
        "latency_ms": {},  # a generative row is timed per token: tpot_ms, ttft_ms
        "tpot_ms": row.get("tpot_ms"),
        "ttft_ms": row.get("ttft_ms"),
    }
    window = {k: window[k] for k in ("queued_s", "started", "finished") if k in window}
    return Event.QUALIFIED, Qualified(summary, selected, window)


def on_activating(parts: Parts, dep: Deployment, ctx: StepContext) -> tuple[Event, Activated]:
    """A new version loads beside the serving one, is judged in shadow on live prompts (agent.trial.genshadow: a
    fidelity under the floor refuses the swap) and swaps in between requests, the incumbent kept as the referee
    for the paired TPOT of probation (an operator's rollback goes the ordinary way: serve.serve)."""
    shadow: dict[str, Any] = {}
    with parts.model_lock(dep.model):
        ctx.report("swap_mode", mode="make-before-break", why="a generative version loads beside the serving one")
        try:
            done = serve_generative(parts, dep.model, parts.entry(dep), keep_previous=parts.config.trial.referee,
                                    before_swap=lambda model: _shadow(parts, dep, ctx, model, shadow))  # fmt: skip
        finally:
            if shadow:  # journaled and in the decision record, passed or not
                dep.data["shadow"] = shadow
                parts.journal.save(dep)
                parts.record_decision(dep.id, shadow=shadow)
    return Event.ACTIVATED, Activated(done, shadow or None, rehearsed=True)


def _shadow(parts: Parts, dep: Deployment, ctx: StepContext, candidate: Any, out: dict[str, Any]) -> None:
    """The shadow block of `candidate` against the serving version into `out` (ShadowFailed when under the
    floor: the swap is refused, no client saw the candidate)."""
    from agent import targets
    from agent.generative.package import apply_target_gates, load_generative
    from agent.lifecycle.stages.watch import ShadowFailed
    from agent.trial import genshadow
    from agent.trial.shadow import skipped

    incumbent = parts.registry.generative.models.get(dep.model)
    if not parts.config.rehearsal.enabled:
        out.update(skipped("serving.shadow.enabled is false"))
        return
    if incumbent is None:
        out.update(skipped("no version of the model serves: nothing to compare with"))
        return
    pkg = load_generative(Record(dep).package_dir)
    apply_target_gates(pkg, targets.resolve(parts.profile, parts.target_name))  # qualification's fidelity floor
    ctx.report("shadow", phase="started", version_serving=incumbent.version)
    out.update(genshadow.judge(incumbent, candidate, pkg.gates, ctx.check))
    ctx.report("shadow", phase="done", **out)
    if out["verdict"] == genshadow.FAIL:
        raise ShadowFailed(out)


def on_probation(parts: Parts, dep: Deployment, ctx: StepContext) -> tuple[Event, Trial]:
    from agent.trial import genprobation

    host, config = parts.registry.generative, parts.config.trial
    sel = dep.data.get("selected") or {}
    cpu = compute_measure(sel.get("provider")) == "cpu"
    earlier = host.referee(dep.model) is not None
    pairing = genprobation.start_pairing(host, dep.model, config, cpu)
    try:
        v = genprobation.watch(host, dep.model, dep.version, pairing, parts.config.window_s, config, ctx.check)
    finally:
        genprobation.stop_pairing(host, dep.model, pairing)
    state, reason = unjudged.decide(v.state, v.reason, parts.config.serving, TROUBLE, earlier)
    if state not in (TROUBLE, PASSED, unjudged.NOT_JUDGED):
        raise LifecycleError(v.reason)
    figures = v.figures
    parts.record_decision(dep.id, probation=figures)
    ctx.report("probation", verdict=state, reason=reason, **figures)
    if state == TROUBLE:
        return Event.TROUBLE, Trial(figures, reason)  # the restore action serves the referee again
    with parts.model_lock(dep.model):
        host.drop_referee(dep.model)
        parts.slots.commit(dep.model, parts.entry(dep))
        parts.stale.pop(dep.model, None)
    collect_garbage(parts)
    return Event.PASSED, Trial(figures)
