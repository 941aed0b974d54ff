"""replicas on one PostgreSQL: the leader lease (fencing token), dashboard sessions, rate-limit buckets, the
ledger of desired-state publications

Revision ID: 0004_replicas
Revises: 0002_freshness
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_replicas"
down_revision = "0003_fleet_columns"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(160), nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
    )
    op.create_table(
        "web_sessions",
        sa.Column("sid_hash", sa.String(64), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created", sa.Float, nullable=False, index=True),
        sa.Column("flash", sa.Text, nullable=True),
    )
    op.create_table(
        "rate_buckets",
        sa.Column("bucket", sa.String(200), primary_key=True),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("at", sa.Float, nullable=False, index=True),
    )
    op.create_table(
        "desired_publications",
        sa.Column("rollout_id", sa.String(140), primary_key=True),
        sa.Column("round", sa.String(160), primary_key=True),
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("sent_at", sa.Float, nullable=True),
    )


def downgrade() -> None:
    for table in ("desired_publications", "rate_buckets", "web_sessions", "leader_lease"):
        op.drop_table(table)
