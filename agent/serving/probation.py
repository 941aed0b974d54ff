"""Probation: after a swap, watch one (model, version) for errors, NaN/Inf outputs and latency against
the qualified numbers; call on_trouble(reason) at the first sign of trouble, on_pass(verdict) at the end."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.serving.metrics import percentile

WATCHING, PASSED, TROUBLE, SUPERSEDED, STOPPED = "watching", "passed", "trouble", "superseded", "stopped"


@dataclass(frozen=True)
class Thresholds:
    """What probation tolerates. Latency is judged on p99 once `p99_samples` requests succeeded, on p90
    from `p90_samples` (FACTS: 662 samples to claim a p99, 64 for a p90), not at all below that."""

    max_errors: int = 0  # runtime failures tolerated in the window
    max_nonfinite: int = 0  # responses holding NaN/Inf tolerated in the window
    latency_factor: float = 1.5  # observed quantile may reach factor x qualified p99 ...
    latency_slack_ms: float = 1.0  # ... plus this (scheduler noise dominates sub-ms models)
    p90_samples: int = 64
    p99_samples: int = 662
    min_requests: int = 0  # requests needed to pass; 0: a quiet window passes


@dataclass(frozen=True)
class Verdict:
    state: str  # watching | passed | trouble | superseded | stopped
    reason: str
    figures: dict = field(default_factory=dict)


class Probation:
    """Watches registry stats of (name, version) from construction on. Pure logic in evaluate();
    start() runs it on a timer thread until the window ends or trouble shows."""

    def __init__(
        self,
        registry,
        name: str,
        version,
        baseline_latency_ms: float | None,
        window: float = 60.0,
        thresholds: Thresholds | None = None,
        on_trouble: Callable[[str], None] | None = None,
        on_pass: Callable[[Verdict], None] | None = None,
        *,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry, self.name, self.version = registry, name, str(version)
        self.baseline_ms = baseline_latency_ms
        self.window = float(window)
        self.thresholds = thresholds or Thresholds()
        self.on_trouble, self.on_pass = on_trouble, on_pass
        self.interval = interval if interval is not None else max(0.05, min(1.0, self.window / 20))
        self.clock = clock
        self.stats = registry.model_stats(name, self.version)
        snap = self.stats.snapshot()
        self._base = (snap["requests"], snap["errors"], snap["nonfinite"])
        self._started = clock()
        self.stats.watch(True)  # every response of this version is checked for NaN/Inf until the verdict
        self._watching = True
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.verdict = Verdict(WATCHING, "probation started", {})
        self.callback_error: str | None = None

    # ---- pure logic -----------------------------------------------------------------------------------
    def figures(self) -> dict:
        snap = self.stats.snapshot()
        requests = snap["requests"] - self._base[0]
        errors = snap["errors"] - self._base[1]
        ok = requests - errors
        lat = sorted(self.stats.latencies(last=ok)) if ok > 0 else []
        return {
            "requests": requests,
            "errors": errors,
            "nonfinite": snap["nonfinite"] - self._base[2],
            "latency_samples": len(lat),
            "p90_ms": _ms(percentile(lat, 90)),
            "p99_ms": _ms(percentile(lat, 99)),
            "baseline_p99_ms": self.baseline_ms,
            "elapsed_s": round(self.clock() - self._started, 3),
        }

    def evaluate(self) -> Verdict:
        """Judge what has been seen so far; does not call back."""
        f, t = self.figures(), self.thresholds
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
                f"(limit {t.max_nonfinite})",
                f,
            )
        slow = self._latency_trouble(f)
        if slow:
            return Verdict(TROUBLE, slow, f)
        if f["elapsed_s"] < self.window:
            return Verdict(WATCHING, f"{f['requests']} requests, no trouble yet", f)
        if f["requests"] < t.min_requests:
            return Verdict(
                TROUBLE,
                f"probation: only {f['requests']} requests in {self.window:g} s (need {t.min_requests} to judge)",
                f,
            )
        return Verdict(
            PASSED, f"probation passed: {f['requests']} requests, no errors, no NaN/Inf, latency within limits", f
        )

    def _latency_trouble(self, f: dict) -> str | None:
        t, n = self.thresholds, f["latency_samples"]
        if self.baseline_ms is None or n < t.p90_samples:
            return None
        q, value = ("p99", f["p99_ms"]) if n >= t.p99_samples else ("p90", f["p90_ms"])
        limit = self.baseline_ms * t.latency_factor + t.latency_slack_ms
        if value > limit:
            return (
                f"probation: {q} latency {value:.3f} ms over {n} requests > {limit:.3f} ms "
                f"({t.latency_factor:g} x qualified p99 {self.baseline_ms:.3f} ms + {t.latency_slack_ms:g} ms)"
            )
        return None

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


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 4)
