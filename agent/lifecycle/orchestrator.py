"""The Orchestrator drives deployments through the table: one worker per model, deadlines, cancel, supersede."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError, LifecycleError
from agent.lifecycle.context import Cancelled, DeadlineExceeded, Rejected, StepContext
from agent.lifecycle.journal import Deployment, Journal, check_name
from agent.lifecycle.recovery import commit_landed, recover
from agent.lifecycle.reports import Listener, Reports
from agent.lifecycle.slots import ModelSlots
from agent.lifecycle.states import SERVING_NEW, Event, State
from agent.lifecycle.steps import Steps
from agent.lifecycle.table import ENTRY_ACTIONS, RESTORE, next_state

CRASH_ENV = "EDGE_AGENT_TEST_CRASH_AT"  # test-only: SIGKILL the process right after journaling this state
DEADLINES_S: dict[State, float] = {
    State.RECEIVED: 60,
    State.DOWNLOADING: 3600,
    State.VERIFYING: 600,
    State.QUALIFYING: 1800,
    State.ACTIVATING: 900,
    State.PROBATION: 3600,
}
JOURNAL_RETRIES = 3


class _Worker:
    """Runs one model's deployments one after another; `pending` holds the next (newest) one."""

    def __init__(self) -> None:
        self.current: Deployment | None = None
        self.ctx: StepContext | None = None
        self.pending: Deployment | None = None
        self.thread: threading.Thread | None = None


class Orchestrator:
    """Owns the journal and slots of one state_dir; safe to run several instances in one process."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        steps: Steps,
        *,
        deadlines: dict[State, float] | None = None,
        listeners: list[Listener] | None = None,
        crash_at: str | None = None,
    ):
        self.state_dir = Path(state_dir)
        self.journal: Journal = steps.journal  # one writer object per state_dir (close() covers the steps too)
        self.slots: ModelSlots = steps.slots
        self.steps = steps
        self.deadlines = {**DEADLINES_S, **(deadlines or {})}
        self.listeners: list[Listener] = list(listeners or [])
        self.crash_at = crash_at if crash_at is not None else os.environ.get(CRASH_ENV)
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._workers: dict[str, _Worker] = {}
        self._stopping = False
        self._reports = Reports(self.listeners)
        self._parked: dict[str, Deployment] = {}  # model -> resumed deployment waiting for its source
        self._digests: dict[tuple[str, str], Deployment] | None = None  # (model, source digest) -> newest record

    # ---- start-up ------------------------------------------------------------------------------
    def start(self) -> list[Deployment]:
        """Serve every committed slot, then resume the journal's in-flight deployments (recovery table). One
        whose next action needs its source (a manifest still to check or download) waits until that source is
        up (source_up)."""
        self.steps.restore_all()
        resumed = recover(self.journal, self.slots, self.steps.download_mark)
        with self._lock:
            for dep in resumed:
                self._notify(dep)
                if self.steps.source_ready(dep):
                    self._schedule(dep)
                else:
                    self._parked[dep.model] = dep
        self._requalify_drifted({d.model for d in resumed})
        return resumed

    def _requalify_drifted(self, busy: set[str]) -> None:
        """Runtime drift: a committed model decided under other versions keeps serving and is re-qualified in
        the background as a deployment of the same artifact (unless a resumed deployment replaces it anyway)."""
        for name, entry, drift in self.steps.drifted():
            if name in busy:
                continue
            source = {"kind": "requalify", "drift": drift, "provider": entry.provider}
            with self._lock:
                self._schedule(self._create(name, entry.version, source, sha256=entry.sha256, fetched=True))

    def source_up(self, kind: str) -> list[Deployment]:
        """A deployment source became ready: schedule the resumed deployments that waited for it."""
        with self._lock:
            if self._stopping:
                return []
            go = [d for d in self._parked.values() if d.source.get("kind") == kind]
            for dep in go:
                del self._parked[dep.model]
                self._schedule(dep)
            return go

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking work and interrupt running steps; what they leave unjournaled, recovery resumes on the next start."""
        with self._lock:
            self._stopping = True
            for w in self._workers.values():
                w.pending = None
                if w.ctx is not None:
                    w.ctx.cancel_event, w.ctx.cancel_reason = Event.CANCEL.value, "daemon stopping"
                    w.ctx.cancel.set()
            threads = [w.thread for w in self._workers.values() if w.thread]
        end = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        self.journal.close()  # a worker that outlives the drain (a compile that ignores cancel) writes nothing more
        self.flush_reports(max(1.0, end - time.monotonic()))

    def live_threads(self) -> list[threading.Thread]:
        """Worker threads still running (after stop(): those the drain timeout left behind)."""
        with self._lock:
            return [w.thread for w in self._workers.values() if w.thread is not None and w.thread.is_alive()]

    # ---- requests --------------------------------------------------------------------------------
    def submit(self, model: str, version: str, source: dict[str, Any], **data: Any) -> Deployment | None:
        """Journal a new deployment and queue it; a newer one supersedes the model's in-flight one.

        A manifest deployment must come verified (data["manifest"], from its DeploymentSource): nothing
        unverified can supersede. Returns None for a duplicate of a deployment already seen (same
        `source.digest`), unless that one failed for a transient reason after its retries (`retryable`)."""
        check_name(model, "model name")
        if source.get("kind") == "manifest" and not isinstance(data.get("manifest"), dict):
            raise LifecycleError(f"{model} {version}: an unverified manifest cannot be submitted")
        digest = source.get("digest")
        with self._lock:
            if self._stopping:
                raise LifecycleError("the daemon is stopping")
            if digest and self.seen(model, digest):
                return None
            dep = self._create(model, str(version), source, **data)
            self._schedule(dep)
            return dep

    def seen(self, model: str, digest: str) -> bool:
        """Was this exact desired state deployed already (and not failed retryably)?"""
        with self._lock:
            if self._digests is None:
                self._digests = {}
                for d in self.journal.all():
                    if d.source.get("digest"):
                        self._digests[(d.model, d.source["digest"])] = d
            dep = self._digests.get((model, digest))
            return dep is not None and not (dep.state is State.FAILED and dep.data.get("retryable"))

    def cancel(self, target: str, reason: str = "cancelled by operator") -> Deployment | None:
        """Cancel the in-flight deployment of a model (by model name or deployment id)."""
        with self._lock:
            for name, w in self._workers.items():
                for dep in (w.pending, w.current):
                    if dep is not None and target in (name, dep.id):
                        self._cancel(w, dep, Event.CANCEL, reason)
                        return dep
        return None

    def rollback(self, model: str, wait: float | None = 60.0) -> Deployment:
        """Back to the previous slot without a download. A model in activation/probation just aborts it."""
        with self._lock:
            w = self._workers.get(model)
            cur = w.current if w else None
            if cur is not None and cur.state in SERVING_NEW and cur.source.get("kind") != "rollback":
                assert w is not None  # cur is w.current
                self._cancel(w, cur, Event.CANCEL, "rollback requested by operator")
                dep = cur
            else:
                prev = self.slots.get(model)["previous"]
                if not prev:
                    raise LifecycleError(f"model {model!r} has no previous version to roll back to")
                dep = self._create(model, prev.version, {"kind": "rollback"}, sha256=prev.sha256)
                self._schedule(dep)
        return self.wait(dep.id, wait) if wait else dep

    def wait(self, dep_id: str, timeout: float | None = None) -> Deployment:
        """Block until a deployment is terminal (LifecycleError on timeout)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while True:
                dep = self.journal.load(dep_id)
                if dep.terminal:
                    return dep
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise LifecycleError(f"deployment {dep_id} still {dep.state.value} after {timeout:.0f}s")
                self._idle.wait(min(left, 1.0) if left is not None else 1.0)

    def exclusive(self) -> threading.RLock:
        """Hold while scanning a source and submitting from it (no transition lands in between)."""
        return self._lock

    def in_flight(self) -> dict[str, Deployment]:
        """Running deployments per model, and resumed ones waiting for their source."""
        with self._lock:
            out = {n: d for n, d in self._parked.items() if not d.terminal}
            out.update(
                {n: w.current for n, w in self._workers.items() if w.current is not None and not w.current.terminal}
            )
            return out

    # ---- workers ---------------------------------------------------------------------------------
    def _schedule(self, dep: Deployment) -> None:
        parked = self._parked.pop(dep.model, None)
        if parked is not None and parked is not dep:
            self._finish_unstarted(parked, f"superseded by version {dep.version} ({dep.id})")
        w = self._workers.setdefault(dep.model, _Worker())
        if w.pending is not None:
            self._finish_unstarted(w.pending, f"superseded by version {dep.version} ({dep.id})")
        if w.current is not None and not w.current.terminal:
            self._cancel(w, w.current, Event.SUPERSEDE, f"superseded by version {dep.version} ({dep.id})")
        w.pending = dep
        if w.thread is None or not w.thread.is_alive():
            w.thread = threading.Thread(
                target=self._run_worker, args=(dep.model, w), name=f"deploy-{dep.model}", daemon=True
            )
            w.thread.start()

    def _finish_unstarted(self, dep: Deployment, reason: str) -> None:
        self._enter(dep, Event.SUPERSEDE, reason)

    def _cancel(self, w: _Worker, dep: Deployment, event: Event, reason: str) -> None:
        if dep is w.pending:
            w.pending = None
            self._enter(dep, event, reason)
        elif w.ctx is not None:
            w.ctx.cancel_event, w.ctx.cancel_reason = event.value, reason
            w.ctx.cancel.set()

    def _run_worker(self, model: str, w: _Worker) -> None:
        while True:
            with self._lock:
                dep, w.pending = w.pending, None
                w.current = dep
                # one context per deployment, set with `current`: a cancel between two steps is not lost
                w.ctx = StepContext(None, progress=lambda e, _d=dep, **f: self._progress(_d, e, **f))
                if dep is None or self._stopping:
                    w.current, w.thread = None, None
                    self._idle.notify_all()
                    return
            try:
                self._drive(dep, w)
            except BaseException as exc:  # noqa: BLE001 - a worker never dies with its deployment in flight
                self._broken(dep, exc)
            finally:
                with self._lock:
                    w.current, w.ctx = None, None
                    self._idle.notify_all()

    def _drive(self, dep: Deployment, w: _Worker) -> None:
        ctx = w.ctx
        assert ctx is not None  # _run_worker set it with w.current; cleared only after _drive returns
        while not dep.terminal:
            with self._lock:
                if self._stopping:
                    return  # stays journaled in its state; recovery resumes it on the next start
                limit = self.deadlines.get(dep.state)
                ctx.deadline = time.monotonic() + limit if limit else None
            event, reason, data = self._step(dep, ctx)
            target = next_state(dep.state, event)
            if ENTRY_ACTIONS.get(target) == RESTORE and not self._stopping:
                if commit_landed(self.slots, dep):  # too late to abort: what serves is this deployment
                    event, reason = Event.FOUND_COMMITTED, _landed(reason)
                else:
                    self.steps.enter(target, dep.model)  # restore: before the journal says so
            with self._lock:
                if self._stopping:
                    return  # not journaled: recovery decides on the next start
                self._enter(dep, event, reason, **data)
            if event is Event.FETCHED:
                self.steps.landed(dep)

    def _broken(self, dep: Deployment, exc: BaseException) -> None:
        """_drive itself failed (e.g. a journal write: disk full, directory removed): fail the deployment with the
        reason, journaled and reported. If even that cannot be written, say so; recovery resumes it on restart."""
        reason = f"{dep.state.value}: internal error: {type(exc).__name__}: {exc}"
        last: Exception | None = None
        for attempt in range(JOURNAL_RETRIES):
            if self._stopping or dep.terminal:
                return  # stopping: recovery decides on the next start
            try:
                event = Event.FAIL
                if dep.state in SERVING_NEW and commit_landed(self.slots, dep):
                    event = Event.FOUND_COMMITTED  # e.g. the journal write of the commit itself failed
                elif dep.state in SERVING_NEW:
                    self.steps.enter(next_state(dep.state, event), dep.model)  # the committed one serves again
                with self._lock:
                    self._enter(dep, event, _landed(reason) if event is Event.FOUND_COMMITTED else reason)
                return
            except Exception as again:  # noqa: BLE001 - retried, then reported
                last = again
                time.sleep(0.2 * (attempt + 1))
        self._publish(
            {
                "deployment_id": dep.id,
                "model": dep.model,
                "version": dep.version,
                "state": dep.state.value,
                "reason": reason,
                "progress": "stalled",
                "error": f"cannot journal the failure: {type(last).__name__}: {last}; "
                "recovery resumes this deployment on the next start",
                "ts": time.time(),
            }
        )

    def _step(self, dep: Deployment, ctx: StepContext) -> tuple[Event, str | None, dict[str, Any]]:
        try:
            ctx.check()
            event, data = self.steps.run(dep, ctx)
            return event, data.pop("reason", None), data
        except Cancelled as exc:
            return Event(exc.event), str(exc), {}
        except DeadlineExceeded:
            return Event.TIMEOUT, f"{dep.state.value} exceeded its deadline of {self.deadlines[dep.state]:.0f}s", {}
        except Rejected as exc:
            return Event.REJECT, str(exc), {}
        except EdgeAgentError as exc:
            # retryable: a transient failure that outlasted its retries; the same desired state may be submitted again
            return (
                Event.FAIL,
                f"{dep.state.value}: {exc}",
                ({"retryable": True} if getattr(exc, "retryable", False) else {}),
            )
        except Exception as exc:  # noqa: BLE001 - any bug in an action fails the deployment, not the daemon
            return Event.FAIL, f"{dep.state.value}: {type(exc).__name__}: {exc}", {}

    # ---- journal + reporting ---------------------------------------------------------------------
    def _create(self, model: str, version: str, source: dict[str, Any], **data: Any) -> Deployment:
        dep = self.journal.create(model, version, source, **data)
        if self._digests is not None and source.get("digest"):
            self._digests[(model, source["digest"])] = dep
        self._crash_hook(dep)
        self._notify(dep)
        return dep

    def _crash_hook(self, dep: Deployment) -> None:
        if self.crash_at and self.crash_at == dep.state.value:
            os.kill(os.getpid(), signal.SIGKILL)

    def _enter(self, dep: Deployment, event: Event, reason: str | None = None, **data: Any) -> None:
        """Persist the transition (before the next action), report it, and honour the crash test hook."""
        self.journal.apply(dep, event, reason=reason, **data)
        self._crash_hook(dep)
        if dep.terminal:
            if self._digests is not None and dep.source.get("digest"):
                self._digests[(dep.model, dep.source["digest"])] = dep
            self.steps.finished(dep)
        self._notify(dep)
        with self._idle:
            self._idle.notify_all()

    def _notify(self, dep: Deployment) -> None:
        self._publish(
            {
                "deployment_id": dep.id,
                "model": dep.model,
                "version": dep.version,
                "state": dep.state.value,
                "reason": dep.reason,
                "ts": dep.updated,
                **{k: dep.data[k] for k in ("shadow", "probation") if isinstance(dep.data.get(k), dict)},
            }
        )

    def _progress(self, dep: Deployment, event: str, **fields: Any) -> None:
        self._publish(
            {
                "deployment_id": dep.id,
                "model": dep.model,
                "version": dep.version,
                "state": dep.state.value,
                "progress": event,
                **fields,
                "ts": time.time(),
            }
        )

    def _publish(self, record: dict[str, Any]) -> None:
        self._reports.publish(record)

    def flush_reports(self, timeout: float = 10.0) -> None:
        """Wait until every transition so far has reached the listeners."""
        self._reports.flush(timeout)


def _landed(reason: str | None) -> str:
    return f"{reason}; the slot commit had landed before: committed" if reason else "the slot commit had landed"
