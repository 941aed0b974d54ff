"""What each lifecycle state does: fetch into the store, verify, activate (build + warm + swap), restore."""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import EdgeAgentError, LifecycleError, ModelError
from agent.serving import rungate
from agent.serving.labels import read_labels
from agent.util.atomic import fsync_dir
from agent.util.hashing import sha256_file
from agent.util.priority import run_lowered

if TYPE_CHECKING:
    from agent.artifacts.store import ContentStore
    from agent.providers.base import ProviderSession
    from agent.serving.registry import ModelRegistry

GZIP_MAGIC = b"\x1f\x8b"
WARM_RUNS = 3


class Cancelled(EdgeAgentError):
    """The step was cancelled (operator, rollback or a newer deployment); `event` says which."""

    def __init__(self, event: str, reason: str):
        super().__init__(reason)
        self.event = event


class DeadlineExceeded(EdgeAgentError):
    """The state's deadline passed."""


class Rejected(EdgeAgentError):
    """A manifest or package refused before any byte is downloaded."""


@dataclass
class StepContext:
    """Handed to every action: cancellation, deadline and progress for one state of one deployment."""

    deadline: float | None  # time.monotonic() value
    cancel: threading.Event = field(default_factory=threading.Event)
    cancel_event: str = "cancel"
    cancel_reason: str = "cancelled"
    progress: Callable[..., None] | None = None

    def check(self) -> None:
        """Raise Cancelled / DeadlineExceeded when the step must stop."""
        if self.cancel.is_set():
            raise Cancelled(self.cancel_event, self.cancel_reason)
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DeadlineExceeded("deadline passed")

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def report(self, event: str, **fields: Any) -> None:
        if self.progress is not None:
            self.progress(event, **fields)


def pack_dir(src: Path, dest: Path) -> None:
    """A deterministic .tar.gz of a package directory (sorted names, zeroed times and owners), fsynced."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for path in sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink()):
                    rel = path.relative_to(src).as_posix()
                    if any(part.startswith(".") for part in Path(rel).parts):
                        continue
                    info = tarfile.TarInfo(rel)
                    info.size, info.mtime, info.mode = path.stat().st_size, 0, 0o644
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
        raw.flush()
        os.fsync(raw.fileno())


def fetch_inbox(src: Path, store: ContentStore, staging: Path, ctx: StepContext) -> dict[str, Any]:
    """Local mode 'download': pack the inbox package into the content store."""
    if not src.is_dir():
        raise ModelError(f"inbox package {src} is gone or not a directory")
    if not (src / "model.onnx").is_file() and not list(src.glob("*.onnx")):
        raise ModelError(f"inbox package {src} has no model.onnx")
    ctx.report("pack", path=str(src))
    part = staging / f"inbox-{os.getpid()}-{threading.get_ident()}.tar.gz.part"
    try:
        pack_dir(src, part)
        ctx.check()
        size = part.stat().st_size
        sha = store.put_file(part)
    finally:
        part.unlink(missing_ok=True)
    return {"sha256": sha, "size": size}


def unpack(store: ContentStore, sha: str, packages_root: Path) -> Path:
    """packages/<sha>/ holding the package (extracted from a .tar.gz blob, or the bare model.onnx)."""
    final = packages_root / sha
    if final.is_dir():
        return final
    blob = Path(store.path(sha))
    tmp = packages_root / f".{sha}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with open(blob, "rb") as f:
            magic = f.read(2)
        if magic == GZIP_MAGIC:
            from agent.qualify.package import extract_archive

            root = extract_archive(blob, tmp)
            if root != tmp:  # archive with one top-level directory: flatten
                for child in root.iterdir():
                    os.replace(child, tmp / child.name)
        else:
            shutil.copyfile(blob, tmp / "model.onnx")
        for p in tmp.rglob("*"):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
        os.replace(tmp, final)
        fsync_dir(packages_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def verify(
    store: ContentStore,
    sha: str,
    packages_root: Path,
    ctx: StepContext,
    *,
    memory_max: int | None = None,
    before_check: Callable[[Path], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Re-hash the stored blob, unpack it (both streamed: a chunk at a time) and run the package checks
    (ONNX checker + shape inference) in a child process: the checker holds the whole model in memory, the
    daemon never does. before_check(root) -> dict: runs on the unpacked files before any of them is parsed
    (the model signature); what it returns is added to the result."""
    if not store.has(sha):
        raise LifecycleError(f"artifact {sha[:12]} is not in the store")
    actual = sha256_file(store.path(sha))
    if actual != sha:
        raise LifecycleError(f"artifact hash mismatch: expected {sha[:12]}, store holds {actual[:12]}")
    ctx.check()
    root = unpack(store, sha, packages_root)
    first = before_check(root) if before_check is not None else {}
    from agent.qualify.isolate import run_isolated

    left = ctx.remaining()
    res = run_isolated(
        "agent.lifecycle.actions:check_package",
        {"root": str(root)},
        timeout=600.0 if left is None else left + 5.0,
        tag="verify",
        check=ctx.check,
        memory_max=memory_max,
    )
    if not res.ok:
        why = res.error.removeprefix("ModelError: ")
        raise ModelError(why if res.kind == "exception" else f"package check: {why}")
    got: dict[str, Any] = {**res.value, **first}
    return got


def check_package(root: str) -> dict[str, Any]:
    """The child's side of verify(): load_package's checks; where the model is and its digest."""
    from agent.qualify.package import load_package

    pkg = load_package(root)
    return {"package_dir": str(root), "model_sha256": pkg.sha256, "model_path": str(pkg.model_path)}


def warm_feeds(session: ProviderSession, entry: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The inputs qualification used, in its order (golden first, then the declared opt and max shapes),
    rebuilt from the package (agent.qualify.inputs.plan_inputs: same seed, same model.yaml, same files) and cast
    to the served file's input types, as qualification casts them for a variant (agent.qualify.variants).
    Zero tensors at dynamic dims = 1 only for an entry without its package (a model qualified elsewhere)."""
    root = Path(entry["package_dir"]) if entry and entry.get("package_dir") else None
    if root is not None and root.is_dir():
        assert entry is not None  # root comes from entry["package_dir"]
        from agent.providers.base import TensorSpec
        from agent.qualify.inputs import plan_inputs
        from agent.qualify.package import golden_datasets, read_meta

        specs = [TensorSpec(s["name"], s["dtype"], tuple(s["shape"])) for s in entry.get("input_specs") or []]
        from agent.qualify.variants import adapt_feeds

        plan = plan_inputs(specs or list(session.inputs), list(session.outputs), read_meta(root), golden_datasets(root))
        served = {"inputs": [{"name": s.name, "dtype": s.dtype} for s in session.inputs]}
        if any(p.get("point") == "max" and not p.get("runs") for p in entry.get("latency_points") or []):
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
    entry: dict[str, Any], lock: threading.Lock | None = None, timings: dict[str, Any] | None = None
) -> ProviderSession:
    """Build the session a slot entry or a decision describes, and run it a few times before it serves.
    A compiled cache that fails its seal is emptied first (rebuilt, never loaded; agent.qualify.cacheseal).
    `timings` gets session_s (creation), first_answer_s (creation + the first warm-up run) and cache_rebuilt."""
    from agent.providers import get
    from agent.qualify import cacheseal

    model_path = entry.get("model_path") or str(Path(entry["package_dir"]) / "model.onnx")
    if not Path(model_path).is_file():
        raise ModelError(f"model file {model_path} is missing")
    sealed = cacheseal.problems(Path(model_path).parent) if entry.get("optimization") else []
    if sealed:  # an optimised graph lives in the cache, outside the verified package: its seal vouches for it
        raise ModelError(f"optimised graph {model_path} is not loaded: {sealed[0]}")
    provider = get(entry["provider"])
    before = rungate.native_tids()
    timings = {} if timings is None else timings
    note = cacheseal.verify_or_reset(entry.get("cache_dir"))
    if note:
        timings["cache_rebuilt"] = note
    t0 = time.perf_counter()
    with lock or _NullLock():  # session creation is not thread-safe in every ORT version
        session = provider.open_session(
            model_path,
            options=entry.get("options") or {},
            precision=entry.get("requested_precision"),
            device=entry.get("device"),
            cache_dir=entry.get("cache_dir"),
        )
    timings["session_s"] = round(time.perf_counter() - t0, 4)
    cacheseal.seal(entry.get("cache_dir"))
    try:
        sets = warm_feeds(session, entry)
        for i, feeds in enumerate(sets + [sets[0]] * max(0, WARM_RUNS - len(sets))):
            session.run(feeds)
            if i == 0:
                timings["first_answer_s"] = round(time.perf_counter() - t0, 4)
    except Exception as exc:
        session.close()
        raise LifecycleError(f"warm-up on {entry['provider']} failed: {exc}") from exc
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
    entry: dict[str, Any],
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
    meta = {k: entry.get(k) for k in ("sha256", "model_sha256", "provider", "precision", "deployment_id")}
    meta["_labels"] = read_labels(entry.get("package_dir"))  # classification extension (serving/labels.py)
    kwargs: dict[str, Any] = {"swap": swap} if swap else {}

    timings: dict[str, Any] = {}

    def build() -> ProviderSession:  # no run is measured for CPU time while a build's CPU would count (rungate.py)
        registry.gate.busy(True)
        try:
            return open_and_warm(entry, lock, timings)
        finally:
            registry.gate.busy(False)

    if swap == "stop-then-start":
        result = registry.activate(name, entry["version"], build, meta, **kwargs)
        return {**result, "build_priority": "serving priority (stop-then-start)", "timings": timings}
    session, how = run_lowered(build, build_nice)
    try:
        if before_swap is not None:
            before_swap(session)
        if keep_previous:
            kwargs["keep_previous"] = True
        return {
            **registry.activate(name, entry["version"], session, meta, **kwargs),
            "build_priority": how,
            "timings": timings,
        }
    except BaseException:
        rungate.disown(session)
        session.close()
        raise
