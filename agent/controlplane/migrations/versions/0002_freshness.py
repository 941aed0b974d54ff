"""freshness of signed device documents: per-device marks, each document's seq and digest

Revision ID: 0002_freshness
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_freshness"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "document_marks",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("signed_ts", sa.Float, nullable=True),
        sa.Column("received", sa.Float, nullable=False),
    )
    with op.batch_alter_table("device_documents") as batch:
        batch.add_column(sa.Column("seq", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("digest", sa.String(64), nullable=True))
        batch.create_index("ix_device_documents_digest", ["digest"])


def downgrade() -> None:
    with op.batch_alter_table("device_documents") as batch:
        batch.drop_index("ix_device_documents_digest")
        batch.drop_column("digest")
        batch.drop_column("seq")
    op.drop_table("document_marks")
