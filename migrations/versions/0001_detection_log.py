"""The detection log, sessions with their controls, and judge checks.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "detections",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column("tenant", sa.String(32), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("episode", sa.Integer(), nullable=False),
        sa.Column("episode_limit", sa.Integer(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("request_id", sa.String(256), nullable=True),
        sa.Column("tokens_saved_estimate", sa.Integer(), nullable=False),
        sa.Column("episode_key", sa.String(64), nullable=False),
        sa.UniqueConstraint("episode_key", name="uq_detections_episode_key"),
    )
    op.create_index("ix_detections_created_at", "detections", ["created_at"])
    op.create_index("ix_detections_session", "detections", ["tenant", "session_id", "created_at"])
    op.create_index("ix_detections_type", "detections", ["type", "created_at"])

    op.create_table(
        "sessions",
        sa.Column("tenant", sa.String(32), primary_key=True),
        sa.Column("session_id", sa.String(256), primary_key=True),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("message_count", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("reset_at_message", sa.Integer(), nullable=False),
        sa.Column("controls_changed_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_sessions_last_seen", "sessions", ["last_seen"])
    op.create_index("ix_sessions_controls_changed_at", "sessions", ["controls_changed_at"])

    op.create_table(
        "judge_checks",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("tenant", sa.String(32), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("confirm_confidence", sa.Float(), nullable=True),
        sa.Column("analysis", sa.Text(), nullable=False),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=False),
    )
    op.create_index("ix_judge_checks_session", "judge_checks", ["tenant", "session_id", "task"])


def downgrade() -> None:
    op.drop_index("ix_judge_checks_session", table_name="judge_checks")
    op.drop_table("judge_checks")
    op.drop_index("ix_sessions_controls_changed_at", table_name="sessions")
    op.drop_index("ix_sessions_last_seen", table_name="sessions")
    op.drop_table("sessions")
    op.drop_index("ix_detections_type", table_name="detections")
    op.drop_index("ix_detections_session", table_name="detections")
    op.drop_index("ix_detections_created_at", table_name="detections")
    op.drop_table("detections")
