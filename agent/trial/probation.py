"""Probation: after a swap, watch one (model, version) for failures and NaN/Inf outputs blamed on it, and
judge its compute time like with like (against the incumbent before the swap, else its qualified figures);
call on_trouble(reason) at the first sign of trouble, on_pass(verdict) at the end."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.serving.metrics import percentile
from agent.trial import unjudged
from agent.trial.judge import QuantileTest, quantile_test, rate
from agent.trial.paired import rule_of
from agent.trial.pairjudge import NOT_JUDGED as PAIRS_NOT_JUDGED
from agent.trial.pairjudge import SLOWER, PairedRule
from agent.trial.settings import ProbationConfig

WATCHING, PASSED, TROUBLE, SUPERSEDED, STOPPED = "watching", "passed", "trouble", "superseded", "stopped"
CPU, WALL = "cpu", "wall"  # what "compute time" measures (compute_measure)
Thresholds = ProbationConfig  # what probation tolerates (serving.probation)


@dataclass(frozen=True)
class Verdict:
    state: str  # watching | passed | trouble | superseded | stopped | not judged (agent.trial.unjudged)
    reason: str
    figures: dict[str, Any] = field(default_factory=dict[str, Any])


@dataclass(frozen=True)
class Baseline:
    """What the candidate's compute time is compared with: the incumbent's runs before the swap, or (no
    incumbent, too few of its runs, or a request rate not comparable) the qualified figures."""

    source: str  # "incumbent" | "qualified"
    samples_s: tuple[float, ...] = ()  # sorted compute times (incumbent)
    rate: float | None = None  # requests per second (incumbent)
    requests: int = 0  # requests the incumbent ran in the window (sampled for CPU time or not)
    version: str | None = None
    qualified_ms: dict[str, Any] = field(default_factory=dict[str, Any])  # p50/p90/p99 of qualification (no contention)

    def quantile_ms(self, q: int) -> float | None:
        if self.source == "incumbent":
            v = percentile(list(self.samples_s), q)
            return None if v is None else v * 1000.0
        v = self.qualified_ms.get(f"p{q}")
        return float(v) if isinstance(v, (int, float)) and v > 0 else None


def compute_measure(provider: str | None, device: str | None = None) -> str:
    """ "cpu" (the run's CPU time, every runtime thread counted (rungate.py): immune to other processes taking the cores) where the
    model computes on the host CPU, "wall" (time inside the run) where it waits for an accelerator."""
    if provider in (None, "cpu", "xnnpack", "acl", "CPU"):  # "CPU": OpenVINO's device name (openvino-genai rows)
        return CPU
    if provider in ("openvino", "ort-openvino") and str(device or "CPU").upper().startswith("CPU"):
        return CPU
    return WALL


def incumbent_baseline(
    registry: Any, name: str, version: str | None, window_s: float, until: float | None, measure: str = CPU
) -> Baseline | None:
    """The incumbent's compute times over window_s seconds up to `until` (a perf_counter() value; None: up to
    its last run), or None when the registry holds no statistics for it."""
    if version is None:
        return None
    try:
        stats = registry.model_stats(name, version)
    except Exception:  # noqa: BLE001 - never activated here (a restart lost its statistics)
        return None
    end = until if until is not None else (stats.last_end() or 0.0)
    wall, span = stats.window(end - window_s, end)  # the rate counts every request, sampled or not
    values = stats.window(end - window_s, end, cpu=True)[0] if measure == CPU else wall
    return Baseline(
        "incumbent", tuple(sorted(values)), rate=rate(span, len(wall)), version=str(version), requests=len(wall)
    )


class Probation:
    """Watches registry stats of (name, version) from construction on. Pure logic in evaluate();
    start() runs it on a timer thread until the window ends or trouble shows."""

    def __init__(
        self,
        registry: Any,
        name: str,
        version: Any,
        qualified_ms: dict[str, Any] | None = None,
        window: float = 60.0,
        thresholds: ProbationConfig | None = None,
        on_trouble: Callable[[str], None] | None = None,
        on_pass: Callable[[Verdict], None] | None = None,
        *,
        incumbent: Baseline | None = None,
        measure: str = CPU,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        pairing: Any = None,
    ) -> None:
        """qualified_ms: the qualification's latency_ms (p50/p90/p99), None when unknown or measured under
        contention; incumbent: the baseline before the swap (incumbent_baseline()), None on a first deployment;
        pairing: a started paired.Pairing of the incumbent and this version: when given, its verdict decides compute
        time (the window's quantile tests are reported beside it)."""
        self.pairing = pairing
        self.registry, self.name, self.version = registry, name, str(version)
        self.qualified = {k: v for k, v in (qualified_ms or {}).items() if k in ("p50", "p90", "p99")}
        self.incumbent = incumbent
        self.measure = measure
        self._why_qualified: str | None = None
        self.window = float(window)
        self.thresholds = thresholds or ProbationConfig()
        self.on_trouble, self.on_pass = on_trouble, on_pass
        self.interval = interval if interval is not None else max(0.05, min(1.0, self.window / 20))
        self.clock = clock
        self.stats = registry.model_stats(name, self.version)
        snap = self.stats.snapshot()
        counted = ("requests", "errors", "nonfinite", "request_failures", "request_nonfinite", "contended")
        self._base = {k: snap[k] for k in counted}
        self._since = time.perf_counter()  # the candidate's runs from here on are judged
        self._started = clock()
        self.stats.watch(True)  # every response of this version is checked for NaN/Inf until the verdict
        self._watching = True
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.verdict = Verdict(WATCHING, "probation started", {})
        self.callback_error: str | None = None

    # ---- pure logic -----------------------------------------------------------------------------------
    def _samples(self) -> tuple[list[float], list[float], float | None]:
        """(sorted compute times, sorted wall times in the run, request rate) since probation began."""
        wall, span = self.stats.window(self._since)
        compute = self.stats.window(self._since, cpu=True)[0] if self.measure == CPU else wall
        return sorted(compute), sorted(wall), rate(span, len(wall))

    def figures(self, judge: bool = False) -> dict[str, Any]:
        snap = self.stats.snapshot()
        d = {k: snap[k] - v for k, v in self._base.items()}
        lat, wall, req_rate = self._samples()
        f: dict[str, Any] = {
            "requests": d["requests"],
            "errors": d["errors"],
            "nonfinite": d["nonfinite"],
            "request_caused": d["request_failures"] + d["request_nonfinite"],
            "measure": self.measure,
            "compute_samples": len(lat),
            "compute_contended": d["contended"],  # measured runs dropped: their threads waited for the cores
            **{f"compute_p{q}_ms": _ms(percentile(lat, q)) for q in (50, 90, 99)},
            "latency_samples": len(wall),  # wall time inside the run (reported, not judged with measure=cpu)
            **{f"p{q}_ms": _ms(percentile(wall, q)) for q in (50, 90, 99)},
            "rate": _round(req_rate),
            "elapsed_s": round(self.clock() - self._started, 3),
        }
        base = self._baseline(len(lat), req_rate)
        f["baseline"] = self._baseline_figures(base)
        if judge and base is not None:
            tests = self._tests(base, lat)
            f["compute"] = [t.to_dict() for t in tests]
            slow = [t for t in tests if t.slower]
            if slow:
                f["_slow"] = max(slow, key=lambda t: t.ratio)
        return f

    def _baseline(self, n: int, req_rate: float | None) -> Baseline | None:
        """The incumbent when it has enough runs at a comparable request rate, else the qualified figures."""
        inc, t = self.incumbent, self.thresholds
        self._why_qualified = "no incumbent (first deployment)" if inc is None else None
        if inc is not None:
            if len(inc.samples_s) < t.p90_samples:
                self._why_qualified = (
                    f"only {len(inc.samples_s)} of the incumbent's {inc.requests} runs before the swap were measured "
                    f"(need {t.p90_samples})"
                )
            elif (
                inc.rate is None
                or req_rate is None
                or not (1.0 / t.rate_tolerance <= req_rate / inc.rate <= t.rate_tolerance)
            ):
                self._why_qualified = (
                    f"request rate {_round(req_rate)}/s is not comparable with the incumbent's {_round(inc.rate)}/s"
                )
            else:
                return inc
        if not self.qualified:
            return None
        return Baseline("qualified", qualified_ms=self.qualified)

    def _baseline_figures(self, base: Baseline | None) -> dict[str, Any]:
        if base is None:
            none: dict[str, Any] = {
                "source": None,
                "why": (self._why_qualified or "") + "; no qualified figures (or contended)",
            }
            inc = self.incumbent
            if inc is not None and len(inc.samples_s) < self.thresholds.p90_samples <= inc.requests:
                # the incumbent served enough runs, but too few were measured: they waited for the cores
                none["contended"] = inc.requests - len(inc.samples_s)
            return none
        out: dict[str, Any] = {"source": base.source}
        if base.source == "incumbent":
            out.update(version=base.version, samples=len(base.samples_s), rate=_round(base.rate))
        elif self._why_qualified:
            out["why"] = self._why_qualified
        out.update({f"p{q}_ms": _round(base.quantile_ms(q), 4) for q in (50, 90, 99)})
        return out

    def _tests(self, base: Baseline, lat: list[float]) -> list[QuantileTest]:
        t = self.thresholds
        incumbent = base.source == "incumbent"
        quantiles = t.quantiles if incumbent else t.qualified_quantiles
        factor = t.ratio if incumbent else t.qualified_factor
        out = []
        for q in quantiles:
            need = t.p99_samples if q >= 99 else t.p90_samples
            ref = base.quantile_ms(q)
            if ref is None or len(lat) < need or (incumbent and len(base.samples_s) < need):
                continue
            out.append(quantile_test(lat, ref, q, factor, t.slack_ms, t.alpha))
        return out

    def evaluate(self) -> Verdict:
        """Judge what has been seen so far; does not call back. Failures and NaN/Inf blamed on the version trip
        at once; compute time is judged once, when the window has ended."""
        t = self.thresholds
        elapsed = self.clock() - self._started
        ended = elapsed >= self.window
        f = self.figures(judge=ended)
        slow = f.pop("_slow", None)
        if self.registry.models().get(self.name) != self.version:
            return Verdict(SUPERSEDED, f"{self.name} is no longer serving version {self.version}", f)
        if f["errors"] > t.max_errors:
            return Verdict(
                TROUBLE, f"probation: {f['errors']} failed requests of {f['requests']} (limit {t.max_errors})", f
            )
        if f["nonfinite"] > t.max_nonfinite:
            return Verdict(
                TROUBLE,
                f"probation: {f['nonfinite']} responses with NaN/Inf outputs of {f['requests']} "
                f"(limit {t.max_nonfinite}; inputs holding NaN/Inf are not counted)",
                f,
            )
        if not ended:
            return Verdict(WATCHING, f"{f['requests']} requests, no trouble yet", f)
        if self.pairing is not None:
            return self._paired_verdict(f, elapsed)
        if slow is not None:
            return Verdict(TROUBLE, self._slow_reason(slow, f), f)
        short = self._runs_short(f)
        if short and elapsed < self.window * t.extend:
            f["extended"] = True
            return Verdict(
                WATCHING,
                f"{f['requests']} requests, no trouble yet; compute time needs {short} more measured runs "
                f"({f['compute_contended']} dropped: their threads waited for the cores), watching up to "
                f"{self.window * t.extend:g} s",
                f,
            )
        if f["requests"] < t.min_requests:
            return Verdict(
                TROUBLE,
                f"probation: only {f['requests']} requests in {self.window:g} s (need {t.min_requests} to judge)",
                f,
            )
        if unjudged.compute_unjudged(f, t.p90_samples):  # the device never had the cores: said, not passed
            f["not_judged"] = unjudged.compute_counts(f, t.p90_samples)
            return Verdict(unjudged.NOT_JUDGED, unjudged.reason("probation", f["not_judged"]), f)
        if unjudged.runs_unjudged(f):  # runs came but none was judged (too few measured, no baseline): said
            f["not_judged"] = unjudged.skip_counts(f, t.p90_samples, self._unjudged(f))
            return Verdict(unjudged.NOT_JUDGED, unjudged.reason("probation", f["not_judged"]), f)
        judged = ", ".join(f"p{c['q']} x{c['ratio']:.2f}" for c in f.get("compute", []))
        against = f["baseline"]["source"]
        how = (
            f"compute time {judged} of the {against}'s" if judged else f"compute time not judged ({self._unjudged(f)})"
        )
        return Verdict(
            PASSED, f"probation passed: {f['requests']} requests, no failures or NaN/Inf blamed on it, {how}", f
        )

    def _paired_verdict(self, f: dict[str, Any], elapsed: float) -> Verdict:
        return paired_verdict(self.pairing, rule_of(self.thresholds), f, elapsed, self.window, self.thresholds)

    def _runs_short(self, f: dict[str, Any]) -> int:
        """How many more of the candidate's runs a compute verdict needs, when none was judged only for want of
        them (a baseline is there, and the requests came: their runs were dropped as contended); else 0."""
        need = self.thresholds.p90_samples
        if f.get("compute") or f["baseline"].get("source") is None or f["compute_samples"] >= need:
            return 0
        return need - f["compute_samples"] if f["compute_contended"] else 0

    def _unjudged(self, f: dict[str, Any]) -> str:
        """Why no compute-time quantile was judged."""
        base = f["baseline"]
        if base.get("source") is None:
            return f"no baseline: {base.get('why')}"
        need = self.thresholds.p90_samples
        if f["compute_samples"] < need:
            dropped = f["compute_contended"]
            kept = f"{dropped} more measured while its threads waited for the cores, dropped" if dropped else ""
            return f"{f['compute_samples']} runs measured of the {need} needed" + (f"; {kept}" if kept else "")
        return f"the {base['source']}'s figures have too few samples"

    def _slow_reason(self, t: QuantileTest, f: dict[str, Any]) -> str:
        base = f["baseline"]
        if base["source"] == "incumbent":
            whose = f"the incumbent's (version {base['version']}, {base['samples']} runs at {base['rate']}/s before the swap)"
            how = f"{self.thresholds.ratio:g} x + {self.thresholds.slack_ms:g} ms"
        else:
            whose = "the qualified figure"
            how = f"{self.thresholds.qualified_factor:g} x + {self.thresholds.slack_ms:g} ms"
        what = "CPU time in the run" if self.measure == CPU else "time in the run"
        return (
            f"probation: compute ratio {t.ratio:.2f} at p{t.q} ({what}): {t.candidate_ms:.3f} ms over {t.samples} runs "
            f"at {f['rate']}/s vs {t.reference_ms:.3f} ms, {whose}; {t.above} runs above the limit "
            f"{t.limit_ms:.3f} ms ({how}), one-sided binomial p={t.p_value:.2g} < {self.thresholds.alpha:g}"
        )

    # ---- timer thread ---------------------------------------------------------------------------------
    def start(self) -> "Probation":
        self._thread = threading.Thread(target=self._loop, name=f"probation-{self.name}-{self.version}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch without calling back (cancel, superseding deployment, shutdown)."""
        self._stop.set()
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if not self._done.is_set():
            self._finish(Verdict(STOPPED, "probation stopped", self.figures()), callback=False)

    def wait(self, timeout: float | None = None) -> Verdict:
        """Block until a final verdict (or timeout); returns the current verdict."""
        self._done.wait(timeout)
        return self.verdict

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            verdict = self.evaluate()
            if verdict.state != WATCHING:
                self._finish(verdict, callback=True)
                return

    def _finish(self, verdict: Verdict, callback: bool) -> None:
        self.verdict = verdict
        if self._watching:
            self._watching = False
            self.stats.watch(False)
        try:
            if callback and verdict.state == TROUBLE and self.on_trouble:
                self.on_trouble(verdict.reason)
            elif callback and verdict.state == PASSED and self.on_pass:
                self.on_pass(verdict)
        except Exception as exc:  # noqa: BLE001 - keep the thread alive; the owner reads callback_error
            self.callback_error = f"{type(exc).__name__}: {exc}"
        finally:
            self._done.set()


def paired_verdict(
    pairing: Any, rule: PairedRule, f: dict[str, Any], elapsed: float, window: float, t: ProbationConfig
) -> Verdict:
    """Compute time judged by the pairs (paired.py, pairjudge.py; a generative model's TPOT: genpaired.py):
    slower is trouble; not judged watches on up to `extend` windows, then is its own outcome with the counts;
    not slower passes. `f`: the figures so far (their "requests"); the paired block is added to them."""
    paired = f["paired"] = pairing.result(rule)
    f["paired_runs"] = pairing.counts()
    if paired["verdict"] == SLOWER:
        return Verdict(TROUBLE, f"probation: {paired['reason']}", f)
    if paired["verdict"] == PAIRS_NOT_JUDGED and f["requests"] == 0 and t.min_requests == 0:
        # a quiet window: nothing came, so nothing was skipped; min_requests decides it, as without pairs
        return Verdict(PASSED, "probation passed: no request in the window (serving.probation.min_requests is "
                       "0): compute time not judged, nothing to pair", f)  # fmt: skip
    if paired["verdict"] == PAIRS_NOT_JUDGED and elapsed < window * t.extend:
        f["extended"] = True
        return Verdict(WATCHING, f"{f['requests']} requests, no trouble yet; {paired['reason']}; watching up to "
                       f"{window * t.extend:g} s", f)  # fmt: skip
    if f["requests"] < t.min_requests:
        return Verdict(TROUBLE, f"probation: only {f['requests']} requests in {window:g} s", f)
    if paired["verdict"] == PAIRS_NOT_JUDGED:
        f["not_judged"] = {"signal": "paired", "measured": paired["pairs"], "needed": t.paired_min_pairs,
                           "contended": f["paired_runs"]["dropped"], "requests": f["requests"],
                           "aa": paired["aa"]["pairs"]}  # fmt: skip
        return Verdict(unjudged.NOT_JUDGED, f"probation: compute time not judged: {paired['reason']}", f)
    return Verdict(PASSED, f"probation passed: {f['requests']} requests, no failures or NaN/Inf blamed on it, "
                   f"{paired['reason']}", f)  # fmt: skip


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 4)


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)
