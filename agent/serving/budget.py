"""The request memory budget: bytes that request bodies occupy (as received, inflated and decoded), all connections."""

from __future__ import annotations

import threading

from agent.serving.errors import PayloadTooLarge, ServerBusy

# What decoding costs beyond the bytes received, per byte or element (measured with tracemalloc on CPython 3.11:
# per byte of JSON text, json.loads makes 4 (a list of 0s) to 24 (a list of [0] or {}) bytes of Python objects
# and numpy 2-4 more; a BYTES element becomes a str object of 49-80 bytes plus a pointer).
JSON_DECODE_FACTOR = 32
BYTES_ELEMENT_COST = 88
BYTES_CHAR_FACTOR = 4  # a str holds up to 4 bytes per code point (UCS-4)


def parse_cost(size: int, opens: int, separators: int) -> int:
    """What simdjson holds while it parses a large JSON body (jsonfast.py) of `size` bytes with `opens` '[' and '{'
    and `separators` ',' and ':': the padded copy of the text, its tape (16 bytes per number and per container, 8
    per other value), its structural index (4 bytes per structural character and value start) and its string
    buffer (at most the text's length). On a tritonclient [1,3,224,224] FP32 body (3.1 MB): 1.6x the body
    measured (VmHWM), 3.4x counted."""
    values = separators + opens + 1
    return 2 * size + 16 * (values + opens) + 4 * (separators + 2 * opens + values)


def kept_parser_cost(size: int, opens: int, separators: int, strings: int, string_bytes: int) -> int:
    """What a simdjson parser kept after parsing such a body (jsonfast.keep_parsers) can have touched: parse_cost
    with its string buffer as the body's `strings` need it (each written with a 4-byte length and a NUL; the fast
    path takes no string with an escape), not the text's length, plus 8 pages for its buffers' rounding (measured
    on a tritonclient FP32 image: 6,680,576 bytes resident after its parse, 6,697,377 counted; 2.2x the body)."""
    return parse_cost(size, opens, separators) - size + string_bytes + 5 * strings + 8 * 4096


class BodyBudget:
    """One budget for all connections: reserve() before memory is committed, release() after the answer.
    A request that could not fit even alone gets 413 naming the limit; one that does not fit now gets 503."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self._lock = threading.Lock()
        self._used = 0  # held by requests being read, decoded or served
        self._kept = 0  # read buffers kept between requests (at most a quarter of the limit)

    def reserve(self, n: int, held: int, what: str) -> None:
        """Count n more bytes for a request already holding `held`; PayloadTooLarge or ServerBusy if they
        do not fit (nothing is counted then)."""
        if held + n > self.limit:
            raise PayloadTooLarge(
                f"{what} needs {held + n} bytes of request memory, over the server's budget of {self.limit} bytes"
            )
        with self._lock:
            if self._used + self._kept + n > self.limit:
                raise ServerBusy(
                    f"requests in flight fill the server's request memory budget of {self.limit} bytes; retry shortly"
                )
            self._used += n

    def hold(self, n: int) -> None:
        """Count n bytes already taken (a response's arrays): never refused, they make later requests wait."""
        with self._lock:
            self._used += n

    def release(self, n: int) -> None:
        if n:
            with self._lock:
                self._used -= n

    def keep(self, old: int, new: int) -> bool:
        """May a read buffer of `old` bytes be swapped for one of `new` bytes and kept? (a quarter of the limit)"""
        with self._lock:
            if self._kept - old + new > self.limit // 4:
                return False
            self._kept += new - old
            return True

    def drop(self, size: int) -> None:
        if size:
            with self._lock:
                self._kept -= size

    def usage(self) -> tuple[int, int]:
        """(bytes held by requests, bytes of kept read buffers)."""
        with self._lock:
            return self._used, self._kept


class Ledger:
    """What one request holds of the budget; close() gives it all back."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: BodyBudget):
        self.budget = budget
        self.held = 0

    def charge(self, n: int, what: str) -> None:
        """Count n more bytes for this request (raises PayloadTooLarge / ServerBusy when they do not fit)."""
        if n > 0:
            self.budget.reserve(n, self.held, what)
            self.held += n

    def hold(self, n: int) -> None:
        """Count n bytes this request already holds (its outputs): BodyBudget.hold."""
        if n > 0:
            self.budget.hold(n)
            self.held += n

    def close(self) -> None:
        self.budget.release(self.held)
        self.held = 0
