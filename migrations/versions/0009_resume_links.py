"""One-time resume links: a person lets a stopped session go on.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "resume_links",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(32), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("used_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_resume_links_session", "resume_links", ["tenant", "session_id"])


def downgrade() -> None:
    op.drop_index("ix_resume_links_session", "resume_links")
    op.drop_table("resume_links")
