"""initial control-plane schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("public_key", sa.Text, nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True, unique=True),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("target", sa.String(64), nullable=True, index=True),
        sa.Column("provider", sa.String(64), nullable=True, index=True),
        sa.Column("online", sa.Boolean, nullable=False),
        sa.Column("hardware", sa.JSON, nullable=False),
        sa.Column("status", sa.JSON, nullable=True),
        sa.Column("status_ts", sa.Float, nullable=True),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.Column("decided_at", sa.Float, nullable=True),
        sa.Column("decided_by", sa.String(64), nullable=True),
    )
    op.create_table(
        "device_groups",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("group_name", sa.String(64), primary_key=True, index=True),
    )
    op.create_table(
        "enroll_nonces",
        sa.Column("nonce", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
    )
    op.create_table(
        "enroll_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("uses_left", sa.Integer, nullable=False),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "operator_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Float, nullable=False, index=True),
        sa.Column("actor", sa.String(80), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(160), nullable=True),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False, index=True),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("name", "version"),
    )
    op.create_table(
        "rollouts",
        sa.Column("rollout_id", sa.String(140), primary_key=True),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("knobs", sa.JSON, nullable=False),
        sa.Column("phase", sa.String(16), nullable=False, index=True),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("rollback_requested", sa.String(160), nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("state", sa.JSON, nullable=True),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "device_documents",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(64), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model", sa.String(64), nullable=True),
        sa.Column("version", sa.String(64), nullable=True),
        sa.Column("doc", sa.JSON, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for name in (
        "device_documents",
        "rollouts",
        "model_versions",
        "audit_log",
        "operator_tokens",
        "enroll_tokens",
        "enroll_nonces",
        "device_groups",
        "devices",
    ):
        op.drop_table(name)
