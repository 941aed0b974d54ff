"""Per-model generation metrics on /metrics: requests, refusals (KV budget), cancellations (the client hung up),
tokens in and out, the KV bytes charged, and histograms of time to first token and time per output token; and the
KV budget's state (its limit, the bytes and streams held now), which all generative models share."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable
from typing import Any

from agent.serving.metrics import BUCKETS, Metric

P = "edge_agent_generation"


class GenStats:
    def __init__(self, model: str, budget: Callable[[], Any] | None = None) -> None:
        self.model = model
        self.budget = budget  # the model's KV budget as it is now (a KVBudget: limit, held, streams, ...)
        self._lock = threading.Lock()
        self.counts = {
            "requests_total": 0,
            "refused_total": 0,
            "cancelled_total": 0,
            "prompt_tokens_total": 0,
            "completion_tokens_total": 0,
            "kv_reserved_bytes_total": 0,
        }
        self.hist = {"ttft_seconds": _Hist(), "tpot_seconds": _Hist()}

    def reserved(self, nbytes: int) -> None:
        with self._lock:
            self.counts["kv_reserved_bytes_total"] += nbytes

    def refused(self) -> None:
        with self._lock:
            self.counts["refused_total"] += 1

    def record(self, prompt: int, completion: int, ttft: float | None, steps: list[float], cancelled: bool) -> None:
        with self._lock:
            c = self.counts
            c["requests_total"] += 1
            c["cancelled_total"] += int(cancelled)
            c["prompt_tokens_total"] += prompt
            c["completion_tokens_total"] += completion
            if ttft is not None:
                self.hist["ttft_seconds"].add(ttft)
            for s in steps:
                self.hist["tpot_seconds"].add(s)


class _Hist:
    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0

    def add(self, value: float) -> None:
        self.buckets[bisect.bisect_left(BUCKETS, value)] += 1
        self.sum += value


HELP = {
    "requests_total": ("counter", "Generations that ran (finished or cancelled)."),
    "refused_total": ("counter", "Generation requests refused by the KV-memory budget (503)."),
    "cancelled_total": ("counter", "Generations ended early because the client went away."),
    "prompt_tokens_total": ("counter", "Prompt tokens of the generations that ran."),
    "completion_tokens_total": ("counter", "Tokens generated."),
    "kv_reserved_bytes_total": (
        "counter",
        "Bytes of KV cache the KV budget charged the generations that started (prompt + max_tokens tokens, or "
        "max_length for a shared past/present buffer).",
    ),
    "ttft_seconds": ("histogram", "Time to the first generated token."),
    "tpot_seconds": ("histogram", "Time per output token after the first."),
}


BUDGET = {
    "kv_budget_bytes": (
        "limit",
        "The KV-memory budget of all generative models together (serving.generative.kv_budget).",
    ),
    "kv_held_bytes": ("held", "Bytes of the KV budget held by the generations in flight."),
    "streams_in_flight": ("streams", "Generations in flight (each holds a KV lease and an HTTP worker)."),
    "max_streams": ("max_streams", "Generations at once allowed (serving.generative.max_streams)."),
    "waiting": ("waiting", "Requests waiting in line for KV room (serving.generative.queue_s)."),
}


def families(stats: Iterable[GenStats]) -> list[Metric]:
    fams = {k: Metric(f"{P}_{k}", kind, text) for k, (kind, text) in HELP.items()}
    budget: Any = None
    for s in stats:
        budget = budget or (s.budget() if s.budget else None)  # one, shared by every model (serving.generative)
        lab = {"model": s.model}
        with s._lock:
            for k, v in s.counts.items():
                fams[k].samples.append(("", lab, float(v)))
            for k, h in s.hist.items():
                total = 0
                for le, n in zip([*(str(b) for b in BUCKETS), "+Inf"], h.buckets, strict=True):
                    total += n
                    fams[k].samples.append(("_bucket", {**lab, "le": le}, float(total)))
                fams[k].samples.append(("_sum", lab, h.sum))
                fams[k].samples.append(("_count", lab, float(total)))
    out = list(fams.values())
    if budget is not None:
        out += [Metric(f"{P}_{k}", "gauge", t, [("", {}, float(getattr(budget, a)))]) for k, (a, t) in BUDGET.items()]
    return out
