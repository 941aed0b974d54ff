"""Open, warm and swap a version in: shared by activation (a new deployment) and restore (start-up, failure,
rollback): the swap mode, a fresh compiled cache, build + warm-up, then the registry's atomic swap."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import LifecycleError, ModelError
from agent.lifecycle import genserve, repair
from agent.lifecycle.parts import Parts
from agent.lifecycle.slots import SlotEntry
from agent.package.labels import read_labels
from agent.serving import rungate
from agent.util.priority import run_lowered

if TYPE_CHECKING:
    from agent.providers.base import ProviderSession
    from agent.serving.registry import ModelRegistry

WARM_RUNS = 3


def warm_feeds(session: ProviderSession, entry: SlotEntry | None = None) -> list[dict[str, Any]]:
    """The inputs qualification used, in its order (golden first, then the declared opt and max shapes),
    rebuilt from the package (agent.package.inputs.plan_inputs: same seed, same model.yaml, same files) and cast
    to the served file's input types, as qualification casts them for a variant (agent.package.variants).
    Zero tensors at dynamic dims = 1 only for an entry without its package (a model qualified elsewhere)."""
    root = Path(entry.package_dir) if entry and entry.package_dir else None
    if root is not None and root.is_dir():
        assert entry is not None  # root comes from entry.package_dir
        from agent.package.inputs import plan_inputs
        from agent.package.load import golden_datasets, read_meta
        from agent.providers.base import TensorSpec

        specs = [TensorSpec(s["name"], s["dtype"], tuple(s["shape"])) for s in entry.input_specs or []]
        from agent.package.variants import adapt_feeds

        plan = plan_inputs(specs or list(session.inputs), list(session.outputs), read_meta(root), golden_datasets(root))
        served = {"inputs": [{"name": s.name, "dtype": s.dtype} for s in session.inputs]}
        if any(p.get("point") == "max" and not p.get("runs") for p in entry.latency_points or []):
            plan.at_max = None  # qualification did not run it (over the row's time or memory): nor does warm-up
        return [adapt_feeds(f, served) for f in plan.warm_sets()]  # a variant gets them in its own input types
    return [_zeros(session)]


def _zeros(session: ProviderSession) -> dict[str, Any]:
    import numpy as np

    feeds = {}
    for spec in session.inputs:
        shape = [d if isinstance(d, int) and d >= 0 else 1 for d in spec.shape]
        dtype = np.dtype(spec.dtype) if spec.dtype not in ("str", "string", "bytes") else np.dtype(object)
        feeds[spec.name] = np.zeros(shape, dtype=dtype) if dtype.kind != "O" else np.full(shape, "", dtype=object)
    return feeds


def open_and_warm(
    entry: SlotEntry, lock: threading.Lock | None = None, timings: dict[str, Any] | None = None
) -> ProviderSession:
    """Build the session a slot entry or a decision describes, and run it a few times before it serves.
    A compiled cache that fails its seal is emptied first (rebuilt, never loaded; agent.package.cacheseal).
    `timings` gets session_s (creation), first_answer_s (creation + the first warm-up run) and cache_rebuilt."""
    from agent.package import cacheseal
    from agent.providers import get

    model_path = entry.model_path or str(Path(entry.package_dir or "") / "model.onnx")
    if not Path(model_path).is_file():
        raise ModelError(f"model file {model_path} is missing")
    sealed = cacheseal.problems(Path(model_path).parent) if entry.optimization else []
    if sealed:  # an optimised graph lives in the cache, outside the verified package: its seal vouches for it
        raise ModelError(f"optimised graph {model_path} is not loaded: {sealed[0]}")
    provider = get(entry.provider)
    before = rungate.native_tids()
    timings = {} if timings is None else timings
    note = cacheseal.verify_or_reset(entry.cache_dir)
    if note:
        timings["cache_rebuilt"] = note
    t0 = time.perf_counter()
    with lock or _NullLock():  # session creation is not thread-safe in every ORT version
        session = provider.open_session(
            model_path,
            options=entry.options or {},
            precision=entry.requested_precision,
            device=entry.device,
            cache_dir=entry.cache_dir,
        )
    timings["session_s"] = round(time.perf_counter() - t0, 4)
    cacheseal.seal(entry.cache_dir)
    try:
        sets = warm_feeds(session, entry)
        for i, feeds in enumerate(sets + [sets[0]] * max(0, WARM_RUNS - len(sets))):
            session.run(feeds)
            if i == 0:
                timings["first_answer_s"] = round(time.perf_counter() - t0, 4)
    except Exception as exc:
        session.close()
        raise LifecycleError(f"warm-up on {entry.provider} failed: {exc}") from exc
    rungate.claim(session, before)  # the pool threads its build and warm-up started are its own (CPU time)
    return session


class _NullLock:
    def __enter__(self) -> _NullLock:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def activate(
    registry: ModelRegistry,
    name: str,
    entry: SlotEntry,
    *,
    swap: str | None = None,
    lock: threading.Lock | None = None,
    build_nice: int = 0,
    before_swap: Callable[[Any], None] | None = None,
    keep_previous: bool = False,
) -> dict[str, Any]:
    """Make-before-break (or the target's stop-then-start): build + warm, then swap atomically.
    Make-before-break builds `build_nice` levels below serving (the old version serves meanwhile), then runs
    before_swap(session) (the shadow phase; raising stops the deployment) and keeps the old session as the
    referee when asked; stop-then-start builds at serving priority (nothing serves the model meanwhile)."""
    meta = {k: getattr(entry, k) for k in ("sha256", "model_sha256", "provider", "precision", "deployment_id")}
    meta["_labels"] = read_labels(entry.package_dir)  # classification extension (package/labels.py)
    kwargs: dict[str, Any] = {"swap": swap} if swap else {}

    timings: dict[str, Any] = {}

    def build() -> ProviderSession:  # no run is measured for CPU time while a build's CPU would count (rungate.py)
        registry.gate.busy(True)
        try:
            return open_and_warm(entry, lock, timings)
        finally:
            registry.gate.busy(False)

    if swap == "stop-then-start":
        result = registry.activate(name, entry.version, build, meta, **kwargs)
        return {**result, "build_priority": "serving priority (stop-then-start)", "timings": timings}
    session, how = run_lowered(build, build_nice)
    try:
        if before_swap is not None:
            before_swap(session)
        if keep_previous:
            kwargs["keep_previous"] = True
        return {
            **registry.activate(name, entry.version, session, meta, **kwargs),
            "build_priority": how,
            "timings": timings,
        }
    except BaseException:
        rungate.disown(session)
        session.close()
        raise


def swap_mode(parts: Parts, entry: SlotEntry) -> tuple[str, str]:
    """make-before-break or stop-then-start for this activation: forced by config, else the target's rule
    (`swap_when_memory_short`) against MemAvailable and the model's peak measured by qualification (its size on
    disk when not measured)."""
    from agent.serving.memory import choose_swap, mem_available

    if parts.config.swap:
        return parts.config.swap, f"{parts.config.swap} (set by configuration)"
    peak = entry.memory_peak_bytes  # measured by qualification (session, warm-up, timed runs)
    if peak:
        return choose_swap(parts.config.serving, int(peak), mem_available(), "measured peak")
    return choose_swap(parts.config.serving, _model_bytes(entry), mem_available(), "size on disk")


def serve(
    parts: Parts,
    name: str,
    entry: SlotEntry,
    swap: str | None = None,
    nice: int = 0,
    before_swap: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Build, warm and swap in `entry`. New versions build `nice` levels below serving; restores and
    rollbacks build at serving priority (getting back to a good model comes first). A generative entry loads
    beside what serves instead (genserve.py; an operator's rollback to one comes here)."""
    if genserve.is_generative_entry(entry):
        return genserve.serve_generative(parts, name, entry)
    note = repair.verify_unpacked(parts.store, parts.packages, entry)  # raises repair.Corrupt
    if note:
        parts.note(name, note)
    if swap is None:
        swap = swap_mode(parts, entry)[0]
    keep = before_swap is not None and parts.config.trial.referee
    result: dict[str, Any] = activate(
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


def _fresh_cache(parts: Parts, entry: SlotEntry) -> SlotEntry:
    """A runtime upgrade since qualification changes the cache key: never load a stale compiled blob."""
    from agent.package import caches

    stored = entry.versions or {}
    if not entry.cache_dir or not entry.model_sha256:
        return entry
    current = caches.runtime_versions(parts.profile)
    if all(stored.get(k) == v for k, v in current.items()):
        return entry
    versions = {**stored, **current}
    fresh = caches.cache_dir_for(parts.state_dir / "cache", entry.model_sha256, entry.provider, versions)
    return entry.with_(cache_dir=str(fresh), versions=versions)


def _model_bytes(entry: SlotEntry) -> int:
    """What a session of this model needs at least: the size of its files (weights dominate)."""
    path = entry.model_path
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
