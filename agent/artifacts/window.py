"""The puller's request window: which chunks are in flight since when, and when one is overdue (adaptive timeout).

The timeout follows the chunks' measured round trips the way TCP's retransmission timer does (RFC 6298):
smoothed RTT + 4 x its mean deviation, bounded by [lo, hi]; samples come only from chunks requested once
(Karn's rule: an answer to a re-requested chunk could belong to either request) and every timeout doubles the
timeout until a fresh sample arrives (backoff). A loaded server therefore stretches the device's patience
instead of drawing a storm of duplicate requests, and only chunks older than the timeout are asked for again,
never the whole window. Pure logic with an injected clock: the puller passes `now`.
"""

from __future__ import annotations

from collections.abc import Iterable


class RttEstimator:
    """Adaptive request timeout from chunk round trips: clamp(srtt + k x rttvar, lo, hi) x backoff."""

    def __init__(self, initial: float, lo: float, hi: float, k: float = 4.0):
        self.lo, self.hi, self.k = lo, max(lo, hi), k
        self.initial = min(max(initial, lo), self.hi)
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.backoff = 1
        self.samples = 0

    def sample(self, rtt: float) -> None:
        rtt = max(0.0, rtt)
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.samples += 1
        self.backoff = 1  # a clean round trip: the path works again

    def expired(self) -> None:
        """A timeout fired: wait twice as long next time (until a fresh sample), never beyond `hi`."""
        if self.timeout < self.hi:
            self.backoff *= 2

    @property
    def timeout(self) -> float:
        base = self.initial if self.srtt is None else self.srtt + self.k * self.rttvar
        return min(self.hi, max(self.lo, base) * self.backoff)


class InFlight:
    """Requested, not yet received chunks in request order (oldest first) with their request times."""

    def __init__(self, rtt: RttEstimator):
        self.rtt = rtt
        self._sent: dict[int, float] = {}  # index -> time of its latest request; insertion order = request order
        self._again: set[int] = set()  # requested more than once: no RTT sample from these (Karn)

    def __len__(self) -> int:
        return len(self._sent)

    def __contains__(self, index: int) -> bool:
        return index in self._sent

    def add(self, indices: Iterable[int], now: float) -> None:
        for i in indices:
            if self._sent.pop(i, None) is not None:
                self._again.add(i)
            self._sent[i] = now

    def land(self, index: int, now: float) -> float | None:
        """A valid answer arrived: its round trip when it was requested once (Karn's rule), else None.
        The round trip also feeds the timeout estimate."""
        sent = self._sent.pop(index, None)
        rtt = None
        if sent is not None and index not in self._again:
            rtt = now - sent
            self.rtt.sample(rtt)
        self._again.discard(index)
        return rtt

    def drop(self, index: int) -> None:
        """Forget a chunk (its answer was bad: it goes back to the missing list)."""
        self._sent.pop(index, None)
        self._again.discard(index)

    def overdue(self, now: float) -> list[int]:
        """Chunks whose latest request is older than the timeout, oldest first; they count as re-requested and
        the timeout backs off once per call that finds any."""
        limit = now - self.rtt.timeout
        due = []
        for i, sent in self._sent.items():
            if sent > limit:
                break  # request order: everything after is younger
            due.append(i)
        if due:
            for i in due:
                del self._sent[i]
                self._again.add(i)
            self.rtt.expired()
        return due

    def next_deadline(self) -> float | None:
        """When the oldest request times out (None when nothing is in flight)."""
        for sent in self._sent.values():
            return sent + self.rtt.timeout
        return None
