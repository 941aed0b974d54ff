"""What every generation route reads from a request (max_tokens, temperature, top_p, stop) and the SSE framing."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from agent.serving.errors import InvalidInput
from agent.serving.generative.engine import Sampling

MAX_TOKENS_DEFAULT = 16


def _number(doc: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = doc.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise InvalidInput(f"{key}: expected a number in [{lo}, {hi}], got {v!r}")
    return float(v)


def sampling_of(doc: dict[str, Any]) -> Sampling:
    mt = doc.get("max_tokens", doc.get("max_completion_tokens", MAX_TOKENS_DEFAULT))
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise InvalidInput(f"max_tokens: expected a positive integer, got {mt!r}")
    stop = doc.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
        raise InvalidInput("stop: expected a string or a list of up to 4 strings")
    return Sampling(
        max_tokens=mt,
        temperature=_number(doc, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(doc, "top_p", 1.0, 0.0, 1.0),
        stop=tuple(stop),
    )


def sse(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


KEEPALIVE_S = 0.25
KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it


def texts(pieces: Iterable[str]) -> Iterator[str | None]:
    """Each non-empty piece of text; None where tokens gave no text and nothing went out for KEEPALIVE_S (the
    stream then sends KEEPALIVE, so a client that left is found at that send, not only at the next text)."""
    last = time.monotonic()
    for text in pieces:
        now = time.monotonic()
        if text:
            last = now
            yield text
        elif now - last >= KEEPALIVE_S:
            last = now
            yield None
