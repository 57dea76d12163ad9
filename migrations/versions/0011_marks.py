"""A person's word on a detection (a loop, or not), and the requests kept with flagged detections.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("detections") as table:
        table.add_column(sa.Column("mark", sa.String(16), nullable=True))
        table.add_column(sa.Column("marked_at", sa.DateTime(), nullable=True))
        table.add_column(sa.Column("mark_note", sa.String(2000), nullable=True))
    op.create_index("ix_detections_mark", "detections", ["mark", "created_at"])
    op.create_table(
        "captured_requests",
        sa.Column("episode_key", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("tenant", sa.String(32), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column("dialect", sa.String(16), nullable=False),
        sa.Column("path", sa.String(512), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_captured_requests_created_at", "captured_requests", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_captured_requests_created_at", "captured_requests")
    op.drop_table("captured_requests")
    op.drop_index("ix_detections_mark", "detections")
    with op.batch_alter_table("detections") as table:
        table.drop_column("mark_note")
        table.drop_column("marked_at")
        table.drop_column("mark")
