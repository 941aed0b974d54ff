"""serving.generative.stream_interval_ms, for every engine (ortgenai, ovgenai): a streamed response sends its text
at most this often. A model slower than the interval (a real one on a device: tens of ms a token) streams a piece
a token; a faster one sends fewer, longer pieces, so the request's thread writes (and, for OpenVINO GenAI, decodes
and takes the interpreter from the generation's callback) that much less often (docs/generative.md, "Bench")."""

from __future__ import annotations

import math
import time

DEFAULT_STREAM_INTERVAL_S = 0.02  # serving.generative.stream_interval_ms


class Pacer:
    """A stream's text at most every `interval` seconds, the first piece at once; text made in between is held
    and goes out with the next piece (the whole text is the same). A request read whole is not paced (0)."""

    def __init__(self, interval: float) -> None:
        self.interval, self.held, self.last = interval, "", -math.inf

    def left(self) -> float:
        """Seconds until the next piece may go out (<= 0: now)."""
        return self.last + self.interval - time.monotonic()

    def take(self, piece: str) -> str:
        """What goes out now: `piece` and what was held, or "" while the interval runs."""
        self.held += piece
        if not self.held or self.left() > 0:
            return ""
        out, self.held, self.last = self.held, "", time.monotonic()
        return out

    def rest(self) -> str:
        out, self.held = self.held, ""
        return out
