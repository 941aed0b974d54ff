"""The model registry: which session serves each model, atomic hot swap with drain, validated infer, stats."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from agent.serving.entry import ModelEntry, checks_of
from agent.serving.errors import InvalidInput, ModelNotFound, ModelUnavailable
from agent.serving.generative.host import GenerativeHost
from agent.serving.metrics import FINITE_EVERY, ModelStats
from agent.serving.run import Observer, Run
from agent.serving.rungate import RunGate
from agent.serving.statsbook import StatsBook

MAKE_BEFORE_BREAK = "make-before-break"
STOP_THEN_START = "stop-then-start"
SWAP_MODES = (MAKE_BEFORE_BREAK, STOP_THEN_START)


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
        self._stats = StatsBook(self.finite_every)
        # The swapped-out incumbent kept during a probation (activate(keep_previous=True)): inputs that fail or
        # give NaN/Inf on the new version are re-run on it to tell the request's fault from the version's.
        self._referees: dict[str, ModelEntry] = {}
        # Every run of a session this registry serves passes the gate; a CPU-time sample is a run that had the
        # runtimes to itself (rungate.py). Trial runs (shadow, pairs) and session builds pass it too.
        # The daemon serves through one registry, so its gate sees every run of the process.
        self.gate = gate or RunGate()
        # the generative models (agent.serving.generative.host): deployed by the lifecycle, routed by the fronts
        self.generative = GenerativeHost()

    # ---- activation -------------------------------------------------------------------------------
    def activate(
        self,
        name: str,
        version: Any,
        session: Any,
        meta: dict[str, Any] | None = None,
        *,
        swap: str = MAKE_BEFORE_BREAK,
        drain_timeout: float | None = None,
        progress: Callable[..., None] | None = None,
        keep_previous: bool = False,
    ) -> dict[str, Any]:
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
                    old.retired, old.observers = True, ()  # no new holds; in-flight ones finish on it
                    self._referees[name] = old
            report("swapped", model=name, version=version, previous=old.version if old else None)
            if old is not None and keep:
                old_info = {"previous": old.version, "drained": True, "drain_s": 0.0, "referee": True}
            elif old is not None:
                old_info = self._release_old(old, timeout, report)
        done = {"model": name, "version": version, "swap": swap, "previous": None, "drained": True, "drain_s": 0.0}
        return {**done, "close_error": None, **old_info}

    def _stop(self, name: str, timeout: float, report: Callable[..., None]) -> dict[str, Any]:
        """Stop-then-start, first half: unpublish, drain and close the old session; requests get 503 meanwhile."""
        with self._lock:
            old = self._entries.pop(name, None)
            self._loading.add(name)
        return self._release_old(old, timeout, report) if old else {}

    def _build(
        self, name: str, version: str, session: Any, meta: dict[str, Any] | None, report: Callable[..., None]
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

    def _release_old(self, old: ModelEntry, timeout: float, report: Callable[..., None]) -> dict[str, Any]:
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

    def reinstate_referee(self, name: str, version: Any, drain_timeout: float | None = None) -> dict[str, Any] | None:
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
                ref.retired, ref.observers = False, ()
                self._entries[name] = ref
                self._loading.discard(name)
            info = self._retire(old, timeout) if old is not None else {}
        return {"model": name, "version": ref.version, "swap": "referee", **info}

    def referee(self, name: str) -> str | None:
        """The version kept as the referee of `name`, if any."""
        with self._lock:
            ref = self._referees.get(name)
        return ref.version if ref is not None else None

    def observe(self, name: str, observer: Observer, on: bool = True) -> str:
        """Offer each successful run of the serving version of `name` to `observer` (on), or stop (off); returns
        that version. A swap or rollback drops the observers of the version it swaps out."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                raise ModelNotFound(f"model {name!r} is not loaded")
            kept = tuple(o for o in entry.observers if o is not observer)
            entry.observers = (*kept, observer) if on else kept
            return entry.version

    def referee_session(self, name: str) -> tuple[str, Any] | None:
        """(version, session) of the referee of `name` (the incumbent kept through a probation), or None. The
        caller runs it only while the probation holds it (drop_referee and the rollback come after)."""
        with self._lock:
            ref = self._referees.get(name)
            return None if ref is None or ref.session is None else (ref.version, ref.session)

    def deactivate(self, name: str, drain_timeout: float | None = None) -> dict[str, Any]:
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

    def _entry(self, name: str, version: str, session: Any, meta: dict[str, Any] | None) -> ModelEntry:
        checks, outs = checks_of(session)
        with self._lock:
            serving = self._entries.get(name)
        stats = self._stats.open(name, version, serving.version if serving is not None else None)
        return ModelEntry(name, version, session, dict(meta or {}), stats, checks, outs)

    def _retire(self, entry: ModelEntry, timeout: float) -> dict[str, Any]:
        """Wait (up to timeout) for the requests holding a swapped-out entry, then close its session; past the
        timeout the last request out closes it. Pairs with the lock-free hold in hold(): `retired` is set
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
            self.let_go(entry)
            return self._acquire(name, version)
        return entry

    def let_go(self, entry: ModelEntry) -> None:
        """A hold on `entry` ends (Run.end, referee runs)."""
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

    def hold(self, name: str, version: Any = None) -> Run:
        """One inference on the serving version of `name` (and `version`): a Run that checks, gates, times,
        records and ends it (run.py); ModelNotFound / ModelUnavailable when there is none to hold."""
        return Run(self, self._hold(name, version), self.gate, self.check_finite)

    def infer(
        self, name: str, feeds: dict[str, Any], version: Any = None, outputs: list[str] | None = None, place: Any = None
    ) -> tuple[str, dict[str, Any]]:
        """Run one request on the serving version; returns (version, outputs by name). place(entry, names): the
        arrays the outputs are to be written into (session.run_into), or None for a plain run.
        Raises ModelNotFound/InvalidInput before the runtime sees bad input, InferenceFailed if the runtime fails."""
        with self.hold(name, version) as run:
            want = run.check(feeds, outputs)
            into = place(run.entry, want or list(run.entry.output_names)) if place is not None else None
            return run.version, run.execute(feeds, want, into)

    # ---- blame: the request's fault or the version's (failure paths only) --------------------------------
    def referee_run(
        self, entry: ModelEntry, feeds: dict[str, Any], want: list[str] | None
    ) -> tuple[bool, str, dict[str, Any]] | None:
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
            self.let_go(ref)

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

    def stats(self, name: str, version: Any = None) -> dict[str, Any]:
        """Counters and p50/p90/p99 of the serving version (or of `version` if it has been served)."""
        with self._lock:
            entry = self._entries.get(name)
        stats = self._stats.get(name, str(version) if version is not None else (entry.version if entry else None))
        if stats is None:
            raise ModelNotFound(
                f"no statistics for model {name!r}" + (f" version {version}" if version is not None else "")
            )
        return stats.snapshot()

    def model_stats(self, name: str, version: Any) -> ModelStats:
        """The live ModelStats object of one (model, version) (probation reads it)."""
        stats = self._stats.get(name, str(version))
        if stats is None:
            raise ModelNotFound(f"model {name!r} version {version} has never been activated")
        return stats

    def all_stats(self) -> list[ModelStats]:
        return self._stats.all()
