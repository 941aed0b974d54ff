"""The entry action of `failed` and `rolled_back` (table.ENTRY_ACTIONS): the committed slot serves again.

Also start-up's restore of every committed slot (verified; the previous one when the committed cannot load).
"""

from __future__ import annotations

from agent.errors import EdgeAgentError, LifecycleError
from agent.lifecycle import genserve, repair, unloaded
from agent.lifecycle.parts import Parts
from agent.lifecycle.serve import serve
from agent.lifecycle.slots import SlotEntry, Slots


def restore_all(parts: Parts) -> None:
    """Start-up: serve every committed slot, verified (the previous one when the committed cannot load);
    an unreadable slots.json is rebuilt from the journal."""
    for name in parts.slots.names():
        try:
            parts.slots.get(name)
        except LifecycleError as exc:
            why = str(exc).split(": ", 1)[-1]
            parts.note(name, repair.rebuild_slots(parts.slots, parts.journal, name, parts.entry, why))
        if unloaded.held(parts.state_dir, name, parts.slots.get(name)["committed"]):
            continue  # stopped by the operator (repository unload): stays stopped across restarts
        ensure_committed(parts, name)


def ensure_committed(parts: Parts, name: str) -> None:
    """Make the registry serve the committed slot of `name` (after a failure or rollback)."""
    with parts.model_lock(name):
        slots = parts.slots.get(name)
        entry = slots["committed"]
        if genserve.serves_generative(parts, name, entry):
            genserve.ensure_generative(parts, name, entry)
            return
        meta = parts.serving_meta(name)
        if entry is None:
            if meta is not None:
                parts.registry.deactivate(name)
            return
        if meta and meta.get("sha256") == entry.sha256 and meta.get("version") == entry.version:
            return
        if _reinstate(parts, name, entry):
            return
        try:
            serve(parts, name, entry)
        except repair.Corrupt as exc:
            _fall_back(parts, name, slots, exc)
        except EdgeAgentError as exc:
            _serve_degraded(parts, name, entry, exc)


def _fall_back(parts: Parts, name: str, slots: Slots, exc: Exception) -> None:
    """The committed entry's files are damaged beyond repair: serve the previous slot, which becomes the
    committed one (the damaged version can simply be pushed again), with the reason."""
    prev = slots["previous"]
    if not prev:
        parts.unavailable[name] = f"committed {exc}; no previous version to fall back to"
        parts.note(name, parts.unavailable[name])
        return
    try:
        serve(parts, name, prev)
    except EdgeAgentError as again:
        parts.unavailable[name] = f"committed {exc}; previous version {prev.version} failed too: {again}"
        parts.note(name, parts.unavailable[name])
        return
    parts.slots.swap(name)
    parts.note(name, f"committed {exc}; serving the previous version {prev.version} instead")


def _reinstate(parts: Parts, name: str, entry: SlotEntry) -> bool:
    """Roll back to the referee (the committed version's session, kept through the swap) when it is this
    entry's: no build, no compile. False when there is none (then the slot is built again)."""
    version = parts.registry.referee(name)
    if version != entry.version:
        if version is not None:
            parts.registry.drop_referee(name)
        return False
    done = parts.registry.reinstate_referee(name, version)
    if done is None:
        return False
    meta = parts.serving_meta(name) or {}
    if meta.get("sha256") != entry.sha256:
        return False  # same label, another package: the caller builds the committed one
    parts.unavailable.pop(name, None)
    return True


def _serve_degraded(parts: Parts, name: str, entry: SlotEntry, exc: Exception) -> None:
    """The committed provider fails (driver gone, device busy): keep the model up on plain CPU, say so."""
    why = f"committed version {entry.version} cannot be served on {entry.provider}: {exc}"
    if entry.provider != "cpu":
        cpu = entry.with_(
            provider="cpu", options={}, requested_precision=None, device=None, cache_dir=None, precision=None
        )
        try:
            serve(parts, name, cpu)
            parts.unavailable[name] = f"degraded: {why}; serving on cpu (not qualified) until the next deployment"
            return
        except EdgeAgentError as cpu_exc:
            why += f"; cpu fallback failed too: {cpu_exc}"
    parts.unavailable[name] = why
