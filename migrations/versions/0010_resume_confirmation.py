"""A resume link's page shows a one-time value drawn on the server (kept hashed), never one derived from the link.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("resume_links") as table:
        table.add_column(sa.Column("confirm_hash", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("resume_links") as table:
        table.drop_column("confirm_hash")
