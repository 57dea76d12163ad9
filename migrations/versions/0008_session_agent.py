"""Each session's agent (name and version) and title (its first prompt, masked and cut).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("agent", sa.String(128), nullable=True))
        batch.add_column(sa.Column("title", sa.String(120), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("title")
        batch.drop_column("agent")
