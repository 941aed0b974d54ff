"""The recent live prompts of a served generative model (docs/generative.md, "Shadow"): copies of the token ids of
the last `count` prompts, each cut to its last `tokens`, kept in memory for the shadow judgement of the next version
(agent.trial.genshadow). Adding one is cheap and never raises; the name's ring goes on across versions."""

from __future__ import annotations

import threading
from collections import deque

PROMPTS = 16  # prompts kept (the oldest goes first) ...
PROMPT_TOKENS = 512  # ... each at most this many tokens (its tail): at most 8192 ids in memory


class LivePrompts:
    def __init__(self, count: int = PROMPTS, tokens: int = PROMPT_TOKENS) -> None:
        self.tokens = int(tokens)
        self._ring: deque[tuple[int, ...]] = deque(maxlen=int(count))
        self._lock = threading.Lock()
        self.seen = 0  # prompts offered since the daemon started serving the name

    def add(self, prompt: list[int]) -> None:
        if not prompt:
            return
        copy = tuple(int(t) for t in prompt[-self.tokens :])
        with self._lock:
            self._ring.append(copy)
            self.seen += 1

    def recent(self) -> list[list[int]]:
        """The prompts kept, oldest first (copies)."""
        with self._lock:
            return [list(p) for p in self._ring]
