"""whole-fleet views from indexed columns: each device's precision, model versions and model state (and a small
per-model summary for lists), backfilled from the stored status documents; each rollout's progress document

Revision ID: 0003_fleet_columns
Revises: 0002_freshness
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_fleet_columns"
down_revision = "0002_freshness"
branch_labels = None
depends_on = None

COLUMNS = ("precision", "model_versions", "model_state")


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.String(255), nullable=True))
        batch.add_column(sa.Column("models_summary", sa.JSON, nullable=True))
    for name in COLUMNS:
        op.create_index(f"ix_devices_{name}", "devices", [name])
    op.create_index(
        "ix_devices_cohort", "devices", ["state", "target", "provider", "precision", "model_versions", "online"]
    )
    op.create_index("ix_devices_state_id", "devices", ["state", "device_id"])
    op.create_index("ix_devices_state_model_state", "devices", ["state", "model_state"])
    with op.batch_alter_table("rollouts") as batch:  # lists read it instead of every device's rollout state
        batch.add_column(sa.Column("progress", sa.JSON, nullable=True))
    _backfill()
    if op.get_bind().dialect.name == "postgresql":
        _autovacuum()


def _autovacuum() -> None:
    """PostgreSQL: the overview's counts are index-only scans, which stay index-only while the visibility map is
    fresh; statuses rewrite device rows all day, so the devices table is vacuumed and analysed after 2 % of its
    rows changed (the default waits for 20 %), and analysed now (the backfill changed every row)."""
    factors = ["autovacuum_vacuum_scale_factor = 0.02", "autovacuum_analyze_scale_factor = 0.02"]
    if int(op.get_bind().exec_driver_sql("SHOW server_version_num").scalar() or 0) >= 130000:
        factors.append("autovacuum_vacuum_insert_scale_factor = 0.02")
    op.execute(f"ALTER TABLE devices SET ({', '.join(factors)})")
    op.execute("ANALYZE devices")


def _backfill() -> None:
    """Every device with a stored status gets its columns, a batch of 500 rows at a time (keyset on the id)."""
    from agent.controlplane import cohort
    from agent.controlplane.docschema import clean

    devices = sa.table(
        "devices",
        sa.column("device_id", sa.String),
        sa.column("status", sa.JSON),
        *(sa.column(n, sa.String) for n in COLUMNS),
        sa.column("models_summary", sa.JSON),
    )
    conn = op.get_bind()
    last = ""
    while True:
        rows = conn.execute(
            sa.select(devices.c.device_id, devices.c.status)
            .where(devices.c.device_id > last, devices.c.status.isnot(None))
            .order_by(devices.c.device_id)
            .limit(500)
        ).all()
        if not rows:
            return
        for device_id, status in rows:
            doc = clean("status", status) if isinstance(status, dict) else {}
            values = dict(cohort.columns(doc), models_summary=cohort.summary(doc))
            conn.execute(devices.update().where(devices.c.device_id == device_id).values(**values))
        last = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("progress")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE devices RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor)")
    op.drop_index("ix_devices_state_model_state", "devices")
    op.drop_index("ix_devices_state_id", "devices")
    op.drop_index("ix_devices_cohort", "devices")
    for name in COLUMNS:
        op.drop_index(f"ix_devices_{name}", "devices")
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("models_summary")
        for name in reversed(COLUMNS):
            batch.drop_column(name)
