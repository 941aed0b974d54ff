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


Take = tuple[str, float, int]  # (bucket, per_minute, burst)


class RateLimiter(Protocol):
    def take(self, bucket: str, per_minute: float, burst: int) -> float:
        """Take one token from `bucket`: 0.0 when allowed, else the seconds until one is there (nothing taken)."""
        ...

    def take_all(self, takes: list[Take]) -> tuple[int, float]:
        """take() each in order until one is refused: (its index, its wait), or (-1, 0.0) when all were taken."""
        ...


def _in_order(limiter: RateLimiter, takes: list[Take]) -> tuple[int, float]:
    for i, (bucket, per_minute, burst) in enumerate(takes):
        if (wait := limiter.take(bucket, per_minute, burst)) > 0:
            return i, wait
    return -1, 0.0


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

    def take_all(self, takes: list[Take]) -> tuple[int, float]:
        return _in_order(self, takes)


class DbLimiter:
    """Token buckets in the `rate_buckets` table (its rows are shared by every replica). A take is one statement: an
    upsert that refills the bucket and takes a token only where one is there (the row locked for that statement
    alone), on a connection of the limiter's own in autocommit: no pool checkout, no BEGIN and COMMIT, no ORM per
    take (each request to the intake takes twice, so this is on every enrollment's and document's path). A
    refused take reads the bucket once more for its wait. Buckets idle for an hour are deleted now and then."""

    PRUNE_EVERY = 1000
    _REFILLED = "LEAST(:burst, b.tokens + GREATEST(0, :now - b.at) * :rate)"
    _REFILLED2 = "LEAST(:burst2, b.tokens + GREATEST(0, :now - b.at) * :rate2)"
    TAKE = (
        "INSERT INTO rate_buckets AS b (bucket, tokens, at) VALUES (:bucket, :burst - 1, :now) "
        f"ON CONFLICT (bucket) DO UPDATE SET tokens = {_REFILLED} - 1, at = :now WHERE {_REFILLED} >= 1 "
        "RETURNING b.tokens"
    )
    TAKE2 = (  # two buckets in one statement, the second taken only when the first was
        "WITH first AS (INSERT INTO rate_buckets AS b (bucket, tokens, at) VALUES (:bucket, :burst - 1, :now) "
        f"ON CONFLICT (bucket) DO UPDATE SET tokens = {_REFILLED} - 1, at = :now WHERE {_REFILLED} >= 1 "
        "RETURNING b.tokens), "
        "second AS (INSERT INTO rate_buckets AS b (bucket, tokens, at) "
        "SELECT CAST(:bucket2 AS VARCHAR), :burst2 - 1, :now WHERE EXISTS (SELECT 1 FROM first) "
        f"ON CONFLICT (bucket) DO UPDATE SET tokens = {_REFILLED2} - 1, at = :now WHERE {_REFILLED2} >= 1 "
        "RETURNING b.tokens) "
        "SELECT (SELECT count(*) FROM first), (SELECT count(*) FROM second)"
    )
    READ = "SELECT tokens, at FROM rate_buckets WHERE bucket = :bucket"
    PRUNE = "DELETE FROM rate_buckets WHERE at < :cut"

    def __init__(self, factory, clock=time.time):
        from sqlalchemy import text

        self.engine, self.clock = factory.kw["bind"], clock
        self._sql = {k: text(getattr(self, k)) for k in ("TAKE", "TAKE2", "READ", "PRUNE")}
        self._takes = 0
        self._conn = None
        self._lock = threading.Lock()

    def take(self, bucket: str, per_minute: float, burst: int) -> float:
        with self._lock:
            self._count()
            return self._take(_short(bucket), per_minute / 60.0, burst)

    def take_all(self, takes: list[Take]) -> tuple[int, float]:
        """Two buckets (an address and a device) in one statement; others one by one."""
        if len(takes) != 2:
            return _in_order(self, takes)
        (b1, pm1, burst1), (b2, pm2, burst2) = takes
        b1, b2, rate1, rate2 = _short(b1), _short(b2), pm1 / 60.0, pm2 / 60.0
        with self._lock:
            self._count()
            now = self.clock()
            params = {"bucket": b1, "burst": burst1, "rate": rate1, "bucket2": b2, "burst2": burst2, "rate2": rate2}
            got = self._run("TAKE2", {**params, "now": now})
            first, second = (int(got[0]), int(got[1])) if got is not None else (0, 0)
            if first and second:
                return -1, 0.0
            i, bucket, rate, burst = (0, b1, rate1, burst1) if not first else (1, b2, rate2, burst2)
            wait = self._wait(bucket, rate, burst, now)
            if wait == 0.0:  # refilled since: taken the usual way
                wait = self._take(bucket, rate, burst)
            if wait > 0 or i == 1:
                return (i, wait) if wait > 0 else (-1, 0.0)
            wait = self._take(b2, rate2, burst2)
            return (1, wait) if wait > 0 else (-1, 0.0)

    def _count(self) -> None:
        self._takes += 1
        if self._takes % self.PRUNE_EVERY == 0:
            self._run("PRUNE", {"cut": self.clock() - 3600})

    def _take(self, bucket: str, rate: float, burst: int) -> float:
        for _ in range(3):  # a refill between the refused take and its read: take again
            now = self.clock()
            if self._run("TAKE", {"bucket": bucket, "burst": burst, "now": now, "rate": rate}) is not None:
                return 0.0
            if (wait := self._wait(bucket, rate, burst, now)) > 0:
                return wait
        return 0.0

    def _wait(self, bucket: str, rate: float, burst: int, now: float) -> float:
        """A refused take's wait: the bucket as it is (a refused take changes nothing); 0.0 when it has a token."""
        got = self._run("READ", {"bucket": bucket})
        if got is None:
            return 0.0
        tokens = min(float(burst), got[0] + max(0.0, now - got[1]) * rate)
        return (1.0 - tokens) / rate if tokens < 1.0 else 0.0

    def _run(self, name: str, params: dict):
        """Statement `name`'s first row (or None), on the limiter's connection; a dropped connection (the database
        restarted) is opened again once."""
        from sqlalchemy.exc import DBAPIError, OperationalError

        from agent.controlplane.db import storage_error

        for attempt in (1, 2):
            try:
                if self._conn is None:
                    self._conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                got = self._conn.execute(self._sql[name], params)
                return got.first() if got.returns_rows else None
            except DBAPIError as exc:
                self.close()
                if attempt == 2 or not exc.connection_invalidated:
                    raise (storage_error(exc) if isinstance(exc, OperationalError) else exc) from None
        return None

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a connection already gone
                pass


def _short(bucket: str) -> str:
    return "sha256:" + hashlib.sha256(bucket.encode()).hexdigest() if len(bucket) > 200 else bucket


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

    def device_post(self, address: str | None, device_id: str) -> None:
        """address(), then key() of the device (taken only when the address's was), in one take_all: one
        statement on PostgreSQL for a device's document post."""
        lim = self.limits
        takes = [(f"addr:{address}", lim.address_per_minute, lim.address_burst),
                 (f"key:device:{device_id}", lim.key_per_minute, lim.key_burst)]  # fmt: skip
        i, wait = self.limiter.take_all(takes)
        if wait > 0:
            with self._lock:
                self.rate_limited += 1
            what = f"from {address}" if i == 0 else f"for device {device_id}"
            raise RateLimited(f"rate: too many requests {what}; retry in {math.ceil(wait)} s", wait)

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
