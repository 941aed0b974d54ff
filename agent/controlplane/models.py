"""The control plane's tables (SQLAlchemy 2 declarative). Alembic migrations in migrations/ create them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

PENDING, ACCEPTED, REJECTED, DECOMMISSIONED = "pending", "accepted", "rejected", "decommissioned"
DEVICE_STATES = (PENDING, ACCEPTED, REJECTED, DECOMMISSIONED)
ROLES = ("viewer", "operator", "admin")


class Base(DeclarativeBase):
    pass


class Device(Base):
    """An enrolled (or asking) device. precision, model_versions, model_state and models_summary are computed
    from its last verified status when it is ingested (agent.controlplane.cohort): the overview groups by them in
    SQL and a device list shows them without reading a status document."""

    __tablename__ = "devices"
    __table_args__ = (
        Index("ix_devices_cohort", "state", "target", "provider", "precision", "model_versions", "online"),
        Index("ix_devices_state_id", "state", "device_id"),
        Index("ix_devices_state_model_state", "state", "model_state"),
    )

    device_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    public_key: Mapped[str] = mapped_column(Text)
    key_id: Mapped[str | None] = mapped_column(String(32), unique=True, nullable=True)  # one key, one device
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)
    target: Mapped[str | None] = mapped_column(String(64), index=True, nullable=True)  # hardware class
    provider: Mapped[str | None] = mapped_column(String(64), index=True, nullable=True)
    online: Mapped[bool] = mapped_column(Boolean, default=False)
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # last verified status
    status_ts: Mapped[float | None] = mapped_column(Float, nullable=True)
    requested_at: Mapped[float] = mapped_column(Float)
    decided_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    decided_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    precision: Mapped[str | None] = mapped_column(String(255), index=True, nullable=True)
    model_versions: Mapped[str | None] = mapped_column(String(255), index=True, nullable=True)
    model_state: Mapped[str | None] = mapped_column(String(255), index=True, nullable=True)
    models_summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # the agent release it runs and its last trial (agent.fleet.agent_release.summary), from its verified status
    agent_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    agent_release: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class FleetCount(Base):
    """How many devices share one combination of the columns the overview groups by, kept in the transaction that
    changes a device (agent.controlplane.fleetcounts: hooks on every session, registered when db is imported)."""

    __tablename__ = "fleet_counts"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # fleetcounts.key_hash of the combination
    state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    target: Mapped[str | None] = mapped_column(String(64), nullable=True)
    provider: Mapped[str | None] = mapped_column(String(64), nullable=True)
    precision: Mapped[str | None] = mapped_column(String(255), nullable=True)
    model_versions: Mapped[str | None] = mapped_column(String(255), nullable=True)
    model_state: Mapped[str | None] = mapped_column(String(255), nullable=True)
    online: Mapped[bool] = mapped_column(Boolean, default=False)
    devices: Mapped[int] = mapped_column(BigInteger, default=0)


class DeviceGroup(Base):
    """Membership rows (so a group filter is an indexed parameterised join, not JSON text matching)."""

    __tablename__ = "device_groups"

    device_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    group: Mapped[str] = mapped_column("group_name", String(64), primary_key=True, index=True)


class EnrollNonce(Base):
    __tablename__ = "enroll_nonces"

    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(64))
    ts: Mapped[float] = mapped_column(Float)


class EnrollToken(Base):
    __tablename__ = "enroll_tokens"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)
    uses_left: Mapped[int] = mapped_column(Integer)
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class OperatorToken(Base):
    __tablename__ = "operator_tokens"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)


class AuditEntry(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(80))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str | None] = mapped_column(String(160), nullable=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[str] = mapped_column(String(64))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)
    format: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)


class Rollout(Base):
    """One rollout: the operator's spec and knobs, the engine's persisted state (written only by the runner),
    and the operator's requests (paused, rollback) changed by conditional updates: no last write wins."""

    __tablename__ = "rollouts"

    rollout_id: Mapped[str] = mapped_column(String(140), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    knobs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    phase: Mapped[str] = mapped_column(String(16), index=True)  # starting | running | finished | failed
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    rollback_requested: Mapped[str | None] = mapped_column(String(160), nullable=True)
    # the operator's word on devices not judged: "accept by X (request n)" | "rollback by X (request n)"
    unjudged_decision: Mapped[str | None] = mapped_column(String(160), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    state: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # progress_doc(state), saved with it
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class DeviceDocument(Base):
    """Signed documents a device uploads (decision records, conformance reports), kept only when verified."""

    __tablename__ = "device_documents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # decision | conformance
    model: Mapped[str | None] = mapped_column(String(64), nullable=True)
    version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    doc: Mapped[dict[str, Any]] = mapped_column(JSON)
    ts: Mapped[float] = mapped_column(Float)
    seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # the device's signed `seq` (freshness.py)
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)  # sha256 of the signed JSON


class DocumentMark(Base):
    """The highest signed `seq` seen per device and kind of document, with the key it came under
    (agent.controlplane.freshness): older or equal ones are refused."""

    __tablename__ = "document_marks"

    device_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    digest: Mapped[str] = mapped_column(String(64))
    signed_ts: Mapped[float | None] = mapped_column(Float, nullable=True)
    received: Mapped[float] = mapped_column(Float)
