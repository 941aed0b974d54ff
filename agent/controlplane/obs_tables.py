"""The tables of what the service observes (migration 0005_telemetry): health telemetry downsampled per device
and per device and model, the last sample heard from each device, one evidence row per device and model version
(the fleet evidence matrix), and alerts with their webhook delivery."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from agent.controlplane.models import Base


class TelemetryPoint(Base):
    """One bucket of one device's health: gauges are the mean of the `n` samples received in the bucket."""

    __tablename__ = "telemetry_points"

    device_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True, index=True)  # the bucket's start (service clock)
    n: Mapped[int] = mapped_column(Integer, default=1)
    cpu_percent: Mapped[float | None] = mapped_column(Float, nullable=True)
    load_1m: Mapped[float | None] = mapped_column(Float, nullable=True)
    mem_used_percent: Mapped[float | None] = mapped_column(Float, nullable=True)
    rss_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)
    disk_used_percent: Mapped[float | None] = mapped_column(Float, nullable=True)
    temp_max_c: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_load_percent: Mapped[float | None] = mapped_column(Float, nullable=True)
    throttled: Mapped[int | None] = mapped_column(Integer, nullable=True)  # 1: a "now" flag was set in the bucket


class ModelPoint(Base):
    """One bucket of one model's serving figures on one device: counters and percentiles as last reported,
    rates derived from the counters between two samples (None across a restart or a new version)."""

    __tablename__ = "model_points"

    device_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(64), primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True, index=True)
    version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    requests: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    errors: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    req_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    err_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p50_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)


class TelemetryHead(Base):
    """What the last health message of a device said: when it was received (silence), its own `ts` (a retained
    copy delivered again is not counted twice) and each model's counters (the next rate)."""

    __tablename__ = "telemetry_heads"

    device_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    heard_at: Mapped[float] = mapped_column(Float, index=True)
    device_ts: Mapped[float | None] = mapped_column(Float, nullable=True)
    counters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class EvidenceRow(Base):
    """The newest decision record of one device for one model version, reduced to what the matrix shows."""

    __tablename__ = "evidence_rows"

    device_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    doc_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ts: Mapped[float] = mapped_column(Float)
    provider: Mapped[str | None] = mapped_column(String(64), nullable=True)
    precision: Mapped[str | None] = mapped_column(String(32), nullable=True)
    p50_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_rel: Mapped[float | None] = mapped_column(Float, nullable=True)
    not_judged: Mapped[bool] = mapped_column(Boolean, default=False)


class Alert(Base):
    """One condition (its key), raised once until cleared; `send_state`: none (no webhook), pending, sent,
    failed."""

    __tablename__ = "alerts"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    subject: Mapped[str] = mapped_column(String(160), index=True)
    message: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    raised_at: Mapped[float] = mapped_column(Float)
    seen_at: Mapped[float] = mapped_column(Float)
    cleared_at: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    send_state: Mapped[str] = mapped_column(String(16), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    send_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class ClassPoint(Base):
    """One bucket of one hardware class's health, kept as devices report (so a class's chart reads its own rows,
    never every device's): per gauge the sum and count of its devices' bucket means (a device's mean changing
    within the bucket replaces its share), the hottest sample, and 1 when a sample was throttled."""

    __tablename__ = "class_points"

    target: Mapped[str] = mapped_column(String(64), primary_key=True)  # "": devices of no known class
    ts: Mapped[float] = mapped_column(Float, primary_key=True, index=True)
    cpu_percent_sum: Mapped[float] = mapped_column(Float, default=0.0)
    cpu_percent_n: Mapped[int] = mapped_column(Integer, default=0)
    load_1m_sum: Mapped[float] = mapped_column(Float, default=0.0)
    load_1m_n: Mapped[int] = mapped_column(Integer, default=0)
    mem_used_percent_sum: Mapped[float] = mapped_column(Float, default=0.0)
    mem_used_percent_n: Mapped[int] = mapped_column(Integer, default=0)
    rss_bytes_sum: Mapped[float] = mapped_column(Float, default=0.0)
    rss_bytes_n: Mapped[int] = mapped_column(Integer, default=0)
    disk_used_percent_sum: Mapped[float] = mapped_column(Float, default=0.0)
    disk_used_percent_n: Mapped[int] = mapped_column(Integer, default=0)
    gpu_load_percent_sum: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_load_percent_n: Mapped[int] = mapped_column(Integer, default=0)
    temp_max_c: Mapped[float | None] = mapped_column(Float, nullable=True)
    throttled: Mapped[int | None] = mapped_column(Integer, nullable=True)


class ClassModelPoint(Base):
    """One bucket of one model's serving figures over a hardware class: requests/s and errors/s summed over its
    devices (each device's latest rate in the bucket), the mean of their p50, the worst p99 sample."""

    __tablename__ = "class_model_points"

    target: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(64), primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True, index=True)
    version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    req_per_s_sum: Mapped[float] = mapped_column(Float, default=0.0)
    req_per_s_n: Mapped[int] = mapped_column(Integer, default=0)
    err_per_s_sum: Mapped[float] = mapped_column(Float, default=0.0)
    err_per_s_n: Mapped[int] = mapped_column(Integer, default=0)
    p50_ms_sum: Mapped[float] = mapped_column(Float, default=0.0)
    p50_ms_n: Mapped[int] = mapped_column(Integer, default=0)
    p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
