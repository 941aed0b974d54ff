"""Serve a generative slot entry (docs/generative.md, "Swap and probation"): load it beside the serving version
in the registry's GenerativeHost and swap between requests; the restore action and start-up's restore for a
generative model (the referee again without a load, else a load)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError, LifecycleError
from agent.lifecycle import repair
from agent.lifecycle.parts import Parts
from agent.lifecycle.slots import SlotEntry


def is_generative_entry(entry: SlotEntry | None) -> bool:
    from agent.generative.package import is_generative

    return entry is not None and bool(entry.package_dir) and is_generative(str(entry.package_dir))


def serves_generative(parts: Parts, name: str, entry: SlotEntry | None) -> bool:
    """Is `name` a generative model here: its slot entry is, or (no entry) the host serves it."""
    return is_generative_entry(entry) or (entry is None and name in parts.registry.generative.models)


def engine_spec(entry: SlotEntry) -> Any:
    """How the entry is served: its package's runtime and max_length, the selected row's precision."""
    from agent.generative.package import load_generative
    from agent.serving.generative.engine import EngineSpec

    pkg = load_generative(str(entry.package_dir))
    return EngineSpec(pkg.runtime, entry.precision, pkg.max_length)


def serve_generative(
    parts: Parts,
    name: str,
    entry: SlotEntry,
    keep_previous: bool = False,
    before_swap: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Verify the unpacked files, load `entry` beside what serves and swap it in (the swapped-out version kept as
    the referee when asked); {"mode", "load_s"}. before_swap(loaded model) runs between the load and the swap (the
    shadow: it raises to refuse the swap). A load or a before_swap that fails raises: what served before serves on."""
    note = repair.verify_unpacked(parts.store, parts.packages, entry)  # raises repair.Corrupt
    if note:
        parts.note(name, note)
    host = parts.registry.generative
    t0 = time.perf_counter()
    spec = engine_spec(entry)
    try:
        model = host.load(name, entry.version, Path(str(entry.model_path)), entry.provider, spec)
    except EdgeAgentError:
        raise
    except Exception as exc:  # the runtime's own error (og.Model, LLMPipeline): the deployment fails with it
        raise LifecycleError(f"{spec.runtime} could not load version {entry.version}: {exc}") from exc
    load_s = round(time.perf_counter() - t0, 4)
    if before_swap is not None:
        try:
            before_swap(model)
        except BaseException:
            host.let_go(model)
            raise
    host.swap(name, model, keep_previous=keep_previous)
    parts.unavailable.pop(name, None)
    return {"mode": "make-before-break", "why": "a generative version loads beside the serving one", "load_s": load_s}


def ensure_generative(parts: Parts, name: str, entry: SlotEntry | None) -> None:
    """Make the host serve the committed entry of `name` (the caller holds the model's lock): nothing when it
    does; the referee again when it is that version (a rollback without a load); else a load."""
    host = parts.registry.generative
    if entry is None:
        host.remove(name)  # a first deployment rolled back: nothing was committed
        return
    serving = host.models.get(name)
    if serving is not None and serving.version == entry.version and str(serving.model_dir) == entry.model_path:
        host.drop_referee(name)
        return
    if host.reinstate(name, entry.version):
        parts.unavailable.pop(name, None)
        return
    try:
        serve_generative(parts, name, entry)
    except EdgeAgentError as exc:
        parts.unavailable[name] = f"committed version {entry.version} cannot be served: {exc}"
