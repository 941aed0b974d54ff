"""each device's agent release (issue 40): devices.agent_version and devices.agent_release (its trial), kept from
its verified status as it arrives, so a device list shows them without reading a status document

Revision ID: 0008_agent_release
Revises: 0007_unjudged
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_agent_release"
down_revision = "0007_unjudged"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("agent_version", sa.String(64), nullable=True))
        batch.add_column(sa.Column("agent_release", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("agent_release")
        batch.drop_column("agent_version")
