"""The KV-memory budget of the generative models a daemon serves: a request holds the KV cache it can grow to
(its prompt plus max_tokens, or max_length when the model preallocates a shared past/present buffer) from its
first token to its last; a request that cannot fit is refused with the reason (503), never run into an OOM."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from agent.serving.errors import ServerBusy


@dataclass(frozen=True)
class KVShape:
    """What one token of KV cache costs, read from genai_config.json."""

    layers: int
    kv_heads: int
    head_size: int
    dtype_bytes: int
    max_length: int
    shared_buffer: bool  # search.past_present_share_buffer: the cache is allocated at max_length up front

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_size * self.dtype_bytes  # keys and values

    def bytes_for(self, tokens: int) -> int:
        return self.bytes_per_token * (self.max_length if self.shared_buffer else min(tokens, self.max_length))


def kv_shape(model_dir: Path, dtype_bytes: int = 4) -> KVShape:
    cfg = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))
    dec, search = cfg["model"]["decoder"], cfg.get("search") or {}
    heads = int(dec.get("num_key_value_heads") or dec["num_attention_heads"])
    max_length = int(search.get("max_length") or cfg["model"].get("context_length"))
    return KVShape(
        int(dec["num_hidden_layers"]),
        heads,
        int(dec["head_size"]),
        dtype_bytes,
        max_length,
        bool(search.get("past_present_share_buffer", False)),
    )


class KVBudget:
    """Bytes of KV cache held by the streams in flight, against a limit (all generative models together)."""

    def __init__(self, limit_bytes: int, max_streams: int = 8, queue_s: float = 0.0) -> None:
        self.limit = int(limit_bytes)
        self.max_streams = int(max_streams)  # each stream holds one of the HTTP front's worker threads
        self.queue_s = float(queue_s)  # how long a request that does not fit waits for room (0: refused at once)
        self.held = 0
        self.streams = 0
        self.waiting = 0
        self._room = threading.Condition()

    def lease(self, nbytes: int, what: str) -> Lease:
        """Hold `nbytes` (ServerBusy with the reason when they do not fit within queue_s) until released."""
        self.acquire(nbytes, what)
        return Lease(self, nbytes)

    def _why_not(self, nbytes: int, what: str) -> str | None:
        if self.streams >= self.max_streams:
            return (
                f"{self.streams} generations in flight, the most serving.generative.max_streams allows (each "
                "holds one of the inference port's worker threads)"
            )
        if self.held + nbytes > self.limit:
            return (
                f"KV-memory budget: {what} needs {nbytes} bytes of KV cache; {self.held} of the {self.limit}-byte "
                f"budget (serving.generative.kv_budget) are held by {self.streams} stream(s) in flight"
            )
        return None

    def acquire(self, nbytes: int, what: str) -> None:
        with self._room:
            why = self._why_not(nbytes, what)
            if why and self.queue_s > 0 and self.waiting < self.max_streams:  # wait in line, bounded
                self.waiting += 1
                try:
                    self._room.wait_for(lambda: self._why_not(nbytes, what) is None, timeout=self.queue_s)
                finally:
                    self.waiting -= 1
                why = self._why_not(nbytes, what)
                why = why and f"{why} (waited {self.queue_s:g} s: serving.generative.queue_s)"
            if why:
                raise ServerBusy(why)
            self.held += nbytes
            self.streams += 1

    def release(self, nbytes: int) -> None:
        with self._room:
            self.held -= nbytes
            self.streams -= 1
            self._room.notify_all()


class Lease:
    """KV bytes one request holds; release() is idempotent (the generation's end and the stream's close both call it:
    a generator's `finally` never runs when the generator never started)."""

    def __init__(self, budget: KVBudget, nbytes: int) -> None:
        self.budget, self.nbytes = budget, nbytes
        self._once = threading.Lock()
        self.released = False

    def release(self) -> None:
        with self._once:
            if self.released:
                return
            self.released = True
        self.budget.release(self.nbytes)
