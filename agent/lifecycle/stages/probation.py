"""PROBATION: watch the swapped-in version against the incumbent; commit its slot when it passes."""

from __future__ import annotations

from agent.lifecycle.cleanup import collect_garbage
from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.record import Trial
from agent.lifecycle.stages import generative
from agent.lifecycle.stages.watch import probation_watch
from agent.lifecycle.states import Event
from agent.trial.probation import TROUBLE


def on_probation(parts: Parts, dep: Deployment, ctx: StepContext) -> tuple[Event, Trial]:
    if generative.is_generative_deployment(dep):  # docs/generative.md
        return generative.on_probation(parts, dep, ctx)
    window = parts.config.window_s
    config = parts.config.trial
    state, reason, figures = probation_watch(
        parts.registry, dep, ctx, window, config, parts.rehearsals.pop(dep.model, None), parts.config.serving
    )
    parts.record_decision(dep.id, probation=figures)
    ctx.report("probation", verdict=state, reason=reason, **figures)
    if state == TROUBLE:
        return Event.TROUBLE, Trial(figures, reason)
    with parts.model_lock(dep.model):
        parts.slots.commit(dep.model, parts.entry(dep))
        parts.stale.pop(dep.model, None)
    collect_garbage(parts)
    return Event.PASSED, Trial(figures)
