"""Detections record whether the model moved on after the warning.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("detections") as batch:
        batch.add_column(sa.Column("recovered", sa.Boolean(), nullable=False, server_default=sa.false()))
    # Finding a task's rows (the recovery marks, the stats per task) without a scan.
    op.create_index("ix_detections_task", "detections", ["tenant", "session_id", "task", "episode"])


def downgrade() -> None:
    op.drop_index("ix_detections_task", table_name="detections")
    with op.batch_alter_table("detections") as batch:
        batch.drop_column("recovered")
