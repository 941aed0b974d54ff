"""QUALIFYING: measure the package on this device (one at a time), keep the decision, select what serves."""

from __future__ import annotations

import time
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment
from agent.lifecycle.parts import Parts
from agent.lifecycle.qualifier import run_qualification
from agent.lifecycle.record import Qualified, Record
from agent.lifecycle.slots import SlotEntry
from agent.lifecycle.stages import generative
from agent.lifecycle.states import Event
from agent.util.atomic import atomic_write_json


def on_qualifying(parts: Parts, dep: Deployment, ctx: StepContext) -> tuple[Event, Qualified]:
    if generative.is_generative_deployment(dep):  # docs/generative.md
        return generative.on_qualifying(parts, dep, ctx)
    cache_root = str(parts.state_dir / "cache")
    rec = Record(dep)

    window: dict[str, Any] = {}

    def measure() -> dict[str, Any]:
        with parts.qualify_queue.turn(f"{dep.model} {dep.version} ({dep.id})", ctx) as turn:
            if ctx.deadline is not None:  # the state's deadline is for measuring, not for waiting in line
                ctx.deadline += turn["queued_s"]
            ctx.report("qualify_start", queued_s=turn["queued_s"])
            parts.registry.gate.busy(True)  # no serving run is measured for CPU time meanwhile (rungate.py)
            try:
                return run_qualification(
                    rec.package_dir,
                    parts.profile,
                    parts.target_name,
                    cache_root,
                    ctx,
                    providers=parts.config.providers,
                    options=parts.config.qualify_options,
                    overrides=rec.overrides,
                    nice=parts.config.nice,
                    memory_max=parts.config.memory_max,
                    answers={"serving_requests": lambda: serving_requests(parts)},
                )
            finally:
                parts.registry.gate.busy(False)
                window.update(turn, finished=time.time())
                ctx.report("qualify_end", seconds=round(window["finished"] - window["started"], 3))

    decision = parts.qualifier(dep, ctx, measure) if parts.qualifier is not None else measure()
    artifact = {"artifact_sha256": dep.data["sha256"]} if isinstance(dep.data.get("sha256"), str) else {}
    atomic_write_json(parts.state_dir / "decisions" / f"{dep.id}.json", {**decision, **artifact}, mode=0o600)
    parts.attest(dep, "qualification", decision)
    summary = _summary(decision)
    guessed = shapes_guessed(decision)
    if not decision.get("selected") and guessed:  # the fix first: the runtimes' errors follow from the guess
        raise LifecycleError(f"{guessed}; on those shapes no provider passed: {brief_failures(decision)}")
    if not decision.get("selected"):
        raise LifecycleError(f"no provider passed qualification: {summary['why']}")
    if guessed:
        raise LifecycleError(guessed)
    window = {k: window[k] for k in ("queued_s", "started", "finished") if k in window}
    return Event.QUALIFIED, Qualified(summary, _selected(dep, decision), window)


def _selected(dep: Deployment, decision: dict[str, Any]) -> dict[str, Any]:
    """What activation serves: the selected row's provider, precision, options, cache and measurements."""
    row = _selected_row(decision)
    note = _requalified_note(dep, decision)
    selected = {
        "provider": decision["selected"],
        "precision": row.get("precision"),
        "requested_precision": row.get("requested_precision"),
        "options": row.get("options") or {},
        "device": row.get("device"),
        "cache_dir": row.get("cache_dir"),
        "latency_ms": row.get("latency_ms") or {},
        "versions": row.get("versions") or {},
        "contended": bool(row.get("contended")),
        "memory_peak_bytes": row.get("memory_peak_bytes"),
        "session_s": row.get("session_s") or {},
        "latency_points": row.get("latency_points") or [],  # a max point not run is not replayed in warm-up
        "optimization": row.get("optimization"),
        "input_specs": (decision.get("model") or {}).get("inputs") or [],
        **({"requalified": note} if note else {}),
    }
    if row.get("variant"):  # a package of variants: serve exactly the file that won (and its cache key)
        selected.update(variant=row["variant"], model_path=row.get("model_path"), model_sha256=row.get("model_sha256"))
    return selected


def _requalified_note(dep: Deployment, decision: dict[str, Any]) -> str:
    """For a drift re-qualification: what changed and, when the provider changes, why the old one lost."""
    if dep.source.get("kind") != "requalify":
        return ""
    was = dep.source.get("provider")
    note = f"re-qualified after {dep.source.get('drift') or 'a runtime change'}"
    if was and decision.get("selected") != was:
        lost = (decision.get("losers") or {}).get(was) or "no longer passes"
        note += f": {was} -> {decision.get('selected')} ({was}: {lost})"
    return note


def drifted(parts: Parts) -> list[tuple[str, SlotEntry, str]]:
    """Start-up: committed models whose decision was made under other runtime/provider/driver versions,
    as (name, committed entry, what changed); each is marked stale until re-qualified."""
    from agent.package import caches

    current = caches.runtime_versions(parts.profile)
    out = []
    for name in parts.slots.names():
        entry = parts.slots.get(name)["committed"]
        drift = caches.version_drift(entry.versions, current) if entry else {}
        if entry and drift:
            text = caches.drift_text(drift)
            parts.stale[name] = f"decided under other versions ({text}); re-qualifying in the background"
            out.append((name, entry, text))
    return out


def serving_requests(parts: Parts) -> int:
    """Requests served so far by every model here (the qualification child asks, to record the load)."""
    return sum(int(s.snapshot().get("requests") or 0) for s in parts.registry.all_stats())


def _selected_row(decision: dict[str, Any]) -> dict[str, Any]:
    key = decision.get("selected_key") or decision.get("selected")
    for row in decision.get("results", []):
        if row.get("key", row.get("provider")) == key:
            return dict(row)
    return next((r for r in decision.get("results", []) if r.get("provider") == decision.get("selected")), {})


def shapes_guessed(decision: dict[str, Any]) -> str:
    """Why a decision measured on guessed shapes cannot go live ("" when every shape was declared)."""
    assumed = decision.get("assumed_shapes") or {}
    if not assumed:
        return ""
    dims = "; ".join(f"input {name!r}: {', '.join(f'{d}={v}' for d, v in ds.items())}" for name, ds in assumed.items())
    return (
        f"shapes guessed at qualification ({dims}): the daemon does not activate a model measured on assumed "
        "shapes; add input_shapes (a shape, or min/opt/max) or dynamic_dims to model.yaml, or a "
        "test_data_set_0 with real inputs"
    )


def brief_failures(decision: dict[str, Any], width: int = 160) -> str:
    """The failed rows' reasons, each once (rows failing the same way are named together), cut to `width`."""
    by_reason: dict[str, list[str]] = {}
    for r in decision.get("results", []):
        reason = " ".join(str(r.get("reason") or r.get("status")).split())
        reason = reason if len(reason) <= width else reason[: width - 3] + "..."
        by_reason.setdefault(reason, []).append(str(r.get("provider")))
    return "; ".join(f"{', '.join(p)}: {why}" for why, p in by_reason.items()) or "no candidate provider"


def _summary(decision: dict[str, Any]) -> dict[str, Any]:
    rows = [
        {
            "provider": r.get("provider"),
            "precision": r.get("precision"),
            "status": r.get("status"),
            "reason": r.get("reason"),
            "p50_ms": (r.get("latency_ms") or {}).get("p50"),
            **({"variant": r["variant"]} if r.get("variant") else {}),
        }
        for r in decision.get("results", [])
    ]
    why = "; ".join(
        f"{(r['variant'] + '/') if r.get('variant') else ''}{r['provider']}: {r['status']} ({r['reason']})"
        for r in rows
    )
    why = why or "no candidate provider"
    return {
        "selected": decision.get("selected"),
        "selected_precision": decision.get("selected_precision"),
        "selected_variant": decision.get("selected_variant"),
        "reason": decision.get("reason"),
        "rows": rows,
        "why": why if not decision.get("selected") else decision.get("reason"),
    }
