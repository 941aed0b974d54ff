"""telemetry downsampled per device, per model and per hardware class, evidence rows for the fleet matrix, alerts

Revision ID: 0005_telemetry
Revises: 0002_freshness
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_telemetry"
down_revision = "0004_replicas"
branch_labels = None
depends_on = None


def _floats(*names: str) -> list[sa.Column]:
    return [sa.Column(n, sa.Float, nullable=True) for n in names]


def _telemetry() -> None:
    op.create_table(
        "telemetry_points",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("ts", sa.Float, primary_key=True),
        sa.Column("n", sa.Integer, nullable=False),
        *_floats("cpu_percent", "load_1m", "mem_used_percent", "rss_bytes", "disk_used_percent"),
        *_floats("temp_max_c", "gpu_load_percent"),
        sa.Column("throttled", sa.Integer, nullable=True),
    )
    op.create_index("ix_telemetry_points_ts", "telemetry_points", ["ts"])
    op.create_table(
        "model_points",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(64), primary_key=True),
        sa.Column("ts", sa.Float, primary_key=True),
        sa.Column("version", sa.String(64), nullable=True),
        sa.Column("requests", sa.BigInteger, nullable=True),
        sa.Column("errors", sa.BigInteger, nullable=True),
        *_floats("req_per_s", "err_per_s", "p50_ms", "p99_ms"),
    )
    op.create_index("ix_model_points_ts", "model_points", ["ts"])
    op.create_table(
        "telemetry_heads",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("heard_at", sa.Float, nullable=False),
        sa.Column("device_ts", sa.Float, nullable=True),
        sa.Column("counters", sa.JSON, nullable=False),
    )
    op.create_index("ix_telemetry_heads_heard_at", "telemetry_heads", ["heard_at"])


def _sums(*names: str) -> list[sa.Column]:
    cols = []
    for n in names:
        cols += [sa.Column(f"{n}_sum", sa.Float, nullable=False), sa.Column(f"{n}_n", sa.Integer, nullable=False)]
    return cols


def _classes() -> None:
    op.create_table(
        "class_points",
        sa.Column("target", sa.String(64), primary_key=True),
        sa.Column("ts", sa.Float, primary_key=True),
        *_sums("cpu_percent", "load_1m", "mem_used_percent", "rss_bytes", "disk_used_percent", "gpu_load_percent"),
        sa.Column("temp_max_c", sa.Float, nullable=True),
        sa.Column("throttled", sa.Integer, nullable=True),
    )
    op.create_index("ix_class_points_ts", "class_points", ["ts"])
    op.create_table(
        "class_model_points",
        sa.Column("target", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(64), primary_key=True),
        sa.Column("ts", sa.Float, primary_key=True),
        sa.Column("version", sa.String(64), nullable=True),
        *_sums("req_per_s", "err_per_s", "p50_ms"),
        sa.Column("p99_ms", sa.Float, nullable=True),
    )
    op.create_index("ix_class_model_points_ts", "class_model_points", ["ts"])


def _evidence_and_alerts() -> None:
    op.create_table(
        "evidence_rows",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(64), primary_key=True),
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("doc_id", sa.Integer, nullable=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("provider", sa.String(64), nullable=True),
        sa.Column("precision", sa.String(32), nullable=True),
        *_floats("p50_ms", "p99_ms", "max_rel"),
        sa.Column("not_judged", sa.Boolean, nullable=False),
    )
    op.create_index("ix_evidence_rows_model_version", "evidence_rows", ["model", "version"])
    op.create_table(
        "alerts",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(160), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.Column("raised_at", sa.Float, nullable=False),
        sa.Column("seen_at", sa.Float, nullable=False),
        sa.Column("cleared_at", sa.Float, nullable=True),
        sa.Column("send_state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("sent_at", sa.Float, nullable=True),
        sa.Column("send_error", sa.Text, nullable=True),
    )
    op.create_index("ix_alerts_kind", "alerts", ["kind"])
    op.create_index("ix_alerts_subject", "alerts", ["subject"])
    op.create_index("ix_alerts_cleared_at", "alerts", ["cleared_at"])
    op.create_index("ix_alerts_send_state", "alerts", ["send_state"])


def upgrade() -> None:
    _telemetry()
    _classes()
    _evidence_and_alerts()


def downgrade() -> None:
    tables = ("alerts", "evidence_rows", "class_model_points", "class_points", "telemetry_heads", "model_points")
    for table in (*tables, "telemetry_points"):
        op.drop_table(table)
