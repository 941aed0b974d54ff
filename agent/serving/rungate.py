"""The CPU time of one inference run, every thread counted: the calling thread and the runtime's own (ORT's
intra-op pool, OpenVINO's stream and TBB workers). A run's work is split between its calling thread and those
pools, and the split moves with what else the cores run, so the calling thread's CPU time alone is no measure
of the run (docs/serving.md, "Compute time"). The runtimes' threads serve every run in flight, so a measured
run has them to itself: RunGate holds new runs back, waits for the runs in flight to end, and CpuMark reads
the CPU clocks of the calling thread and of the runtimes' threads across the run.

Holding other runs back (the drain, and a measured run that another waits for) takes at most `duty` of the
time. A measured run nobody waited for costs nothing, so a lone client has every sampled run measured, while a
busy server is not serialised. A run that cannot have the runtimes to itself within `drain_s` is not measured;
one that holds the others back for longer than `hold_s` has its measurement spoiled (they go in beside it),
so a slow or stuck run never stalls the rest for long."""

from __future__ import annotations

import os
import threading
import time

from agent import schedstat

DUTY = 0.25  # at most this share of the time goes to holding other runs back for measured ones
DRAIN_S = 0.25  # a measured run waits this long at most for the runs in flight to end
HOLD_S = 0.25  # new runs wait this long at most for a measured run, then go in beside it (spoiling it)
MARK_SHARE = 0.02  # reading the clocks (~30-60 us a run here: a spinning pool thread's clock) takes at most this
# A measured run whose threads waited on a run queue (runnable, not running) for longer than this share of its
# wall time, or CONTENDED_FLOOR_S, was contended: not used. A pool thread preempted mid-run keeps the others
# spinning at its barrier, so such a run's CPU time is the scheduler's, not the model's (docs/serving.md).
CONTENDED_SHARE = 0.05
CONTENDED_FLOOR_S = 50e-6  # waking a sleeping pool thread at the start of a run waits a few us to tens of us


class RunGate:
    """Every inference run of a process's sessions enters (shared) and leaves the gate; a measured run enters
    alone. Shared entry is one uncontended lock round trip, unless a measured run holds the gate."""

    def __init__(
        self, duty: float = DUTY, drain_s: float = DRAIN_S, hold_s: float = HOLD_S, mark_share: float = MARK_SHARE
    ) -> None:
        if not 0.0 < duty <= 1.0 or not 0.0 < mark_share <= 1.0:
            raise ValueError(f"duty and mark_share must be in (0, 1], got {duty}, {mark_share}")
        self.mark_share = float(mark_share)
        self.duty, self.drain_s, self.hold_s = float(duty), float(drain_s), float(hold_s)
        self._cond = threading.Condition(threading.Lock())
        self._running = 0  # shared runs (and builds) in flight
        self._busy = 0  # builds, warm-ups and qualifications under way: no run is measured meanwhile
        self._alone = False  # a measured run holds the gate (or is draining it)
        self._next_at = 0.0  # perf_counter() before which no run is measured (duty)
        self._since = 0.0  # when the measured run began draining the gate
        self._run_at: float | None = None  # when it began running (None while it drains)
        self._spoiled = False  # a run went in beside the measured one (it overstayed hold_s)
        self._waited = False  # a run waited for the measured one
        # runs measured; drains given up; measurements spoiled (a run went in beside); contended (CpuMark)
        self.measured = self.missed = self.spoiled = self.contended = 0

    def due(self) -> bool:
        """Would a run starting now be measured? (Unlocked read: a race only moves the sample by a run.)"""
        return not self._alone and not self._busy and time.perf_counter() >= self._next_at

    def pace_s(self) -> float:
        """Seconds until the duty lets a paced run be measured (0: now; an unlocked read, as due())."""
        return max(0.0, self._next_at - time.perf_counter())

    def begin(self, measure: bool = False, paced: bool = True) -> bool:
        """Enter for one run; True when it is measured: no other run is in flight, and new ones wait until end()
        (for hold_s at most: then they go in beside it and its measurement is spoiled). measure: the caller
        wants it measured; it is not (False) while a build or qualification runs (busy), before the duty allows another (paced), or
        when the runs in flight do not end within drain_s (then runs go on unmeasured for a while). Pair it
        with end(the returned value)."""
        with self._cond:
            if self._alone:
                self._wait_alone()
            now = time.perf_counter()
            if not measure or self._alone or self._busy or (paced and now < self._next_at):
                self._running += 1
                return False
            if self._running == 0:  # nothing to drain: holding nobody back so far (being preempted is no cost)
                self._alone, self._spoiled, self._waited, self._since = True, False, False, now
                self._run_at = now
                self._running += 1
                return True
            self._alone, self._spoiled, self._waited, self._since, self._run_at = True, False, False, now, None
            drained = self._cond.wait_for(lambda: self._running == 0, self.drain_s)
            self._running += 1
            if drained:
                self._run_at = time.perf_counter()
                return True
            self._alone = False
            self.missed += 1
            self._next_at = time.perf_counter() + self.drain_s / self.duty  # something runs long: back off
            self._cond.notify_all()
            return False

    def _wait_alone(self) -> None:
        """Under the lock: wait while a measured run drains the gate (drain_s at most) or runs (hold_s at most)."""
        while self._alone:
            self._waited = True
            if self._run_at is None:
                self._cond.wait()
                continue
            left = self._run_at + self.hold_s - time.perf_counter()
            if left <= 0:
                self._spoiled = True  # this run goes in beside the measured one: that one's CPU time is not its own
                return
            self._cond.wait(left)

    def end(self, alone: bool, mark: "CpuMark | None" = None) -> bool:
        """Leave after a run; for a measured one (alone), whether its measurement holds (no run went in beside
        it, and its threads were not kept off the cores: mark.contended). Call mark.spent() before; the mark's
        marking_s (what reading the clocks cost) paces the next measurement (mark_share)."""
        marking_s, contended = (mark.marking_s, mark.contended) if mark is not None else (0.0, False)
        with self._cond:
            self._running -= 1
            if not alone:
                if self._alone and self._running == 0:
                    self._cond.notify_all()
                return False
            self._alone = False
            now = time.perf_counter()
            held = not self._spoiled
            # What measuring cost the other runs: the drain, and the run itself when one waited for it. A run
            # nobody waited for cost nothing, and the next may be measured at once.
            run_at = self._run_at if self._run_at is not None else now
            cost = (run_at - self._since) + ((now - run_at) if self._waited else 0.0)
            if held:
                if contended:
                    self.contended += 1
                else:
                    self.measured += 1
                self._next_at = now + max(cost * (1.0 / self.duty - 1.0), marking_s * (1.0 / self.mark_share - 1.0))
            else:
                self.spoiled += 1
                self._next_at = now + max(cost, self.hold_s) / self.duty
            self._cond.notify_all()
            return held and not contended

    def busy(self, on: bool) -> None:
        """A session build or warm-up, or a qualification, starts (on) or ends. No run is measured meanwhile: a
        build's CPU would count in it, and a qualification takes the cores that the runtime's pools spin on (a
        pool thread preempted mid-run keeps the others spinning: an incumbent measured while a qualification
        ran read p50 2.58 ms and p90 7.38 ms, and a 2x-compute candidate then passed)."""
        with self._cond:
            self._busy = max(0, self._busy + (1 if on else -1))

    def figures(self) -> dict[str, int]:
        return {
            "measured_runs": self.measured,
            "missed_drains": self.missed,
            "spoiled": self.spoiled,
            "contended": self.contended,
        }


_TASKS = "/proc/self/task"
_PROC = os.path.isdir(_TASKS)  # Linux: threads' CPU clocks by kernel id; elsewhere the process clock
_PER_THREAD_SCHED = 6  # Linux: CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED, the low bits of a thread's CPU clock id


def _thread_clock(tid: int) -> float:
    """A thread's CPU clock by its kernel id. Linux reads a running thread's clock up to the moment; the process
    clock (CLOCK_PROCESS_CPUTIME_ID) adds other threads' time only as of their last tick or switch, and missed
    half of a 1 ms run's work on a 2-thread ORT pool here."""
    return time.clock_gettime((~tid << 3) | _PER_THREAD_SCHED)


# Runtime threads a session's build and warm-up started (ORT's intra-op pool is per session), by kernel id ->
# the session's key. A run counts its own session's threads and the unowned ones (OpenVINO's TBB workers, shared
# by its sessions), never another session's: an incumbent's pool spinning after its last run is not the
# candidate's work (it made a same-compute shadow read 4x on 2 cores under 4 clients).
_OWNER: dict[int, int] = {}
_OWNER_LOCK = threading.Lock()


def native_tids() -> set[int]:
    """Kernel ids of the process's threads that Python did not start (empty where there is no /proc)."""
    if not _PROC:
        return set()
    python = {t.native_id for t in threading.enumerate()}
    return {tid for tid in map(int, os.listdir(_TASKS)) if tid not in python}


def claim(session: object, before: set[int]) -> None:
    """The runtime threads started since `before` (native_tids() before the session was opened) are the
    session's. Builds running at once may take each other's; such a thread then counts for the wrong one."""
    mine = native_tids() - before
    with _OWNER_LOCK:
        for tid in mine:
            _OWNER[tid] = id(session)


def disown(session: object) -> None:
    """The session is closed: its threads end (and their ids may be reused)."""
    key = id(session)
    with _OWNER_LOCK:
        for tid in [t for t, k in _OWNER.items() if k == key]:
            del _OWNER[tid]


def _native_clocks(owner: int | None, own_only: bool = False) -> dict[int, float]:
    """CPU clocks of the runtime threads a run of session `owner` may use: the process's threads that Python did
    not start (the runtimes' pools: ORT intra-op threads, OpenVINO stream and TBB workers), less those another
    session's build started (`own_only`: only those its own build started). Python's own threads (request
    handlers, the broker link, timers) are left out."""
    owners = _OWNER
    out = {}
    for tid in native_tids():
        if owners.get(tid, None if own_only else owner) == owner:
            try:
                out[tid] = _thread_clock(tid)
            except OSError:  # it ended meanwhile
                pass
    return out


class CpuMark:
    """Where a run's CPU time starts: the calling thread's clock and the clocks of the runtime threads the run
    may use (on Linux; elsewhere the process clock). spent() is the CPU seconds since; a thread started
    meanwhile counts whole, one that ended meanwhile is lost. After spent(), `contended` says whether a run
    that used runtime threads besides the calling one had those threads wait on a run queue for longer than
    CONTENDED_SHARE of the run (or CONTENDED_FLOOR_S): then the figure is the scheduler's (spinning at a
    barrier while a peer was preempted), not the model's. A run on the calling thread alone is never contended:
    a thread's clock stops while it waits."""

    __slots__ = (
        "_own",
        "_native",
        "_own_only",
        "_process",
        "_owner",
        "_tids",
        "_delay",
        "_at",
        "marking_s",
        "waited_s",
        "contended",
    )

    def __init__(self, session: object = None, own_only: bool = False) -> None:
        """session: the one about to run (its own threads count, other sessions' do not); own_only: the unowned
        threads do not count either (a runtime whose pool is the session's own and claimed at its build:
        onnxruntime-genai; a released OpenVINO session's TBB workers are unowned and made its pairs contended)."""
        t0 = time.thread_time()  # the readings' own CPU time: being preempted meanwhile costs the others nothing
        self._owner = None if session is None else id(session)
        self._process = not _PROC
        self._native = {} if self._process else _native_clocks(self._owner, own_only)
        self._own_only = own_only
        self._tids = (threading.get_native_id(), *self._native) if schedstat.AVAILABLE else ()
        self._delay = schedstat.run_delay(self._tids)
        self.waited_s, self.contended = 0.0, False
        self._own = time.process_time() if self._process else time.thread_time()
        self.marking_s = self._own - t0 if not self._process else 0.0  # what reading the clocks costs (mark_share)
        self._at = time.perf_counter()

    def spent(self) -> float:
        wall = time.perf_counter() - self._at
        t0 = time.thread_time()
        if self._process:
            total = time.process_time() - self._own
        else:
            clocks = _native_clocks(self._owner, self._own_only)
            pooled = [c - self._native.get(tid, 0.0) for tid, c in clocks.items()]
            total = t0 - self._own + sum(pooled)
            # A run on the calling thread alone spins on nobody: its waits do not add to its CPU time.
            if self._tids and any(d > 0.0 for d in pooled):
                self.waited_s = max(0.0, schedstat.run_delay(self._tids) - self._delay)
                self.contended = self.waited_s > max(CONTENDED_SHARE * wall, CONTENDED_FLOOR_S)
        self.marking_s += time.thread_time() - t0
        return total
