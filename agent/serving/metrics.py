"""Per-model serving statistics (counters, latency histogram, percentiles) and Prometheus text exposition."""

from __future__ import annotations

import bisect
import math
import threading
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# Latency buckets in seconds: edge models run from microseconds to seconds.
BUCKETS: tuple[float, ...] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
RECENT = 4096  # latency samples kept for percentiles (field notes: 662 needed to claim a p99)
PENDING = 256  # plain latencies appended lock-free before they are folded into the counters
FINITE_FIRST = 1000  # a version's first responses are all checked for NaN/Inf ...
FINITE_EVERY = 16  # ... then one in this many, except while a probation watches it (then every response)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of an already sorted list; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


class ModelStats:
    """Counters and latencies of one (model, version). record() and add() are thread-safe and cheap."""

    def __init__(self, model: str, version: str) -> None:
        self.model, self.version = model, version
        self.requests = 0  # requests that reached the runtime
        self.errors = 0  # runtime failures blamed on the model
        self.request_failures = 0  # runtime failures the request caused (NaN/Inf or invalid input; not counted)
        self.request_nonfinite = 0  # NaN/Inf outputs the request caused (its input held NaN/Inf; not counted)
        self.rejected = 0  # requests refused by validation (client mistakes)
        self.nonfinite = 0  # successful responses found holding NaN or Inf
        self.finite_checked = 0  # successful responses checked for NaN/Inf
        self.contended = 0  # runs measured for CPU time and dropped: their threads were kept off the cores (rungate)
        self.watchers = 0  # probations watching this version: every response is checked while > 0
        self.finite_every = FINITE_EVERY  # 1: check every response
        self.latency_sum = 0.0
        self.buckets = [0] * (len(BUCKETS) + 1)
        self._ring = array("d", bytes(8 * RECENT))  # 32 KB of raw doubles, not 4096 float objects
        self._stamps = array("d", bytes(8 * RECENT))  # perf_counter() when each kept latency's run ended
        self._seen = 0  # successful latencies recorded so far
        # CPU time of the run, every runtime thread counted (rungate.py), measured on the sampled requests (those checked for
        # NaN/Inf: all while watched and a version's first FINITE_FIRST, then one in finite_every).
        self._cpu = array("d", bytes(8 * RECENT))
        self._cpu_stamps = array("d", bytes(8 * RECENT))
        self._cpu_seen = 0
        self._lock = threading.Lock()
        # Latencies of plain successful requests, appended without the lock by add() (array.append and
        # del a[:n] are single C calls under the GIL: nothing is lost) and folded into the counters above by
        # the next reader, or every PENDING requests. _ends holds their end times the same way; two appends
        # racing may pair a latency with the end time of a request that ended at the same moment (harmless).
        self._pending = array("d")
        self._ends = array("d")

    def check_finite(self) -> bool:
        """Should the response about to be recorded be checked for NaN/Inf? Every one while watched and for a
        version's first FINITE_FIRST, then one in finite_every (hot path: an unlocked read; a race only moves
        the sample by one request)."""
        n = self.requests + len(self._pending)
        return bool(self.watchers) or n < FINITE_FIRST or not n % self.finite_every

    def watch(self, on: bool = True) -> None:
        """A probation starts (on) or ends (off) watching: every response is checked meanwhile."""
        with self._lock:
            self.watchers = max(0, self.watchers + (1 if on else -1))

    def record(
        self,
        seconds: float,
        ok: bool = True,
        nonfinite: bool | None = None,
        end: float = 0.0,
        caused: bool = False,
        cpu: float | None = None,
        contended: bool = False,
    ) -> None:
        """One request that reached the runtime; nonfinite is None when its outputs were not checked; caused:
        the request itself caused the failure or the NaN/Inf (counted apart, never against the version);
        cpu: the run's CPU seconds, every runtime thread counted (rungate.py), when measured; contended: it was
        measured and dropped (its threads were kept off the cores)."""
        with self._lock:
            self.contended += bool(ok and contended)
            if ok and cpu is not None:
                i = self._cpu_seen % RECENT
                self._cpu[i], self._cpu_stamps[i] = cpu, end
                self._cpu_seen += 1
            if not ok:
                self.requests += 1
                if caused:
                    self.request_failures += 1
                else:
                    self.errors += 1
                return
            if nonfinite is not None:
                self.finite_checked += 1
                if nonfinite and caused:
                    self.request_nonfinite += 1
                elif nonfinite:
                    self.nonfinite += 1
            self._ends.append(end)
            self._pending.append(seconds)
            self._fold()  # counts it, with its latency, after the ones added before it

    def add(self, seconds: float, end: float = 0.0) -> None:
        """record(seconds) of a successful request whose outputs were not checked: the hot path, no lock.
        end: time.perf_counter() when its run ended (compute-time windows of probation read it)."""
        self._ends.append(end)
        pending = self._pending
        pending.append(seconds)
        if len(pending) >= PENDING:
            with self._lock:
                self._fold()

    def _fold(self) -> None:
        """Count pending successful requests and their latencies (call with the lock held)."""
        pending, ends = self._pending, self._ends
        n = min(len(pending), len(ends))  # an end time is appended before its latency
        if not n:
            return
        values, stamps = pending[:n], ends[:n]
        del pending[:n]  # appends made meanwhile stay
        del ends[:n]
        self.requests += n
        self.latency_sum += sum(values)
        buckets, ring, times, seen = self.buckets, self._ring, self._stamps, self._seen
        for v, t in zip(values, stamps):
            buckets[bisect.bisect_left(BUCKETS, v)] += 1
            ring[seen % RECENT] = v
            times[seen % RECENT] = t
            seen += 1
        self._seen = seen

    def reject(self) -> None:
        with self._lock:
            self.rejected += 1

    def latencies(self, last: int | None = None) -> list[float]:
        """The most recent successful latencies in seconds (all kept ones when last is None)."""
        with self._lock:
            self._fold()
            values = self._recent()
        return values if last is None else values[max(0, len(values) - last) :]

    def window(self, since: float, until: float = math.inf, cpu: bool = False) -> tuple[list[float], float]:
        """(kept successful latencies in seconds of the runs that ended in [since, until], the seconds between
        the first and the last of those ends); times are time.perf_counter() values. cpu: the CPU time
        of the measured runs (rungate.py) instead of the wall time of every run."""
        with self._lock:
            self._fold()
            if cpu:
                n, ring, times = min(self._cpu_seen, RECENT), self._cpu, self._cpu_stamps
            else:
                n, ring, times = min(self._seen, RECENT), self._ring, self._stamps
            hits = [i for i in range(n) if since <= times[i] <= until]
            span = (max(times[i] for i in hits) - min(times[i] for i in hits)) if hits else 0.0
            return [ring[i] for i in hits], span

    def last_end(self) -> float | None:
        """perf_counter() when the latest kept successful run ended (None before the first)."""
        with self._lock:
            self._fold()
            return self._stamps[(self._seen - 1) % RECENT] if self._seen else None

    def _recent(self) -> list[float]:
        """Kept latencies, oldest first (call with the lock held)."""
        n, ring = self._seen, self._ring
        if n <= RECENT:
            return ring[:n].tolist()
        cut = n % RECENT
        return ring[cut:].tolist() + ring[:cut].tolist()

    def snapshot(self) -> dict[str, Any]:
        """Counters plus p50/p90/p99 in ms over the recent window (None when there are no samples)."""
        with self._lock:
            self._fold()
            counts = {
                "requests": self.requests,
                "errors": self.errors,
                "rejected": self.rejected,
                "nonfinite": self.nonfinite,
                "finite_checked": self.finite_checked,
                "contended": self.contended,
                "request_failures": self.request_failures,
                "request_nonfinite": self.request_nonfinite,
            }
            lat = sorted(self._recent())
        ms = {f"p{q}_ms": (None if v is None else v * 1000.0) for q in (50, 90, 99) for v in [percentile(lat, q)]}
        return {"model": self.model, "version": self.version, **counts, **ms, "latency_samples": len(lat)}


@dataclass
class Metric:
    """One Prometheus metric family: samples are (suffix, labels, value)."""

    name: str
    kind: str  # counter | gauge | histogram | summary | untyped
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def gauge(name: str, help: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    """A one-sample gauge, the usual shape of what a collector hook adds."""
    return Metric(name, "gauge", help, [("", dict(labels or {}), float(value))])


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


def render(families: Iterable[Metric]) -> str:
    """Prometheus text exposition format 0.0.4."""
    lines: list[str] = []
    for fam in families:
        lines.append(f"# HELP {fam.name} {fam.help}")
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        for suffix, labels, value in fam.samples:
            lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(
                f"{fam.name}{suffix}{{{lab}}} {_number(value)}" if lab else f"{fam.name}{suffix} {_number(value)}"
            )
    return "\n".join(lines) + "\n"


def model_families(stats: Iterable[ModelStats], loaded: dict[str, str]) -> list[Metric]:
    """Metric families for every (model, version) seen; loaded maps model -> serving version."""
    p = "edge_agent_inference"
    fams = {
        k: Metric(f"{p}_{k}", kind, text)
        for k, kind, text in [
            ("requests_total", "counter", "Inference requests that reached the runtime."),
            ("failures_total", "counter", "Inference requests the runtime failed."),
            ("rejected_total", "counter", "Inference requests refused by validation (client mistakes)."),
            ("nonfinite_total", "counter", "Checked responses found holding NaN or Inf."),
            (
                "request_caused_total",
                "counter",
                "Runtime failures and NaN/Inf outputs caused by the request (NaN/Inf or invalid input); "
                "never counted against the version.",
            ),
            (
                "finite_checked_total",
                "counter",
                "Successful responses checked for NaN/Inf (all while on probation "
                f"and the first {FINITE_FIRST}, then one in {FINITE_EVERY}).",
            ),
            ("latency_seconds", "histogram", "Runtime latency of successful inference requests."),
        ]
    }
    quant = Metric(f"{p}_latency_recent_seconds", "summary", f"Latency quantiles over the last {RECENT} requests.")
    for s in stats:
        lab = {"model": s.model, "version": s.version}
        with s._lock:
            s._fold()
            counts = (
                s.requests,
                s.errors,
                s.rejected,
                s.nonfinite,
                s.request_failures + s.request_nonfinite,
                s.finite_checked,
            )
            buckets, total, recent = list(s.buckets), s.latency_sum, sorted(s._recent())
        for key, value in zip(
            (
                "requests_total",
                "failures_total",
                "rejected_total",
                "nonfinite_total",
                "request_caused_total",
                "finite_checked_total",
            ),
            counts,
        ):
            fams[key].samples.append(("", lab, value))
        running = 0
        for bound, count in zip((*BUCKETS, math.inf), buckets):
            running += count
            fams["latency_seconds"].samples.append(("_bucket", {**lab, "le": _number(bound)}, running))
        fams["latency_seconds"].samples += [("_sum", lab, total), ("_count", lab, running)]
        for q in (0.5, 0.9, 0.99):
            v = percentile(recent, q * 100)
            if v is not None:
                quant.samples.append(("", {**lab, "quantile": str(q)}, v))
        quant.samples += [("_sum", lab, sum(recent)), ("_count", lab, len(recent))]
    up = Metric("edge_agent_model_loaded", "gauge", "1 for the version each model is serving.")
    up.samples = [("", {"model": m, "version": v}, 1) for m, v in sorted(loaded.items())]
    return [*fams.values(), quant, up]


Collector = Callable[[], Iterable[Metric]]
