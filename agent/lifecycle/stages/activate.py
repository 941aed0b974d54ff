"""ACTIVATING: build, warm and swap in the qualified version (after its shadow phase), or the previous slot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle import actions as act
from agent.lifecycle import repair
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.record import Activated
from agent.lifecycle.stages.watch import Rehearsal, shadow_skip_reason
from agent.lifecycle.states import Event


def on_activating(parts: Parts, dep: Deployment, ctx: act.StepContext) -> tuple[Event, Activated]:
    with parts.model_lock(dep.model):
        if dep.source.get("kind") == "rollback":
            slots = parts.slots.get(dep.model)
            if (slots["committed"] or {}).get("sha256") == dep.data.get("sha256"):
                serve(parts, dep.model, slots["committed"])  # swapped before a crash: just serve it
                return Event.SWAPPED, Activated()
            if (slots["previous"] or {}).get("sha256") != dep.data.get("sha256"):
                raise LifecycleError("the previous slot changed; nothing to roll back to")
            swap = _report_swap(parts, slots["previous"], ctx)
            done = serve(parts, dep.model, slots["previous"], swap["mode"])  # the slots change once it serves
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
        parts.baselines[dep.model] = rehearsal.baseline
    timings = done.get("timings") or {}
    if timings:  # session creation and time to first answer of the swap, beside the qualification's figures
        parts.record_decision(dep.id, swap_timings=timings)
    swapped = {**swap, "build": done.get("build_priority"), **timings}
    return Event.ACTIVATED, Activated(swapped, rehearsal.figures, rehearsed=True)


def _rehearsal(parts: Parts, name: str, mode: str, entry: dict[str, Any]) -> Rehearsal:
    from agent.trial.probation import compute_measure

    shadow = parts.config.rehearsal
    window = parts.config.window_s
    measure = compute_measure(entry.get("provider"), entry.get("device"))
    r = Rehearsal(parts.registry, name, shadow, parts.config.trial, window, measure)
    why = shadow_skip_reason(parts.registry, name, mode, shadow)
    if why:
        r.skip(why)
    r.take_baseline()  # stop-then-start has no before_swap: the incumbent's runs up to now
    return r


def _report_swap(parts: Parts, entry: dict[str, Any], ctx: act.StepContext) -> dict[str, str]:
    mode, why = swap_mode(parts, entry)
    ctx.report("swap_mode", mode=mode, why=why)
    return {"mode": mode, "why": why}


def swap_mode(parts: Parts, entry: dict[str, Any]) -> tuple[str, str]:
    """make-before-break or stop-then-start for this activation: forced by config, else the target's rule
    (`swap_when_memory_short`) against MemAvailable and the model's peak measured by qualification (its size on
    disk when not measured)."""
    from agent.serving.memory import choose_swap, mem_available

    if parts.config.swap:
        return parts.config.swap, f"{parts.config.swap} (set by configuration)"
    peak = entry.get("memory_peak_bytes")  # measured by qualification (session, warm-up, timed runs)
    if peak:
        return choose_swap(parts.config.serving, int(peak), mem_available(), "measured peak")
    return choose_swap(parts.config.serving, _model_bytes(entry), mem_available(), "size on disk")


def serve(
    parts: Parts,
    name: str,
    entry: dict[str, Any],
    swap: str | None = None,
    nice: int = 0,
    before_swap: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Build, warm and swap in `entry`. New versions build `nice` levels below serving; restores and
    rollbacks build at serving priority (getting back to a good model comes first)."""
    note = repair.verify_unpacked(parts.store, parts.packages, entry)  # raises repair.Corrupt
    if note:
        parts.note(name, note)
    if swap is None:
        swap = swap_mode(parts, entry)[0]
    keep = before_swap is not None and parts.config.trial.referee
    result: dict[str, Any] = act.activate(
        parts.registry,
        name,
        _fresh_cache(parts, entry),
        swap=swap,
        lock=parts.session_lock,
        build_nice=nice,
        before_swap=before_swap,
        keep_previous=keep,
    )
    parts.unavailable.pop(name, None)
    return result


def _fresh_cache(parts: Parts, entry: dict[str, Any]) -> dict[str, Any]:
    """A runtime upgrade since qualification changes the cache key: never load a stale compiled blob."""
    from agent.package import caches

    stored = entry.get("versions") or {}
    if not entry.get("cache_dir") or not entry.get("model_sha256"):
        return entry
    current = caches.runtime_versions(parts.profile)
    if all(stored.get(k) == v for k, v in current.items()):
        return entry
    versions = {**stored, **current}
    fresh = caches.cache_dir_for(parts.state_dir / "cache", entry["model_sha256"], entry["provider"], versions)
    return {**entry, "cache_dir": str(fresh), "versions": versions}


def _model_bytes(entry: dict[str, Any]) -> int:
    """What a session of this model needs at least: the size of its files (weights dominate)."""
    path = entry.get("model_path")
    if not path:
        return 0
    root = Path(path).parent
    try:  # the graph and its external weights; golden test data does not load into the session
        return sum(
            p.stat().st_size
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith("test_data") for part in p.relative_to(root).parts)
        )
    except OSError:
        return 0
