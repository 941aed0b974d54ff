"""One inference, one object: a Run holds one served entry (ModelRegistry.hold), checks the request against it,
passes the run gate (rungate.py: its CPU time measured when it had the runtimes to itself), says whose fault a
failure is (a typed Fault, never a string prefix), offers the answer to the entry's observers (a trial's shadow or
pairing, registered by the trial; the registry does not know them) and records the run when it ends."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from agent.serving import blame
from agent.serving.blame import Fault
from agent.serving.entry import ModelEntry, validate
from agent.serving.errors import InferenceFailed, InvalidInput
from agent.serving.rungate import CpuMark, RunGate


class Observer(Protocol):
    """Offered each successful run of an entry, on the request thread: must be cheap and never raise."""

    def offer(self, feeds: dict[str, Any], outputs: dict[str, Any], elapsed: float, cpu: float | None) -> None: ...


class Holder(Protocol):
    """What a Run needs from its registry: letting go of the entry, and re-running a request on the referee."""

    def let_go(self, entry: ModelEntry) -> None: ...

    def referee_run(
        self, entry: ModelEntry, feeds: dict[str, Any], want: list[str] | None
    ) -> tuple[bool, str, dict[str, Any]] | None: ...


class Run:
    """One inference on one held entry. Use as a context manager: end() records it and lets the entry go."""

    __slots__ = ("entry", "_holder", "_gate", "_check_finite", "elapsed", "ok", "nonfinite", "end_at", "fault",
                 "cpu", "contended", "_ended")  # fmt: skip

    def __init__(self, holder: Holder, entry: ModelEntry, gate: RunGate, check_finite: bool) -> None:
        self.entry, self._holder, self._gate, self._check_finite = entry, holder, gate, check_finite
        self.elapsed: float | None = None  # seconds in the runtime, when the run reached it
        self.ok = False
        self.nonfinite: bool | None = None  # None: outputs not checked
        self.end_at = 0.0  # perf_counter() when the runtime returned
        self.fault: Fault | None = None  # the request's doing (failure or NaN/Inf)
        self.cpu: float | None = None  # CPU seconds, every runtime thread counted, when measured alone
        self.contended = False  # measured, and dropped: its threads waited for the cores
        self._ended = False

    @property
    def version(self) -> str:
        return self.entry.version

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    def check(self, feeds: dict[str, Any], outputs: list[str] | None) -> list[str] | None:
        """Validate the request against the entry (InvalidInput, counted as rejected); the outputs asked for."""
        entry = self.entry
        try:
            validate(entry, feeds)
            if outputs is not None:
                unknown = [o for o in outputs if o not in entry.output_names]
                if unknown:
                    raise InvalidInput(
                        f"model {entry.name!r} has no output(s) {unknown}; outputs: {list(entry.output_names)}"
                    )
        except InvalidInput:
            entry.stats.reject()
            raise
        return list(outputs) if outputs is not None else None

    def execute(self, feeds: dict[str, Any], want: list[str] | None, into: dict[str, Any] | None) -> dict[str, Any]:
        """Run the session through the gate; InvalidInput / InferenceFailed when it fails (with the fault's
        owner said); the result is offered to the entry's observers."""
        entry = self.entry
        sampled = entry.stats.check_finite()  # checked for NaN/Inf; its CPU time measured when the gate allows
        result, failure = self._timed(feeds, want, into, sampled)
        if failure is not None:
            raise self._failed(feeds, want, failure)
        self.ok = True
        if sampled and self._check_finite:
            self.nonfinite = blame.nonfinite(result)
            if self.nonfinite:
                made = blame.request_made_nonfinite(feeds, self._referee(feeds, want))
                self.fault = Fault("its input holds NaN/Inf") if made else None
        for observer in entry.observers:
            observer.offer(feeds, result, self.elapsed or 0.0, self.cpu)
        return result

    def _timed(
        self, feeds: dict[str, Any], want: list[str] | None, into: dict[str, Any] | None, sampled: bool
    ) -> tuple[dict[str, Any], Exception | None]:
        session = self.entry.session
        alone = self._gate.begin(sampled)  # alone: no other run in flight, the runtimes' CPU time is this run's
        mark = CpuMark(session) if alone else None
        t0 = time.perf_counter()
        result: dict[str, Any] = {}
        failure: Exception | None = None
        spent = None
        try:
            result = session.run(feeds, want) if into is None else session.run_into(feeds, into)
            self.end_at = time.perf_counter()
            spent = mark.spent() if mark is not None else None
        except Exception as exc:  # the runtime's own failure, after validation passed
            self.end_at, failure = time.perf_counter(), exc
        finally:  # before any referee run: that one enters the gate itself
            if self._gate.end(alone, mark):  # none beside it, not kept off the cores
                self.cpu = spent
            elif mark is not None:
                self.contended = mark.contended  # measured, and dropped (counted per version)
        self.elapsed = self.end_at - t0
        return result, failure

    def _failed(self, feeds: dict[str, Any], want: list[str] | None, failure: Exception) -> Exception:
        entry = self.entry
        self.fault = blame.request_fault(feeds, self._referee(feeds, want))
        if self.fault is not None and self.fault.invalid_input:
            err: Exception = InvalidInput(f"model {entry.name!r}: {self.fault.why}")
        else:
            tail = f" ({self.fault.why}; not counted against the version)" if self.fault else ""
            err = InferenceFailed(f"model {entry.name!r} version {entry.version}: {failure}{tail}")
        err.__cause__ = failure
        return err

    def _referee(self, feeds: dict[str, Any], want: list[str] | None) -> Callable[[], Any]:
        return lambda: self._holder.referee_run(self.entry, feeds, want)

    def end(self) -> None:
        """The request is done with the entry (once). Its accounting, when it reached the runtime: a plain
        success is appended lock-free (ModelStats.add); errors and sampled requests under the stats' lock."""
        if self._ended:
            return
        self._ended = True
        if self.elapsed is not None:
            stats = self.entry.stats
            if self.ok and self.nonfinite is None and self.cpu is None and not self.contended:
                stats.add(self.elapsed, self.end_at)  # the common case: no lock
            else:
                caused = self.fault is not None
                stats.record(self.elapsed, self.ok, self.nonfinite, self.end_at, caused, self.cpu, self.contended)
        self._holder.let_go(self.entry)
