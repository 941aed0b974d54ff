"""Shadow phase: before a swap, the warmed candidate answers copies of live requests; its outputs, failures and
compute time are compared with the incumbent's on the same requests. Clients only ever get the incumbent's."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from agent.qualify.accuracy import output_metrics
from agent.serving.rungate import CpuMark, RunGate
from agent.trial.judge import limit_ms
from agent.trial.pairjudge import SLOWER
from agent.trial.settings import ShadowConfig

PASS, FAIL, INCONCLUSIVE, SKIPPED = "pass", "fail", "inconclusive", "skipped"


def skipped(reason: str) -> dict[str, Any]:
    """The shadow block of a deployment whose shadow phase did not run."""
    return {"requests": 0, "agreement": None, "max_rel": None, "latency_ratio": None, "verdict": SKIPPED,
            "reason": reason}  # fmt: skip


class Shadow:
    """Collects copies of live requests (offer(), on the request thread: cheap, never raises) and runs them on
    the candidate (run(), on the caller's thread). At most one copy waits at a time, and after each shadow run
    the next copy is taken only once the runs so far used at most `cpu_share` of the elapsed time."""

    def __init__(
        self,
        session: Any,
        config: ShadowConfig,
        clock: Callable[[], float] = time.perf_counter,
        cpu: bool = True,
        gate: RunGate | None = None,
    ) -> None:
        """cpu: compare the run's CPU time, every runtime thread counted (both sides), else the wall time; gate:
        the serving registry's (a shadow run measured for CPU time has the runtimes to itself, rungate.py)."""
        self.session, self.config, self.clock, self.cpu = session, config, clock, cpu
        self.gate = gate or RunGate()
        self._slot: tuple[dict[str, Any], dict[str, Any], float] | None = None
        self._ready = threading.Event()
        self._next_at = 0.0  # perf_counter() before which no copy is taken (CPU share)
        self._open = True
        self.requests = self.failures = self.nonfinite = 0
        self.agree = self.rows = 0.0
        self.max_rel: float | None = None
        self.candidate_s: list[float] = []
        self.incumbent_s: list[float] = []
        self.last_error: str | None = None
        self.elapsed_s = 0.0

    # ---- request thread ---------------------------------------------------------------------------------
    def offer(self, feeds: dict[str, Any], outputs: dict[str, Any], elapsed: float, cpu: float | None = None) -> None:
        """A live request the incumbent answered in `elapsed` s (`cpu` s of CPU time when measured); copied (its
        buffers may be reused) when a copy is wanted."""
        if self._slot is not None or not self._open or time.perf_counter() < self._next_at:
            return
        spent = cpu if self.cpu else elapsed
        if spent is None:
            return
        try:
            kept = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in outputs.items()}  # shm windows too
            self._slot = ({k: np.array(v, copy=True) for k, v in feeds.items()}, kept, spent)
            self._ready.set()
        except Exception:  # noqa: BLE001 - shadowing must never touch the client's request
            pass

    # ---- phase ------------------------------------------------------------------------------------------
    def run(self, check: Callable[[], None] = lambda: None) -> dict[str, Any]:
        """Compare until `requests` copies ran, `duration_s` passed or failures exceed the limit; returns the
        shadow block (requests, agreement, max_rel, latency_ratio, verdict, ...). check() may raise to abort."""
        cfg, t0 = self.config, self.clock()
        try:
            while self.requests < cfg.requests and self.failures + self.nonfinite <= cfg.max_failures:
                left = cfg.duration_s - (self.clock() - t0)
                if left <= 0:
                    break
                check()
                if not self._ready.wait(min(0.2, left)):
                    continue
                self._ready.clear()
                item, self._slot = self._slot, None
                if item is not None:
                    self._one(*item)
        finally:
            self._open = False
            self.elapsed_s = self.clock() - t0
        return self.result()

    def _one(self, feeds: dict[str, Any], reference: dict[str, Any], incumbent_s: float) -> None:
        alone = self.gate.begin(self.cpu, paced=False)  # paced by cpu_share here, not by the gate's duty
        mark = CpuMark(self.session) if alone else None
        t0 = time.perf_counter()
        try:
            try:
                try:
                    got = self.session.run(feeds, list(reference))
                    spent = mark.spent() if mark is not None else time.perf_counter() - t0
                finally:
                    held = self.gate.end(alone, mark)
            except Exception as exc:  # noqa: BLE001 - a candidate failure is a finding
                self.requests += 1
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                return
            if held or not self.cpu:  # a CPU time read while other runs were in flight is not this run's
                self.candidate_s.append(spent)
                self.incumbent_s.append(incumbent_s)
            self.requests += 1
            self._compare(reference, got)
        finally:  # the run and the comparison count against the CPU share
            busy = time.perf_counter() - t0
            self._next_at = time.perf_counter() + busy * (1.0 / self.config.cpu_share - 1.0)

    def _compare(self, reference: dict[str, Any], got: dict[str, Any]) -> None:
        for name, ref in reference.items():
            if type(ref) is not np.ndarray or name not in got:
                continue
            m = output_metrics(ref, got[name])
            if "error" in m:
                if "non-finite" in m["error"] and np.isfinite(ref).all():
                    self.nonfinite += 1  # NaN/Inf where the incumbent answered finite values
                self.rows += 1.0  # shape or NaN pattern differs: a disagreement
                continue
            if "top1_rows" in m:
                self.rows += m["top1_rows"]
                self.agree += m.get("top1_agreement", 0.0) * m["top1_rows"]
            elif "mismatches" in m:  # integer outputs (labels): exact agreement per element
                self.rows += ref.size
                self.agree += ref.size - m["mismatches"]
            if "max_rel" in m:
                self.max_rel = max(self.max_rel or 0.0, float(m["max_rel"]))

    def result(self, paired: dict[str, Any] | None = None) -> dict[str, Any]:
        """The shadow block. paired: the pairs' result (paired.Pairing.result) when they were enough to judge
        (serving.probation.paired_min_pairs): it decides compute time instead of the medians' 3x rule."""
        agreement = round(self.agree / self.rows, 4) if self.rows else None
        ratio = None
        slower = False  # over max_latency_ratio x the incumbent + slack_ms
        if self.candidate_s and self.incumbent_s:
            inc, cand = statistics.median(self.incumbent_s), statistics.median(self.candidate_s)
            ratio = round(cand / inc, 3) if inc > 0 else None
            limit = limit_ms(inc * 1000.0, self.config.max_latency_ratio, self.config.slack_ms)
            slower = cand * 1000.0 > limit
        doc: dict[str, Any] = {
            "requests": self.requests,
            "agreement": agreement,
            "max_rel": None if self.max_rel is None else float(f"{self.max_rel:.4g}"),
            "latency_ratio": ratio,
            "failures": self.failures,
            "nonfinite": self.nonfinite,
            "duration_s": round(self.elapsed_s, 3),
        }
        if self.last_error:
            doc["last_error"] = self.last_error
        if paired is not None:
            doc["paired"], doc["compute"] = paired, "paired"
        verdict, reason = self._verdict(agreement, ratio, slower, paired)
        if paired is not None and verdict == PASS:
            reason += f"; compute time by the pairs: {paired['verdict']}"
        elif ratio is None and verdict == PASS:  # agreement judged, compute time not: said, never implied
            doc["compute"] = "not judged"
            reason += f"; compute time not judged ({len(self.candidate_s)} candidate, {len(self.incumbent_s)} incumbent runs timed)"
        return {**doc, "verdict": verdict, "reason": reason}

    def _verdict(
        self, agreement: float | None, ratio: float | None, slower: bool, paired: dict[str, Any] | None
    ) -> tuple[str, str]:
        cfg, n = self.config, self.requests
        bad = self.failures + self.nonfinite
        agreed = f", top-1 agreement {agreement:.3f}" if agreement is not None else ""
        passed = f"shadow passed: {n} requests{agreed}"
        if bad > cfg.max_failures:
            what = f"{self.failures} failed" + (f", {self.nonfinite} with NaN/Inf" if self.nonfinite else "")
            return FAIL, f"shadow: {what} of {n} requests the incumbent answered (limit {cfg.max_failures})" + (
                f": {self.last_error}" if self.last_error else ""
            )
        if paired is not None and paired["verdict"] == SLOWER:  # the pairs end the trial before the swap
            return FAIL, f"shadow: {paired['reason']}"
        if n < cfg.min_requests:
            return INCONCLUSIVE, f"shadow: only {n} requests in {self.elapsed_s:.1f} s (need {cfg.min_requests})"
        if agreement is not None and agreement < cfg.min_agreement:
            return FAIL, (
                f"shadow: top-1 agreement {agreement:.3f} with the incumbent over {n} requests < {cfg.min_agreement:g}"
            )
        if cfg.max_rel is not None and self.max_rel is not None and self.max_rel > cfg.max_rel:
            return FAIL, f"shadow: max_rel {self.max_rel:.3g} against the incumbent over {n} requests > {cfg.max_rel:g}"
        if paired is not None:  # the pairs decide compute ("slower" failed above)
            return PASS, passed
        if ratio is not None and slower:
            return (
                FAIL,
                f"shadow: compute time {ratio:.2f}x the incumbent's over {n} requests > "
                f"{cfg.max_latency_ratio:g} x + {cfg.slack_ms:g} ms",
            )
        return PASS, passed
