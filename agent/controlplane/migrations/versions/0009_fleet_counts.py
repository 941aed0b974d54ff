"""the overview's counts kept as devices change: fleet_counts (one row per combination of the grouped columns),
filled from the devices table

Revision ID: 0009_fleet_counts
Revises: 0008_agent_release
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_fleet_counts"
down_revision = "0008_agent_release"
branch_labels = None
depends_on = None

KEY = ("state", "target", "provider", "precision", "model_versions", "model_state", "online")


def upgrade() -> None:
    from agent.controlplane.fleetcounts import key_hash

    table = op.create_table(
        "fleet_counts",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=True),
        sa.Column("target", sa.String(64), nullable=True),
        sa.Column("provider", sa.String(64), nullable=True),
        sa.Column("precision", sa.String(255), nullable=True),
        sa.Column("model_versions", sa.String(255), nullable=True),
        sa.Column("model_state", sa.String(255), nullable=True),
        sa.Column("online", sa.Boolean, nullable=False),
        sa.Column("devices", sa.BigInteger, nullable=False),
    )
    devices = sa.table("devices", *(sa.column(k) for k in KEY))
    cols = [devices.c[k] for k in KEY]
    counts: dict[tuple, int] = {}
    for row in op.get_bind().execute(sa.select(*cols, sa.func.count()).group_by(*cols)):
        k = (*row[:-2], bool(row[-2]))
        counts[k] = counts.get(k, 0) + int(row[-1])
    rows = [dict(zip(KEY, k), key=key_hash(k), devices=n) for k, n in sorted(counts.items(), key=str)]
    if rows:
        op.bulk_insert(table, rows)


def downgrade() -> None:
    op.drop_table("fleet_counts")
