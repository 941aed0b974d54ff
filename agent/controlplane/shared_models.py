"""The tables that let several service processes share one PostgreSQL (migration 0004): the rollout leader's
lease with its fencing token, dashboard sessions, rate-limit buckets, and the ledger of desired-state
publications (each published once per rollout, round and device)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from agent.controlplane.models import Base


class LeaderLease(Base):
    """One row per leadership (`fleet`: the rollout engine and the MQTT fan-out). `fence` grows by one at every
    change of holder; every write the leader makes checks it is still the holder with that fence."""

    __tablename__ = "leader_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(160))
    fence: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[float] = mapped_column(Float)
    acquired_at: Mapped[float] = mapped_column(Float)


class WebSession(Base):
    """A dashboard sign-in: the SHA-256 of the cookie's session id (the id itself is never stored)."""

    __tablename__ = "web_sessions"

    sid_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    csrf: Mapped[str] = mapped_column(String(64))
    created: Mapped[float] = mapped_column(Float, index=True)
    flash: Mapped[str | None] = mapped_column(Text, nullable=True)


class RateBucket(Base):
    """A token bucket of agent.controlplane.ratelimit (per source address or key)."""

    __tablename__ = "rate_buckets"

    bucket: Mapped[str] = mapped_column(String(200), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    at: Mapped[float] = mapped_column(Float, index=True)


class Publication(Base):
    """A desired state the leader published for one device in one rollout and round (the roll back request it
    answers, or "" for the forward path), by the SHA-256 of its bytes; `sent_at` set once the broker took it."""

    __tablename__ = "desired_publications"

    rollout_id: Mapped[str] = mapped_column(String(140), primary_key=True)
    round: Mapped[str] = mapped_column(String(160), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    fence: Mapped[int] = mapped_column(BigInteger)
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
