"""the operator's word on a rollout's devices not judged (accept or roll back): rollouts.unjudged_decision

Revision ID: 0007_unjudged
Revises: 0002_freshness
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_unjudged"
down_revision = "0005_telemetry"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("unjudged_decision", sa.String(160), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("unjudged_decision")
