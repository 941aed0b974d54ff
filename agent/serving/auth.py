"""Bearer-token checks for every transport, with failed attempts slowed down per peer and counted (issue 29 item 8).

A peer's first FREE_FAILURES wrong tokens are answered at once; after that each wrong token shuts the peer out
for a doubling time (BASE_S, capped at MAX_S) during which its requests are refused (429, gRPC
RESOURCE_EXHAUSTED) without the token being compared: guesses cost the guesser time, not the server threads.
A right token or FORGET_S without failures clears the peer's record. Loopback peers are treated like any other.
"""

from __future__ import annotations

import collections
import hmac
import threading
import time
from collections.abc import Callable

from agent.serving.errors import TooManyFailures, Unauthorized

FREE_FAILURES = 5
BASE_S = 0.1
MAX_S = 10.0
FORGET_S = 60.0
MAX_PEERS = 4096  # records kept (oldest dropped first): a spoofed crowd cannot grow this without bound


class AuthGate:
    """The token (replaceable at runtime) and the failed-attempt books for all transports."""

    def __init__(self, token: str | None = None, clock: Callable[[], float] = time.monotonic):
        self.token = token or None
        self._clock = clock
        self._lock = threading.Lock()
        self._peers: collections.OrderedDict[str, tuple[int, float, float]] = collections.OrderedDict()
        self.failures: collections.Counter[str] = collections.Counter()  # by transport
        self.throttled: collections.Counter[str] = collections.Counter()

    def set_token(self, token: str | None) -> None:
        self.token = token or None

    def check(self, peer: str, presented: str | None, transport: str) -> None:
        """Pass, or raise Unauthorized (wrong or missing token) / TooManyFailures (peer shut out for now)."""
        token = self.token
        if token is None:
            return
        now = self._clock()
        with self._lock:
            rec = self._peers.get(peer)
            if rec is not None and now < rec[2]:
                self.throttled[transport] += 1
                wait = rec[2] - now
                raise TooManyFailures(f"too many wrong tokens from {peer}; try again in {wait:.1f} s", retry_after=wait)
        ok = presented is not None and hmac.compare_digest(presented.encode("utf-8", "replace"), token.encode())
        with self._lock:
            if ok:
                self._peers.pop(peer, None)
                return
            count, last, _ = self._peers.pop(peer, (0, now, 0.0))
            if now - last > FORGET_S:
                count = 0
            count += 1
            until = now + min(MAX_S, BASE_S * 2 ** (count - FREE_FAILURES - 1)) if count > FREE_FAILURES else 0.0
            self._peers[peer] = (count, now, until)
            while len(self._peers) > MAX_PEERS:
                self._peers.popitem(last=False)
            self.failures[transport] += 1
        raise Unauthorized("missing or wrong bearer token (send 'Authorization: Bearer <token>')")

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(failed authentications, refused while shut out), by transport."""
        with self._lock:
            return dict(self.failures), dict(self.throttled)
