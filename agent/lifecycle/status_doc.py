"""The device status document (pinned fields of docs/architecture.md) built from slots, journal and registry."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent import __version__
from agent.errors import LifecycleError
from agent.lifecycle.journal import Journal
from agent.lifecycle.slots import ModelSlots, SlotEntry
from agent.lifecycle.states import State


def models_block(
    slots: ModelSlots,
    journal: Journal,
    registry: Any = None,
    unavailable: dict[str, str] | None = None,
    stale: dict[str, str] | None = None,
    notes: dict[str, str] | None = None,
    probation_s: float | None = None,
) -> dict[str, Any]:
    """Per model: what serves (version, sha256, provider, precision) and its state (`stale`: committed, but
    decided under other runtime versions; re-qualification runs in the background); `notes`: start-up repairs.
    A version on probation is not committed: its state says `probation`, with `probation_since` (when it
    started, device clock) and, given the window `probation_s`, `probation_ends`."""
    out: dict[str, Any] = {}
    in_flight = {d.model: d for d in journal.in_flight()}
    host = getattr(registry, "generative", None)  # generative versions serve from it (docs/generative.md)
    generative = {n: m.version for n, m in host.models.items()} if host is not None else {}
    serving = {**registry.models(), **generative} if registry is not None else {}
    for name in slots.names():
        try:
            s = slots.get(name)
        except LifecycleError as exc:  # a truncated slots.json: named, never a crash of `status`
            out[name] = {"version": None, "state": "corrupt", "reason": str(exc)}
            continue
        c = s["committed"]
        if not c:
            continue
        out[name] = _committed_block(c, s["previous"], (stale or {}).get(name))
    for name, dep in in_flight.items():
        if dep.state in (State.ACTIVATING, State.PROBATION) and serving.get(name) == dep.version:
            sel = dep.data.get("selected") or {}
            out[name] = {
                **out.get(name, {}),
                "version": dep.version,
                "sha256": dep.data.get("sha256"),
                "provider": sel.get("provider"),
                "precision": sel.get("precision"),
                "state": dep.state.value,
            }
            if dep.state == State.PROBATION:
                out[name].update(_probation_times(dep, probation_s))
    if registry is not None:
        for name, info in out.items():
            if info.get("state") == "corrupt":
                continue
            if name not in serving:
                info["state"] = "unavailable"
                info["reason"] = (unavailable or {}).get(name, "not loaded")
                continue
            meta = {"kind": "generative"} if name in generative else _meta(registry, name)
            info.update({k: meta[k] for k in ("provider", "precision", "kind") if meta.get(k)})
            if unavailable and unavailable.get(name):
                info["reason"] = unavailable[name]
    for name, note in (notes or {}).items():
        if name in out and not out[name].get("reason"):
            out[name]["repaired"] = note
    return out


def _probation_times(dep: Any, window: float | None) -> dict[str, Any]:
    since = next((h.get("ts") for h in reversed(dep.history) if h.get("state") == State.PROBATION.value), None)
    if not isinstance(since, (int, float)):
        return {}
    out: dict[str, Any] = {"probation_since": since}
    if window is not None:
        out.update(probation_s=float(window), probation_ends=since + float(window))
    return out


def _meta(registry: Any, name: str) -> dict[str, Any]:
    try:
        return dict(registry.entry(name).meta)
    except Exception:  # noqa: BLE001 - swapped out between the two calls
        return {}


def deployments_block(journal: Journal) -> dict[str, Any]:
    """Latest deployment per model (pinned shape)."""
    return {name: dep.summary() for name, dep in journal.latest_per_model().items()}


def build_status(
    state_dir: str | os.PathLike[str],
    *,
    device_id: str,
    groups: Iterable[str] = (),
    target: str | None = None,
    hardware: dict[str, Any] | None = None,
    providers: list[str] | None = None,
    registry: Any = None,
    unavailable: dict[str, str] | None = None,
    notes: dict[str, str] | None = None,
    recent: int = 10,
    extra: dict[str, Any] | None = None,
    stale: dict[str, str] | None = None,
    probation_s: float | None = None,
) -> dict[str, Any]:
    slots, journal = ModelSlots(state_dir), Journal(state_dir)
    doc = {
        "device_id": device_id,
        "online": True,
        "ts": time.time(),
        "agent_version": __version__,
        "groups": list(groups),
        "target": target,
        "hardware": hardware or {},
        "providers": list(providers or []),
        "models": models_block(slots, journal, registry, unavailable, stale, notes, probation_s),
        "deployments": deployments_block(journal),
        "recent_deployments": [{"model": d.model, **d.summary()} for d in journal.recent(recent)],
    }
    doc.update(extra or {})
    return doc


def figures_brief(dep: dict[str, Any]) -> str:
    """The shadow and probation figures of a deployment summary in a few words ('' when it has none)."""
    parts = []
    sh = dep.get("shadow") if isinstance(dep.get("shadow"), dict) else None
    if sh:
        what = [f"{sh.get('requests')} req"]
        if sh.get("agreement") is not None:
            what.append(f"agreement {sh['agreement']:.3f}")
        if sh.get("latency_ratio") is not None:
            what.append(f"compute x{sh['latency_ratio']:.2f}")
        parts.append(f"shadow {sh.get('verdict')} ({', '.join(what)})" if sh.get("verdict") != "skipped" else "")
        if sh.get("compute") == "paired" and isinstance(sh.get("paired"), dict):  # the pairs decided the shadow
            parts.append(f"shadow {paired_brief(sh['paired'])}")
    pr = dep.get("probation") if isinstance(dep.get("probation"), dict) else None
    if pr and str(pr.get("measure")).startswith("TPOT"):  # a generative model's (agent.trial.genprobation)
        parts.append(f"probation {pr.get('requests')} generations, {pr.get('cancelled')} cancelled")
    elif pr:
        tests = [c for c in pr.get("compute") or [] if isinstance(c, dict)]
        ratios = ", ".join(f"p{c.get('q')} x{c.get('ratio')}" for c in tests)
        base = (pr.get("baseline") or {}).get("source") or "no baseline"
        n = pr.get("not_judged") if isinstance(pr.get("not_judged"), dict) else None
        compute = f"{ratios or 'not judged'} vs {base}"
        if n:  # agent.trial.unjudged: its own outcome, with the counts
            why = f": {n['why']}" if isinstance(n.get("why"), str) else ""  # a skip besides contention
            compute = (
                f"NOT JUDGED ({n.get('measured')} of {n.get('needed')} runs measured, {n.get('contended')} contended"
                f"{why})"
            )
        parts.append(
            f"probation {pr.get('requests')} req, {pr.get('errors')} failed, {pr.get('nonfinite')} NaN/Inf, "
            f"{pr.get('request_caused')} request-caused; compute {compute}"
        )
    paired = pr.get("paired") if pr and isinstance(pr.get("paired"), dict) else None
    if paired:
        parts.append(paired_brief(paired))
    return "; ".join(p for p in parts if p)


def paired_brief(paired: dict[str, Any]) -> str:
    """The paired verdict in a few words: ratio with its interval over N pairs, the A/A floor, the verdict."""

    def said(block: Any) -> str:
        if not isinstance(block, dict) or block.get("ratio") is None:
            return "not measured"
        ci = block.get("ci") or [None, None]
        interval = f" [{ci[0]}, {ci[1]}]" if None not in ci else " (no interval)"
        return f"x{block['ratio']}{interval} over {block.get('pairs')} pairs"

    return f"paired {said(paired)}, A/A {said(paired.get('aa'))}: {paired.get('verdict')}"


def hardware_summary(profile: Any) -> dict[str, Any]:
    """The status document's short hardware block."""
    if profile is None:
        return {}
    board = getattr(profile, "board", None)
    return {
        "arch": profile.arch,
        "board": getattr(board, "model", None) if board else None,
        "accelerators": [a.vendor for a in getattr(profile, "accelerators", ())],
    }


def status_path(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / "status.json"


def _committed_block(c: SlotEntry, prev: SlotEntry | None, stale: str | None) -> dict[str, Any]:
    """A committed slot as status shows it (`stale`: decided under other runtime versions)."""
    out: dict[str, Any] = {
        "version": c.version,
        "sha256": c.sha256,
        "provider": c.provider,
        "precision": c.precision,
        "state": "stale" if stale else State.COMMITTED.value,
        "previous": prev.version if prev is not None else None,
    }
    if c.variant:  # a package of variants: which one serves
        out["variant"] = c.variant
    if c.optimization:  # an offline-optimised graph serves (agent.qualify.optimize)
        out["optimization"] = c.optimization
    if c.session_s:  # cold / warm session creation measured by qualification
        out["session_s"] = c.session_s
    if stale:
        out["stale"] = stale
    if c.requalified:
        out["requalified"] = c.requalified
    return out
