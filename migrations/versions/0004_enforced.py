"""Detections record whether they were enforced or only observed (observe mode); existing rows were enforced.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("detections") as batch:
        batch.add_column(sa.Column("enforced", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("detections") as batch:
        batch.drop_column("enforced")
