"""Paired timing during a trial: a sampled share of live requests is run again on both versions, back to back on
one thread and the same inputs, ABBA order across pairs, each side warm; a small share runs incumbent against
incumbent (A/A: the noise floor). An observer of the serving entry (run.Observer), registered by the trial.

The client never waits for a pair: offer() (on the request thread, after the run) only copies the inputs when a
pair is wanted; the pair runs later on this object's thread, or the copy is dropped. A pair's runs pass the run
gate alone (rungate.py: the same CPU-time measure as every run; a client run may wait for one mirrored run to
end, as for any measured run). Mirrored runs cost at most `share` of the serving CPU (the process's CPU time
less the mirrored runs' own since the pairing began)."""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Any

import numpy as np

from agent.serving.rungate import HOLD_S, CpuMark, RunGate
from agent.trial import conditions
from agent.trial.pairjudge import PairedRule, judge
from agent.trial.settings import ProbationConfig
from agent.trial.twin import CANDIDATE, Twin

WARM_GAP_S = 1.0  # a session idle longer than this runs once untimed before its timed run (caches, pool threads)
# A timed run measured alone but contended (its pool threads waited on a run queue: rungate.CpuMark) runs again
# on the same inputs up to this many times while the mirrored CPU is within its share: beside busy loops on 2
# cores about 2 runs in 3 were contended, so a pair needing both halves clean on the first try was kept 1 time
# in 9 and the verdict often had too few pairs; a half that still fails drops the pair before its other half runs.
RETRIES = 3
# ... each after the gate's duty allows (RunGate.pace_s: a client that waited for the contended run makes the next
# wait), so runs again hold clients back no more than any measured run does; a longer wait than this drops the pair
RETRY_WAIT_S = 0.25
# A timed run follows an untimed run of the same session in one gate window while its runs take at most this
# (the gate holds clients back at most HOLD_S for the window): a longer run streams its weights through the
# caches either way, and its first run after an idle spell is warmed by WARM_GAP_S instead.
WARM_IN_WINDOW_S = HOLD_S / 4
PAIR_RUNS = 4  # runs a pair costs at least when its halves warm in their windows (the budget's estimate)
COSTS_KEPT = 8  # ... or the most any of the last this many pairs cost, whichever is more


def rule_of(config: ProbationConfig) -> PairedRule:
    """What the judge asks of the pairs, from serving.probation."""
    return PairedRule(config.ratio, config.paired_confidence, config.paired_min_pairs, config.paired_min_aa)


class Pairing:
    """Pairs of (incumbent, candidate) runs on copies of live requests; result() judges them."""

    def __init__(
        self,
        incumbent: Any,
        candidate: Any,
        gate: RunGate,
        *,
        share: float = 0.10,
        aa_share: float = 0.2,
        cpu: bool = True,
        seed: int | None = None,
    ) -> None:
        """incumbent, candidate: open sessions (the caller keeps both open until stop()); share: mirrored CPU
        at most this share of serving CPU; aa_share: this share of pairs is incumbent against incumbent; cpu:
        time CPU (every runtime thread, rungate.CpuMark), else wall time in the run (accelerators). `twin`, set
        before start(): the served side's twin (trial/twin.py), built on the pair thread, timed in its place."""
        self.incumbent, self.candidate, self.gate = incumbent, candidate, gate
        self.twin: Twin | None = None
        # the judge's (min_pairs, min_aa): once there are min_pairs candidate pairs and fewer than min_aa A/A
        # pairs, every pair is A/A until there are (a verdict waits on the floor, not on more candidate pairs)
        self.needs = (16, 8)
        self.share, self.aa_share, self.cpu = float(share), float(aa_share), cpu
        self._rng = random.Random(seed)
        self._slot: dict[str, Any] | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._open = True
        self._started_cpu = time.process_time()
        self._last: dict[int, float] = {}  # id(session) -> perf_counter() of its last mirrored run
        self._pair_cost = 0.0  # the most the last COSTS_KEPT pairs cost each (warm-ups included)
        self._costs: list[float] = []
        self._run_s = 0.0  # CPU (or wall) seconds of the live run whose inputs are in the slot
        self._order = 0  # ABBA: pairs 0 and 3 (mod 4) run the incumbent first, 1 and 2 the candidate
        self.pairs: list[float] = []  # log(candidate / incumbent) per pair
        self.aa: list[float] = []  # log(second incumbent run / first) per A/A pair (labels ABBA like the pairs)
        self.incumbent_s: list[float] = []  # the incumbent's time in each candidate pair
        self.mirrored_s = 0.0  # CPU (or wall) seconds the mirrored runs took, warm-ups included
        self.offered = self.over_budget = self.dropped = self.failed = 0
        self.runs = self.retried = 0  # mirrored runs (warm-ups and retries included); runs again after contention
        self.warmed = 0  # untimed runs in a timed run's window (WARM_IN_WINDOW_S)
        self._warm_s: dict[int, float] = {}  # id(session) -> wall seconds of its last timed run
        self._contended = False  # the last _timed run was measured alone but contended: worth running again
        self.carried = 0  # pairs (A/A included) taken over from the shadow phase

    def carry(self, earlier: "Pairing") -> None:
        """Start from the pairs an earlier phase took on the same two sessions (the shadow phase's)."""
        self.pairs, self.aa = list(earlier.pairs), list(earlier.aa)
        self.incumbent_s = list(earlier.incumbent_s)
        self.carried = len(self.pairs) + len(self.aa)

    # ---- request thread ---------------------------------------------------------------------------------
    def offer(self, feeds: dict[str, Any], outputs: dict[str, Any], elapsed: float, cpu: float | None) -> None:
        """A live request was answered: copy its inputs for a pair when one is wanted and the budget allows."""
        if not self._open or self._slot is not None:
            return
        self.offered += 1
        self._run_s = cpu if cpu is not None else elapsed
        if not self.within_budget(self._run_s):
            self.over_budget += 1
            return
        try:
            self._slot = {k: np.array(v, copy=True) for k, v in feeds.items()}
            self._ready.set()
        except Exception:  # noqa: BLE001 - pairing must never touch the client's request
            pass

    def serving_s(self) -> float:
        """The process's CPU seconds since the pairing began, less the mirrored runs'."""
        return max(0.0, time.process_time() - self._started_cpu - self.mirrored_s)

    def within_budget(self, run_s: float = 0.0) -> bool:
        """Would the next pair keep the mirrored CPU within its share? It is taken to cost the most any of the
        last COSTS_KEPT did, or PAIR_RUNS runs of `run_s` (the live request's run) when that is more: the first
        pair, and one after an idle spell, cost more than the one before."""
        need = max(self._pair_cost, PAIR_RUNS * max(0.0, run_s))
        return self.mirrored_s + need <= self.share * self.serving_s()

    # ---- pair thread ------------------------------------------------------------------------------------
    def start(self) -> "Pairing":
        self._thread = threading.Thread(target=self._loop, name="trial-pairs", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more pairs; returns once the pair thread is done with both sessions (a twin is closed then)."""
        self._open = False
        self._stop.set()
        self._ready.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        if self.twin is not None and (self._thread is None or not self._thread.is_alive()):
            self.twin.close()

    def _use_twin(self) -> None:
        """Build the twin and time it in its side's place (a failed build leaves the serving session)."""
        if self.twin is None or self._stop.is_set():
            return
        session = self.twin.open()
        if session is None:
            return
        if self.twin.side == CANDIDATE:
            self.candidate = session
        else:
            self.incumbent = session

    def _loop(self) -> None:
        self._use_twin()
        while not self._stop.is_set():
            if not self._ready.wait(0.2):
                continue
            self._ready.clear()
            feeds, self._slot = self._slot, None
            if feeds is None or self._stop.is_set():
                continue
            if not self.within_budget(self._run_s):  # offered while the last pair ran: its cost counts now
                self.over_budget += 1
                continue
            self.pair(feeds)

    def pair(self, feeds: dict[str, Any]) -> None:
        """One pair on `feeds`: candidate against incumbent, or (aa_share) incumbent against incumbent."""
        min_pairs, min_aa = self.needs
        aa = self._rng.random() < self.aa_share or (len(self.pairs) >= min_pairs and len(self.aa) < min_aa)
        before = self.mirrored_s
        try:
            self._pair(feeds, aa)
        finally:
            self._costs = [*self._costs[-(COSTS_KEPT - 1) :], self.mirrored_s - before]
            self._pair_cost = max(self._costs)

    def _pair(self, feeds: dict[str, Any], aa: bool) -> None:
        other = self.incumbent if aa else self.candidate
        first_incumbent = self._order % 4 in (0, 3)
        self._order += 1
        for session in (self.incumbent, other):
            idle = time.perf_counter() - self._last.get(id(session), -math.inf) > WARM_GAP_S
            if idle and not self._warms_in_window(session):
                self._timed(session, feeds)  # warm-up: untimed (its run's length says whether later ones warm)
        first, second = (self.incumbent, other) if first_incumbent else (other, self.incumbent)
        a = self._clean(first, feeds, halves_left=2)
        b = self._clean(second, feeds, halves_left=1) if a is not None else None  # a dropped pair spends no more
        inc, cand = (a, b) if first_incumbent else (b, a)
        if inc is None or cand is None or inc <= 0 or cand <= 0:
            self.dropped += 1
            return
        if aa:
            self.aa.append(math.log(cand / inc))
        else:
            self.pairs.append(math.log(cand / inc))
            self.incumbent_s.append(inc)

    def _clean(self, session: Any, feeds: dict[str, Any], halves_left: int = 1) -> float | None:
        """One half of a pair: a timed run, run again (RETRIES at most, once the gate's duty allows) while it was
        contended and the mirrored CPU stays within its share counting another such attempt for each half left
        (this one, and the second when this is the first); None when no run was measured clean."""
        for attempt in range(RETRIES + 1):
            before = self.mirrored_s
            spent = self._timed(session, feeds)
            if spent is not None or not self._contended or attempt == RETRIES:
                return spent
            if self.mirrored_s + halves_left * (self.mirrored_s - before) > self.share * self.serving_s():
                return None
            wait = self.gate.pace_s() if self.gate is not None else 0.0  # TokenPairing: no gate
            if wait > RETRY_WAIT_S or self._stop.wait(wait):
                return None
            self.retried += 1
        return None

    def _timed(self, session: Any, feeds: dict[str, Any]) -> float | None:
        """One run alone through the gate: its CPU (or wall) seconds, None when not measured or it failed
        (`_contended` then says whether it was measured alone but contended). Within the same window, before the
        timed run, the session runs once untimed (while a run is short beside the gate's hold_s): nothing runs
        between the two, so each half of a pair starts with its own weights in the caches and TLBs, as a
        serving session's runs do; otherwise the serving version's half followed its clients' runs and read
        about 25 % faster than the same model's other half (docs/serving.md, "Paired timing")."""
        self.runs += 1
        self._contended = False
        alone = self.gate.begin(True, paced=False)  # paced by `share` here, not by the gate's duty
        mark: CpuMark | None = None
        t0 = time.perf_counter()
        spent: float | None = None
        try:
            try:
                if alone and self._warms_in_window(session):
                    self._warm(session, feeds)
                mark = CpuMark(session) if alone and self.cpu else None
                t1 = time.perf_counter()
                session.run(feeds, None)
                self._warm_s[id(session)] = time.perf_counter() - t1
                spent = mark.spent() if mark is not None else time.perf_counter() - t1
            finally:
                held = self.gate.end(alone, mark)
        except Exception:  # noqa: BLE001 - a failing mirrored run is counted, not raised (probation judges failures)
            self.failed += 1
            held = False
        wall = time.perf_counter() - t0
        self._last[id(session)] = time.perf_counter()
        self.mirrored_s += spent if spent is not None else wall
        self._contended = alone and mark is not None and mark.contended
        return spent if held and alone else None

    def _warms_in_window(self, session: Any) -> bool:
        """Does a timed run of `session` follow an untimed one in its window (its last run was short enough)?"""
        return self._warm_s.get(id(session), math.inf) <= WARM_IN_WINDOW_S

    def _warm(self, session: Any, feeds: dict[str, Any]) -> None:
        """The untimed run before a timed one, in its window; its CPU counts as mirrored (a failure raises)."""
        self.runs += 1
        self.warmed += 1
        mark = CpuMark(session) if self.cpu else None
        t0 = time.perf_counter()
        session.run(feeds, None)
        self.mirrored_s += mark.spent() if mark is not None else time.perf_counter() - t0

    # ---- verdict ----------------------------------------------------------------------------------------
    def result(self, rule: PairedRule) -> dict[str, Any]:
        """The "paired" block: {"ratio", "ci", "pairs", "aa": {...}, "conditions": {...}, "verdict", "reason"}."""
        said = judge(list(self.pairs), list(self.aa), rule)
        return {
            **said.candidate.to_dict(),
            "aa": said.aa.to_dict(),
            "conditions": conditions.read(),
            "verdict": said.verdict,
            "reason": f"{said.reason}; {self.counts_said()}",
        }

    def counts(self) -> dict[str, Any]:
        serving = self.serving_s()
        return {
            "offered": self.offered,
            "over_budget": self.over_budget,
            "dropped": self.dropped,
            "failed": self.failed,
            "runs": self.runs,
            "retried": self.retried,
            "warmed": self.warmed,
            "twin": self.twin.said() if self.twin is not None else None,
            "mirrored_cpu_s": round(self.mirrored_s, 4),
            "serving_cpu_s": round(serving, 4),
            "share": round(self.mirrored_s / serving, 4) if serving > 0 else None,
            "carried": self.carried,
        }

    def counts_said(self) -> str:
        c = self.counts()
        share = "not measured" if c["share"] is None else f"{100 * c['share']:.1f} %"
        carried = f"{c['carried']} pairs from the shadow phase, " if c["carried"] else ""
        return carried + (
            f"{c['offered']} live requests offered, {c['over_budget']} left over budget, {c['dropped']} pairs dropped "
            f"(a run not measured alone or contended), {c['failed']} mirrored runs failed, {c['retried']} of "
            f"{c['runs']} mirrored runs ran again after contention, {c['warmed']} were untimed runs before a timed one; mirrored CPU {share} of "
            f"serving CPU (budget {100 * self.share:g} %)"
        )
