"""The model registry: which session serves each model, atomic hot swap with drain, validated infer, stats."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.serving import rungate
from agent.serving.errors import InferenceFailed, InvalidInput, ModelNotFound, ModelUnavailable
from agent.serving.memory import trim_heap
from agent.serving.metrics import FINITE_EVERY, ModelStats
from agent.serving.rungate import CpuMark, RunGate

MAKE_BEFORE_BREAK = "make-before-break"
STOP_THEN_START = "stop-then-start"
SWAP_MODES = (MAKE_BEFORE_BREAK, STOP_THEN_START)
STATS_VERSIONS_KEPT = 8  # per model; older versions' counters are dropped from /metrics


@dataclass(eq=False)
class ModelEntry:
    """One loaded (model, version): its session, metadata and in-flight count."""

    name: str
    version: str
    session: Any  # agent.providers.base.ProviderSession
    meta: dict
    stats: ModelStats
    checks: tuple = ()  # per input: (name, dtype, rank, ((axis, size) of static dims), full shape or None if dynamic)
    output_names: tuple[str, ...] = ()
    holds: deque = field(default_factory=deque)  # one item per request in flight (append/pop are atomic)
    shadow: Any = None  # a Shadow (agent.trial.shadow) offered copies of this entry's requests, or None
    retired: bool = False
    close_when_idle: bool = False
    closed: bool = False
    close_error: str | None = field(default=None, repr=False)

    @property
    def inputs(self) -> list:
        return list(self.session.inputs) if self.session is not None else []

    @property
    def outputs(self) -> list:
        return list(self.session.outputs) if self.session is not None else []

    def close(self) -> None:
        """Release the session once (idempotent); remember a failing close instead of raising."""
        if self.closed:
            return
        self.closed = True
        session, self.session = self.session, None
        rungate.disown(session)
        try:
            session.close()
        except Exception as exc:  # noqa: BLE001 - a failing close must not break a swap
            self.close_error = f"{type(exc).__name__}: {exc}"
        del session
        trim_heap()


def _dim(d: Any) -> int | None:
    return d if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else None


def _np_dtype(name: str) -> Any:
    try:
        return np.dtype(name)
    except TypeError:  # e.g. bfloat16 without ml_dtypes imported: compare by name
        return name


def _checks(session: Any) -> tuple:
    """Per input: (name, numpy dtype, rank, ((axis, size) for static dims), the whole shape when every dim is
    static else None), precomputed for the hot path."""
    try:
        specs = list(session.inputs)
        outs = tuple(o.name for o in session.outputs)
    except AttributeError as exc:
        raise InvalidInput(f"not a ProviderSession (no inputs/outputs): {exc}") from None
    checks = []
    for spec in specs:
        dims = tuple(_dim(d) for d in spec.shape)
        dtype = "object" if spec.dtype in ("str", "string", "bytes") else spec.dtype
        static = tuple((i, d) for i, d in enumerate(dims) if d is not None)
        checks.append((spec.name, _np_dtype(dtype), len(dims), static, dims if None not in dims else None))
    return tuple(checks), outs


def _validate(entry: ModelEntry, feeds: Any) -> None:
    """Reject feeds whose names, dtypes or shapes do not match the session's TensorSpecs (hot path: lean)."""
    if type(feeds) is dict and len(feeds) == len(entry.checks):
        for name, dtype, rank, static, full in entry.checks:  # fast path: exact dtype object, all static dims equal
            arr = feeds.get(name)
            if type(arr) is not np.ndarray or arr.dtype is not dtype:
                break
            if full is not None:  # every dimension static: one tuple comparison
                if arr.shape != full:
                    break
                continue
            if len(arr.shape) != rank:
                break
            for i, size in static:
                if arr.shape[i] != size:
                    break
            else:
                continue
            break
        else:
            return
    _validate_slow(entry, feeds)


def _validate_slow(entry: ModelEntry, feeds: Any) -> None:
    if not isinstance(feeds, dict):
        raise InvalidInput("feeds must be a mapping of input name to array")
    if len(feeds) != len(entry.checks):
        _names_error(entry, feeds)
    for name, dtype, rank, static, _ in entry.checks:
        arr = feeds.get(name)
        if arr is None:
            _names_error(entry, feeds)
        if not isinstance(arr, np.ndarray):
            raise InvalidInput(f"input {name!r}: expected a numpy array, got {type(arr).__name__}")
        if arr.dtype != dtype and arr.dtype.name != dtype:
            raise InvalidInput(f"input {name!r}: datatype {_oip(arr.dtype)} does not match the model's {_oip(dtype)}")
        shape = arr.shape
        if len(shape) != rank or any(shape[i] != size for i, size in static):
            _shape_error(entry, name, shape)


def _oip(dtype: Any) -> str:
    """The OIP datatype name of a dtype for messages ("FP64", not "float64")."""
    from agent.serving.codec import datatype_of

    try:
        return datatype_of(dtype if isinstance(dtype, str) else np.dtype(dtype))
    except Exception:  # noqa: BLE001 - a message must not fail
        return str(dtype)


def _names_error(entry: ModelEntry, feeds: dict) -> None:
    want = sorted(c[0] for c in entry.checks)
    extra = sorted(set(feeds) - set(want))
    missing = sorted(set(want) - set(feeds))
    what = f"unknown input(s) {extra}" if extra else f"missing input(s) {missing}"
    raise InvalidInput(f"model {entry.name!r}: {what}; expected {want}")


def _shape_error(entry: ModelEntry, name: str, shape: tuple) -> None:
    spec = next(s for s in entry.inputs if s.name == name)
    want = ["?" if _dim(d) is None else d for d in spec.shape]
    raise InvalidInput(f"input {name!r}: shape {list(shape)} does not match the model's {want}")


_DOT_KINDS = (np.dtype(np.float32), np.dtype(np.float64))
_DOT_MAX = 10_000  # OpenBLAS runs dot single-threaded up to here: no pool wake-ups on the serving path


def _nonfinite(outputs: dict) -> bool:
    """Any NaN/Inf in a float output? Small f32/f64 outputs first try one BLAS dot product (v.v is finite
    when every element is; measured 3x cheaper than isfinite().all() right after a run, when caches are
    cold); a non-finite dot (NaN/Inf, or overflow of large finite values) is settled by the exact check."""
    for v in outputs.values():
        if type(v) is not np.ndarray or v.dtype.kind != "f" or not v.size:
            continue
        if v.dtype in _DOT_KINDS and v.size <= _DOT_MAX and math.isfinite(np.vdot(v, v)):
            continue
        if not np.isfinite(v).all():
            return True
    return False


def _invalid_text(feeds: dict) -> str | None:
    """The first string element that is not valid UTF-8 text (a lone surrogate, undecodable bytes), if any."""
    for name, v in feeds.items():
        if type(v) is not np.ndarray or v.dtype.kind != "O":
            continue
        for i, item in enumerate(v.flat):
            try:
                if isinstance(item, str):
                    item.encode("utf-8")
                elif isinstance(item, bytes):
                    item.decode("utf-8")
            except UnicodeError:
                return f"input {name!r} element {i} is not valid UTF-8 text"
    return None


class ModelRegistry:
    """Serves several models at once; activate() hot-swaps one without failing in-flight or new requests."""

    def __init__(
        self,
        *,
        drain_timeout: float = 30.0,
        check_finite: bool = True,
        finite_every: int = FINITE_EVERY,
        gate: RunGate | None = None,
    ) -> None:
        """check_finite: look for NaN/Inf in outputs: every response while a probation watches a version and
        for its first FINITE_FIRST responses, then one in `finite_every` (1: every response)."""
        if int(finite_every) < 1:
            raise InvalidInput(f"finite_every must be at least 1, got {finite_every}")
        self.drain_timeout = drain_timeout
        self.check_finite = check_finite
        self.finite_every = int(finite_every)
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._activating = threading.Lock()
        self._entries: dict[str, ModelEntry] = {}
        self._loading: set[str] = set()  # names in a stop-then-start gap
        self._stats: dict[str, dict[str, ModelStats]] = {}
        # The swapped-out incumbent kept during a probation (activate(keep_previous=True)): inputs that fail or
        # give NaN/Inf on the new version are re-run on it to tell the request's fault from the version's.
        self._referees: dict[str, ModelEntry] = {}
        # Every run of a session this registry serves passes the gate; a CPU-time sample is a run that had the
        # runtimes to itself (rungate.py). Shadow runs and session builds pass it too (Shadow, actions.activate).
        # The daemon serves through one registry, so its gate sees every run of the process.
        self.gate = gate or RunGate()

    # ---- activation -------------------------------------------------------------------------------
    def activate(
        self,
        name: str,
        version: Any,
        session: Any,
        meta: dict | None = None,
        *,
        swap: str = MAKE_BEFORE_BREAK,
        drain_timeout: float | None = None,
        progress: Callable[..., None] | None = None,
        keep_previous: bool = False,
    ) -> dict:
        """Serve `session` as `name`/`version`. keep_previous (make-before-break): the old version stops
        serving but its session stays open as the referee until drop_referee(name). `session` may be a zero-argument factory; with
        stop-then-start the old session is drained and closed before the factory runs.
        Returns {"model", "version", "swap", "previous", "drained", "drain_s", "close_error"};
        progress(event, **fields) hears "building", "swapped" and "released"."""
        report = progress or (lambda event, **fields: None)
        if swap not in SWAP_MODES:
            raise InvalidInput(f"unknown swap mode {swap!r}; expected one of {', '.join(SWAP_MODES)}")
        version = str(version)
        timeout = self.drain_timeout if drain_timeout is None else drain_timeout
        with self._activating:
            self.drop_referee(name, timeout)
            old_info = self._stop(name, timeout, report) if swap == STOP_THEN_START else {}
            entry = self._build(name, version, session, meta, report)
            keep = keep_previous and swap == MAKE_BEFORE_BREAK
            with self._lock:
                old = self._entries.get(name)
                self._entries[name] = entry
                self._loading.discard(name)
                if old is not None and keep:
                    old.retired, old.shadow = True, None  # no new holds; in-flight ones finish on it
                    self._referees[name] = old
            report("swapped", model=name, version=version, previous=old.version if old else None)
            if old is not None and keep:
                old_info = {"previous": old.version, "drained": True, "drain_s": 0.0, "referee": True}
            elif old is not None:
                old_info = self._release_old(old, timeout, report)
        return {
            "model": name,
            "version": version,
            "swap": swap,
            "previous": None,
            "drained": True,
            "drain_s": 0.0,
            "close_error": None,
            **old_info,
        }

    def _stop(self, name: str, timeout: float, report: Callable[..., None]) -> dict:
        """Stop-then-start, first half: unpublish, drain and close the old session; requests get 503 meanwhile."""
        with self._lock:
            old = self._entries.pop(name, None)
            self._loading.add(name)
        return self._release_old(old, timeout, report) if old else {}

    def _build(
        self, name: str, version: str, session: Any, meta: dict | None, report: Callable[..., None]
    ) -> ModelEntry:
        try:
            if not hasattr(session, "run") and callable(session):
                report("building", model=name, version=version)
                session = session()
            return self._entry(name, version, session, meta)
        except BaseException:
            with self._lock:
                self._loading.discard(name)
            raise

    def _release_old(self, old: ModelEntry, timeout: float, report: Callable[..., None]) -> dict:
        info = self._retire(old, timeout)
        report("released", model=old.name, version=old.version, drained=info["drained"])
        return info

    def drop_referee(self, name: str, drain_timeout: float | None = None) -> bool:
        """Close the referee of `name` (kept by activate(keep_previous=True)); False when there is none."""
        with self._lock:
            ref = self._referees.pop(name, None)
        if ref is None:
            return False
        self._retire(ref, self.drain_timeout if drain_timeout is None else drain_timeout)
        return True

    def reinstate_referee(self, name: str, version: Any, drain_timeout: float | None = None) -> dict | None:
        """Roll back without a build: serve the referee of `name` again when it is `version` (the version that
        serves is swapped out and drained, as in activate); None when there is no such referee."""
        timeout = self.drain_timeout if drain_timeout is None else drain_timeout
        with self._activating:
            with self._lock:
                ref = self._referees.get(name)
                if ref is None or ref.version != str(version) or ref.session is None:
                    return None
                del self._referees[name]
                old = self._entries.get(name)
                ref.retired, ref.shadow = False, None
                self._entries[name] = ref
                self._loading.discard(name)
            info = self._retire(old, timeout) if old is not None else {}
        return {"model": name, "version": ref.version, "swap": "referee", **info}

    def referee(self, name: str) -> str | None:
        """The version kept as the referee of `name`, if any."""
        with self._lock:
            ref = self._referees.get(name)
        return ref.version if ref is not None else None

    def attach_shadow(self, name: str, shadow: Any) -> str:
        """Offer copies of the serving version's requests to `shadow` (None: stop); returns that version."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                raise ModelNotFound(f"model {name!r} is not loaded")
            entry.shadow = shadow
            return entry.version

    def deactivate(self, name: str, drain_timeout: float | None = None) -> dict:
        """Stop serving `name`: new requests get ModelNotFound, in-flight ones finish, the session is closed."""
        self.drop_referee(name, drain_timeout)
        with self._activating:
            with self._lock:
                old = self._entries.pop(name, None)
            if old is None:
                raise ModelNotFound(f"model {name!r} is not loaded")
            return {"model": name, **self._retire(old, self.drain_timeout if drain_timeout is None else drain_timeout)}

    def close(self, drain_timeout: float | None = None) -> None:
        """Deactivate every model."""
        for name in list(self._referees):
            self.drop_referee(name, drain_timeout)
        for name in self.models():
            try:
                self.deactivate(name, drain_timeout)
            except ModelNotFound:
                pass

    def _entry(self, name: str, version: str, session: Any, meta: dict | None) -> ModelEntry:
        checks, outs = _checks(session)
        with self._lock:
            per = self._stats.setdefault(name, {})
            stats = per.pop(version, None) or ModelStats(name, version)
            stats.finite_every = self.finite_every
            per[version] = stats  # most recent last
            serving = self._entries.get(name)
            while len(per) > STATS_VERSIONS_KEPT:
                oldest = next(v for v in per if serving is None or v != serving.version)
                del per[oldest]
        return ModelEntry(name, version, session, dict(meta or {}), stats, checks, outs)

    def _retire(self, entry: ModelEntry, timeout: float) -> dict:
        """Wait (up to timeout) for the requests holding a swapped-out entry, then close its session; past the
        timeout the last request out closes it. Pairs with the lock-free hold in infer(): `retired` is set
        before `holds` is read here, and a request reads `retired` after adding its hold, so either this wait
        sees the hold or the request sees `retired` and lets go before touching the session."""
        t0 = time.monotonic()
        with self._lock:
            entry.retired = True
            drained = self._drained.wait_for(lambda: not entry.holds, timeout)
            if not drained:
                entry.close_when_idle = True  # the last request out closes it
        if drained:
            entry.close()
        return {
            "previous": entry.version,
            "drained": drained,
            "drain_s": round(time.monotonic() - t0, 6),
            "close_error": entry.close_error,
        }

    # ---- serving ----------------------------------------------------------------------------------
    def _acquire(self, name: str, version: Any) -> ModelEntry:
        """Hold the serving entry of name (and version), or raise ModelNotFound / ModelUnavailable (locked path;
        an entry in the table is never retired while the lock is held)."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                if name in self._loading:
                    raise ModelUnavailable(f"model {name!r} is loading a new version; retry shortly")
                raise ModelNotFound(f"model {name!r} is not loaded")
            if version is not None and str(version) != entry.version:
                raise ModelNotFound(
                    f"model {name!r} version {version!s} is not loaded (serving version {entry.version})"
                )
            entry.holds.append(None)
            return entry

    def _hold(self, name: str, version: Any) -> ModelEntry:
        """Hold the serving entry without the lock (every request does this): add the hold, then check that the
        entry was not retired meanwhile (see _retire); if it was, let go and take the locked path."""
        entry = self._entries.get(name)
        if entry is None or (version is not None and str(version) != entry.version):
            return self._acquire(name, version)
        entry.holds.append(None)
        if entry.retired:
            self._let_go(entry)
            return self._acquire(name, version)
        return entry

    def _let_go(self, entry: ModelEntry) -> None:
        entry.holds.pop()
        if not entry.retired:
            return
        with self._lock:  # a swapped-out entry: its retirement waits for the last hold
            if entry.holds:
                return
            self._drained.notify_all()
            close, entry.close_when_idle = entry.close_when_idle, False  # one closer only
        if close:
            entry.close()

    def _release(
        self,
        entry: ModelEntry,
        elapsed: float | None = None,
        ok: bool = True,
        nonfinite: bool | None = None,
        end: float = 0.0,
        caused: bool = False,
        cpu: float | None = None,
        contended: bool = False,
    ) -> None:
        """The request is done with the entry. Its accounting, when it reached the runtime: a plain success is
        appended lock-free (ModelStats.add); errors and sampled requests are recorded under the stats' lock."""
        if elapsed is not None:
            if ok and nonfinite is None and cpu is None and not contended:
                entry.stats.add(elapsed, end)  # the common case: no lock
            else:
                entry.stats.record(elapsed, ok, nonfinite, end, caused, cpu, contended)
        self._let_go(entry)

    def infer(self, name: str, feeds: dict, version: Any = None, outputs: list[str] | None = None) -> tuple[str, dict]:
        """Run one request on the serving version; returns (version, outputs by name).
        Raises ModelNotFound/InvalidInput before the runtime sees bad input, InferenceFailed if the runtime fails."""
        entry = self._hold(name, version)
        elapsed, ok, nonfinite, end, caused, cpu, contended = None, False, None, 0.0, False, None, False
        try:
            try:
                _validate(entry, feeds)
                if outputs is not None:
                    unknown = [o for o in outputs if o not in entry.output_names]
                    if unknown:
                        raise InvalidInput(
                            f"model {name!r} has no output(s) {unknown}; outputs: {list(entry.output_names)}"
                        )
            except InvalidInput:
                entry.stats.reject()
                raise
            want = list(outputs) if outputs is not None else None
            sampled = entry.stats.check_finite()  # checked for NaN/Inf; its CPU time measured when the gate allows
            alone = self.gate.begin(sampled)  # alone: no other run in flight, the runtimes' CPU time is this run's
            mark = CpuMark(entry.session) if alone else None
            t0 = time.perf_counter()
            failure: Exception | None = None
            try:
                result = entry.session.run(feeds, want)
                end = time.perf_counter()
                spent = mark.spent() if mark is not None else None
            except Exception as exc:  # the runtime's own failure, after validation passed
                end, failure, spent = time.perf_counter(), exc, None
            finally:  # before any referee run: that one enters the gate itself
                if self.gate.end(alone, mark):  # none beside it, not kept off the cores
                    cpu = spent
                elif mark is not None:
                    contended = mark.contended  # measured, and dropped (counted per version)
            elapsed = end - t0
            if failure is not None:
                why = self._request_fault(entry, feeds, want)
                caused = why is not None
                if why is not None and why.startswith("input"):
                    raise InvalidInput(f"model {name!r}: {why}") from failure
                tail = f" ({why}; not counted against the version)" if why else ""
                raise InferenceFailed(f"model {name!r} version {entry.version}: {failure}{tail}") from failure
            ok = True
            if sampled and self.check_finite:
                nonfinite = _nonfinite(result)
                if nonfinite:
                    caused = self._request_made_nonfinite(entry, feeds, want)
            shadow = entry.shadow
            if shadow is not None:
                shadow.offer(feeds, result, elapsed, cpu)
            return entry.version, result
        finally:
            self._release(entry, elapsed, ok, nonfinite, end, caused, cpu, contended)

    # ---- blame: the request's fault or the version's (failure paths only) --------------------------------
    def _request_fault(self, entry: ModelEntry, feeds: dict, want: list[str] | None) -> str | None:
        """Why the runtime's failure on `feeds` is the request's doing, or None (the version is to blame)."""
        text = _invalid_text(feeds)
        if text:
            return text
        if _nonfinite(feeds):
            return "its input holds NaN/Inf"
        ran = self._referee_run(entry, feeds, want)
        if ran is not None and not ran[0]:
            return f"version {ran[1]} fails on the same input"
        return None

    def _request_made_nonfinite(self, entry: ModelEntry, feeds: dict, want: list[str] | None) -> bool:
        """A NaN/Inf output is the request's doing when its input holds NaN/Inf, unless the referee (the
        incumbent) answers the same input with finite values."""
        if not _nonfinite(feeds):
            return False
        ran = self._referee_run(entry, feeds, want)
        return ran is None or not ran[0] or _nonfinite(ran[2])

    def _referee_run(self, entry: ModelEntry, feeds: dict, want: list[str] | None) -> tuple[bool, str, dict] | None:
        """(succeeded, referee version, outputs) of the same request on the referee; None without one."""
        with self._lock:
            ref = self._referees.get(entry.name)
            if ref is None or ref is entry or ref.session is None:
                return None
            ref.holds.append(None)  # drop_referee waits for this hold before closing the session
        try:
            self.gate.begin()
            try:
                return True, ref.version, ref.session.run(feeds, want)
            finally:
                self.gate.end(False)
        except Exception:  # noqa: BLE001 - the referee failing too is the answer
            return False, ref.version, {}
        finally:
            self._let_go(ref)

    # ---- introspection ----------------------------------------------------------------------------
    def entry(self, name: str, version: Any = None) -> ModelEntry:
        """The serving entry (for metadata); ModelNotFound/ModelUnavailable like infer."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None and name in self._loading:
                raise ModelUnavailable(f"model {name!r} is loading a new version; retry shortly")
        if entry is None:
            raise ModelNotFound(f"model {name!r} is not loaded")
        if version is not None and str(version) != entry.version:
            raise ModelNotFound(f"model {name!r} version {version!s} is not loaded (serving version {entry.version})")
        return entry

    def models(self) -> dict[str, str]:
        """Model name -> serving version."""
        with self._lock:
            return {n: e.version for n, e in self._entries.items()}

    def ready(self, name: str | None = None, version: Any = None) -> bool:
        """One model (and version) serving; with no name: no model is in a stop-then-start gap."""
        with self._lock:
            if name is None:
                return not self._loading
            entry = self._entries.get(name)
        return entry is not None and (version is None or str(version) == entry.version)

    def stats(self, name: str, version: Any = None) -> dict:
        """Counters and p50/p90/p99 of the serving version (or of `version` if it has been served)."""
        with self._lock:
            per = self._stats.get(name, {})
            entry = self._entries.get(name)
            v = str(version) if version is not None else (entry.version if entry else None)
            stats = per.get(v) if v is not None else None
        if stats is None:
            raise ModelNotFound(
                f"no statistics for model {name!r}" + (f" version {version}" if version is not None else "")
            )
        return stats.snapshot()

    def model_stats(self, name: str, version: Any) -> ModelStats:
        """The live ModelStats object of one (model, version) (probation reads it)."""
        with self._lock:
            stats = self._stats.get(name, {}).get(str(version))
        if stats is None:
            raise ModelNotFound(f"model {name!r} version {version} has never been activated")
        return stats

    def all_stats(self) -> list[ModelStats]:
        with self._lock:
            return [s for per in self._stats.values() for s in per.values()]
