"""Responses the service keeps, so chained Responses conversations can be followed on every replica.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("tenant", sa.String(32), primary_key=True),
        sa.Column("response_id", sa.String(128), primary_key=True),
        sa.Column("previous_id", sa.String(128), nullable=True),
        sa.Column("conversation_id", sa.String(128), nullable=True),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("messages", sa.JSON(), nullable=False),
    )
    op.create_index("ix_responses_conversation", "responses", ["tenant", "conversation_id", "created_at"])
    op.create_index("ix_responses_created_at", "responses", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_responses_created_at", table_name="responses")
    op.drop_index("ix_responses_conversation", table_name="responses")
    op.drop_table("responses")
