"""A session's current task and its latest reset, which its status (stopped, warned, ok, off) is read from.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("task", sa.String(32), nullable=True))
        batch.add_column(sa.Column("reset_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("reset_at")
        batch.drop_column("task")
