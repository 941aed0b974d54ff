"""ACTIVATING: build, warm and swap in the qualified version (after its shadow phase), or the previous slot."""

from __future__ import annotations

from functools import partial

from agent.errors import LifecycleError
from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.record import Activated
from agent.lifecycle.serve import open_and_warm, serve, swap_mode
from agent.lifecycle.slots import SlotEntry
from agent.lifecycle.stages import generative
from agent.lifecycle.stages.watch import Rehearsal, shadow_skip_reason
from agent.lifecycle.states import Event


def on_activating(parts: Parts, dep: Deployment, ctx: StepContext) -> tuple[Event, Activated]:
    if generative.is_generative_deployment(dep):  # docs/generative.md
        return generative.on_activating(parts, dep, ctx)
    with parts.model_lock(dep.model):
        if dep.source.get("kind") == "rollback":
            slots = parts.slots.get(dep.model)
            committed, previous = slots["committed"], slots["previous"]
            if committed is not None and committed.sha256 == dep.data.get("sha256"):
                serve(parts, dep.model, committed)  # swapped before a crash: just serve it
                return Event.SWAPPED, Activated()
            if previous is None or previous.sha256 != dep.data.get("sha256"):
                raise LifecycleError("the previous slot changed; nothing to roll back to")
            swap = _report_swap(parts, previous, ctx)
            done = serve(parts, dep.model, previous, swap["mode"])  # the slots change once it serves
            parts.slots.swap(dep.model)
            return Event.SWAPPED, Activated({**swap, "build": done.get("build_priority")})
        entry = parts.entry(dep)
        swap = _report_swap(parts, entry, ctx)
        rehearsal = _rehearsal(parts, dep.model, swap["mode"], entry)
        try:
            done = serve(
                parts,
                dep.model,
                entry,
                swap["mode"],
                nice=parts.config.nice,
                before_swap=rehearsal.before_swap(ctx),
            )
        finally:
            if rehearsal.figures is not None:  # journaled and in the decision record, passed or not
                dep.data["shadow"] = rehearsal.figures
                parts.journal.save(dep)
                parts.record_decision(dep.id, shadow=rehearsal.figures)
        parts.rehearsals[dep.model] = rehearsal  # the incumbent's baseline and the shadow's pairs
    timings = done.get("timings") or {}
    if timings:  # session creation and time to first answer of the swap, beside the qualification's figures
        parts.record_decision(dep.id, swap_timings=timings)
    swapped = {**swap, "build": done.get("build_priority"), **timings}
    return Event.ACTIVATED, Activated(swapped, rehearsal.figures, rehearsed=True)


def _rehearsal(parts: Parts, name: str, mode: str, entry: SlotEntry) -> Rehearsal:
    from agent.trial.probation import compute_measure

    shadow = parts.config.rehearsal
    window = parts.config.window_s
    measure = compute_measure(entry.provider, entry.device)
    r = Rehearsal(parts.registry, name, shadow, parts.config.trial, window, measure)
    committed = parts.slots.committed(name)
    r.earlier = committed is not None
    if parts.config.trial.paired_twin:  # the pairs time the served side on a twin (trial/twin.py)
        r.candidate_twin = partial(open_and_warm, entry, parts.session_lock)
        if committed is not None:
            r.incumbent_twin = (committed.sha256, partial(open_and_warm, committed, parts.session_lock))
    why = shadow_skip_reason(parts.registry, name, mode, shadow)
    if why:
        r.skip(why)
    r.take_baseline()  # stop-then-start has no before_swap: the incumbent's runs up to now
    return r


def _report_swap(parts: Parts, entry: SlotEntry, ctx: StepContext) -> dict[str, str]:
    mode, why = swap_mode(parts, entry)
    ctx.report("swap_mode", mode=mode, why=why)
    return {"mode": mode, "why": why}
