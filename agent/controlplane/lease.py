"""The rollout leader's lease in the database: one row (`leader_lease`, name `fleet`) with its holder, an expiry
read on the database's clock, and a fencing token that grows by one at every change of holder.

A replica holds the lease while it renews it (every lease_s / 5 seconds); another takes it once it has expired
(lease_s after the last renewal). Every transaction the leader commits checks, inside that transaction, that the
row still names it with its fence (`SELECT ... FOR SHARE` on PostgreSQL: a replica taking over waits for that
commit, and a write begun by a stale leader after the takeover is refused with LeaseLost). On SQLite (one
process) the lease is taken at once: the process that runs is the leader."""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from typing import Any

from sqlalchemy import event, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from agent.controlplane.shared_models import LeaderLease
from agent.errors import EdgeAgentError

FLEET = "fleet"


class LeaseLost(EdgeAgentError):
    """This replica is no longer the leader (another holds the lease with a newer fence): its write is refused."""


def replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Lease:
    """Acquire, renew, release and check one lease row; thread-safe (`fence` is set while held)."""

    def __init__(self, engine: Engine, lease_s: float = 5.0, holder: str | None = None, name: str = FLEET):
        self.engine, self.lease_s, self.name = engine, float(lease_s), name
        self.holder = holder or replica_id()
        self.factory = sessionmaker(engine, expire_on_commit=False)
        self.sqlite = engine.dialect.name == "sqlite"
        self.fence: int | None = None
        self.renewed: float | None = None  # monotonic time of the last successful acquire or renew
        self._lock = threading.Lock()

    # -- the database's clock ----------------------------------------------------------------------------------
    def _now(self, s: Session) -> float:
        if self.sqlite:
            return time.time()
        return float(s.scalar(text("SELECT extract(epoch from clock_timestamp())")))

    def try_acquire(self) -> bool:
        """Renew the lease if held, take it if free or expired (a new fence); True while this replica holds it."""
        with self._lock:
            try:
                fence = self._acquire()
            except (IntegrityError, OperationalError):
                # another replica inserted the row first, or the database is away: held while the last renewal lasts
                if self.renewed is None or time.monotonic() - self.renewed > self.lease_s:
                    self.fence = None
                return self.fence is not None
            self.fence = fence
            if fence is not None:
                self.renewed = time.monotonic()
            return fence is not None

    def _acquire(self) -> int | None:
        with self.factory() as s:
            now = self._now(s)
            row = s.get(LeaderLease, self.name, with_for_update=True)
            if row is None:
                s.add(
                    LeaderLease(
                        name=self.name, holder=self.holder, fence=1, expires_at=now + self.lease_s, acquired_at=now
                    )
                )
                s.commit()
                return 1
            if row.holder == self.holder and row.fence == self.fence:
                row.expires_at = now + self.lease_s
            elif row.expires_at <= now or self.sqlite:
                row.holder, row.fence, row.acquired_at = self.holder, row.fence + 1, now
                row.expires_at = now + self.lease_s
            else:
                s.rollback()
                return None
            fence = row.fence
            s.commit()
            return fence

    def release(self) -> None:
        """Give the lease up at a clean stop (expired now: another replica takes it at its next try)."""
        with self._lock:
            fence, self.fence = self.fence, None
            if fence is None:
                return
            try:
                with self.factory() as s:
                    row = s.get(LeaderLease, self.name, with_for_update=True)
                    if row is not None and row.holder == self.holder and row.fence == fence:
                        row.expires_at = 0.0
                    s.commit()
            except OperationalError:
                pass  # the lease expires by itself

    # -- fencing ---------------------------------------------------------------------------------------------
    def check(self, s: Session) -> None:
        """Inside a transaction about to commit: the row still names this replica with its fence, else LeaseLost.
        On PostgreSQL the row is share-locked until the commit, so no takeover interleaves with the write."""
        fence = self.fence
        if fence is None:
            raise LeaseLost(f"leader: replica {self.holder} does not hold the {self.name} lease; write refused")
        stmt = select(LeaderLease.fence).where(
            LeaderLease.name == self.name, LeaderLease.holder == self.holder, LeaderLease.fence == fence
        )
        if s.scalar(stmt.with_for_update(read=True)) is None:
            raise LeaseLost(
                f"leader: fence {fence} of replica {self.holder} is stale (another replica leads); write refused"
            )

    def fenced_sessions(self) -> sessionmaker[Session]:
        """Sessions whose every commit first runs check(): the leader's fleet loop and rollout engines use these."""
        factory = sessionmaker(self.engine, expire_on_commit=False)
        event.listen(factory, "before_commit", self.check)
        return factory

    # -- shown in /api/v1/health and `control-plane leader` -----------------------------------------------------
    def state(self) -> dict[str, Any]:
        return read_state(self.factory, self.name, self.holder, self.lease_s)


def read_state(
    factory: sessionmaker[Session], name: str = FLEET, me: str | None = None, lease_s: float | None = None
) -> dict[str, Any]:
    with factory() as s:
        row = s.get(LeaderLease, name)
        now = (
            time.time()
            if s.get_bind().dialect.name == "sqlite"
            else float(s.scalar(text("SELECT extract(epoch from clock_timestamp())")))
        )
    out: dict[str, Any] = {"lease": name, "how": "a lease row in the database with a fencing token"}
    if lease_s is not None:
        out["lease_s"] = lease_s
    if me is not None:
        out["replica"] = me
    if row is None:
        return {**out, "holder": None, "fence": None, "expires_in_s": None, "leading": False if me else None}
    live = row.expires_at > now
    out.update(
        holder=row.holder if live else None,
        last_holder=row.holder,
        fence=row.fence,
        expires_in_s=round(row.expires_at - now, 3) if live else 0.0,
        held_for_s=round(now - row.acquired_at, 3) if live else None,
    )
    if me is not None:
        out["leading"] = live and row.holder == me
    return out
