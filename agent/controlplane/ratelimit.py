"""Rate limits for unauthenticated posts (enrollment, device documents): token buckets per source address and per
key, behind a small interface (RateLimiter): on SQLite (one process) in memory (InProcessLimiter), on PostgreSQL
in the database (DbLimiter: every replica takes from the same buckets, so a limit holds across replicas)."""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict
from typing import Protocol

from agent.errors import EdgeAgentError


class RateLimited(EdgeAgentError):
    """Too many requests for one address or key (HTTP 429 at the edge, with Retry-After)."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class RateLimiter(Protocol):
    def take(self, bucket: str, per_minute: float, burst: int) -> float:
        """Take one token from `bucket`: 0.0 when allowed, else the seconds until one is there (nothing taken)."""
        ...


class InProcessLimiter:
    """Token buckets in this process's memory, at most `max_buckets` of them (the least recently used one goes:
    a forgotten bucket starts full again, so an attacker with many addresses gains at most one burst each)."""

    def __init__(self, max_buckets: int = 100_000, clock=time.monotonic):
        self.max_buckets, self.clock = max_buckets, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # bucket -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, bucket: str, per_minute: float, burst: int) -> float:
        now, rate = self.clock(), per_minute / 60.0
        with self._lock:
            tokens, at = self._buckets.pop(bucket, (float(burst), now))
            tokens = min(float(burst), tokens + (now - at) * rate)
            wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / rate
            self._buckets[bucket] = (tokens - 1.0 if wait == 0.0 else tokens, now)
            while len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
        return wait


class DbLimiter:
    """Token buckets in the `rate_buckets` table, one row-locked transaction per take (the database's rows are
    shared by every replica); buckets idle for an hour are deleted now and then (one refilled anyway)."""

    PRUNE_EVERY = 1000

    def __init__(self, factory, clock=time.time):
        self.factory, self.clock = factory, clock
        self._takes = 0

    def take(self, bucket: str, per_minute: float, burst: int) -> float:
        from sqlalchemy import delete
        from sqlalchemy.exc import IntegrityError

        from agent.controlplane.db import write
        from agent.controlplane.shared_models import RateBucket

        if len(bucket) > 200:
            bucket = "sha256:" + hashlib.sha256(bucket.encode()).hexdigest()
        self._takes += 1
        for _ in range(3):  # two replicas making the same new bucket at once: the loser reads the winner's row
            now, rate = self.clock(), per_minute / 60.0
            try:
                with write(self.factory) as s:
                    if self._takes % self.PRUNE_EVERY == 0:
                        s.execute(delete(RateBucket).where(RateBucket.at < now - 3600))
                    row = s.get(RateBucket, bucket, with_for_update=True)
                    if row is None:
                        row = RateBucket(bucket=bucket, tokens=float(burst), at=now)
                        s.add(row)
                    tokens = min(float(burst), row.tokens + max(0.0, now - row.at) * rate)
                    wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / rate
                    row.tokens, row.at = (tokens - 1.0 if wait == 0.0 else tokens), now
                return wait
            except IntegrityError:
                continue
        return 0.0


def shared_limiter(factory, engine) -> RateLimiter:
    """The limiter for this database: shared buckets on PostgreSQL (replicas), in memory on SQLite."""
    return DbLimiter(factory) if engine.dialect.name == "postgresql" else InProcessLimiter()


class Guard:
    """The service's limits on unauthenticated posts, with the counters /api/v1/health shows."""

    def __init__(self, limits, limiter: RateLimiter | None = None):
        self.limits = limits
        self.limiter: RateLimiter = limiter or InProcessLimiter()
        self.rate_limited = 0
        self.pending_dropped = 0
        self._lock = threading.Lock()

    def _take(self, bucket: str, per_minute: float, burst: int, what: str) -> None:
        wait = self.limiter.take(bucket, per_minute, burst)
        if wait > 0:
            with self._lock:
                self.rate_limited += 1
            raise RateLimited(f"rate: too many requests {what}; retry in {math.ceil(wait)} s", wait)

    def address(self, address: str | None) -> None:
        lim = self.limits
        self._take(f"addr:{address}", lim.address_per_minute, lim.address_burst, f"from {address}")

    def key(self, key: str, what: str) -> None:
        lim = self.limits
        self._take(f"key:{key}", lim.key_per_minute, lim.key_burst, f"for {what}")

    def dropped(self, n: int) -> None:
        with self._lock:
            self.pending_dropped += n

    def report(self, session) -> dict[str, int]:
        """/api/v1/health's `limits`: pending devices, the cap, and the counters since the service started."""
        from sqlalchemy import func, select

        from agent.controlplane.models import PENDING, Device

        pending = session.scalar(select(func.count()).select_from(Device).where(Device.state == PENDING)) or 0
        with self._lock:
            counters = {"rate_limited": self.rate_limited, "pending_dropped": self.pending_dropped}
        return {"pending": pending, "pending_max": self.limits.pending_max, **counters}
