"""Covering indexes for the overview's aggregates: one by time, one by task.

With 100,000 detections in the period, counting by type and action and summing per task scanned the table
through narrower indexes (a lookup per row); these hold every column those queries read.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

PERIOD = ["created_at", "enforced", "type", "action", "tokens_saved_estimate", "tenant", "session_id", "turn",
          "episode"]
TASK = ["tenant", "session_id", "task", "enforced", "created_at", "action", "episode", "recovered"]


def upgrade() -> None:
    op.drop_index("ix_detections_task", table_name="detections")
    op.create_index("ix_detections_task_outcome", "detections", TASK)
    op.create_index("ix_detections_period", "detections", PERIOD)


def downgrade() -> None:
    op.drop_index("ix_detections_period", table_name="detections")
    op.drop_index("ix_detections_task_outcome", table_name="detections")
    op.create_index("ix_detections_task", "detections", ["tenant", "session_id", "task", "episode"])
