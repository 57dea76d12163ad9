"""The overview's counts, kept as the log is written: detections per five minutes and per hour, each task's
outcome, each session's count, and tasks and sessions per bucket of their last detection. Judge checks by
time.

An existing log is counted here, by the same statements a replica runs when it finds the counts short of
the detections (proxy/store/rollup.py), so `stats` is whole right after the upgrade (about 25 s for
2,000,000 detections).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from proxy.store import rollup

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _count(name: str) -> sa.Column:
    return sa.Column(name, sa.BigInteger(), nullable=False, server_default="0")


def upgrade() -> None:
    op.create_table(
        "count_buckets",
        sa.Column("span", sa.Integer(), primary_key=True),
        sa.Column("bucket", sa.BigInteger(), primary_key=True),
        sa.Column("tenant", sa.String(32), primary_key=True),
        sa.Column("enforced", sa.Boolean(), primary_key=True),
        sa.Column("type", sa.String(16), primary_key=True),
        sa.Column("action", sa.String(16), primary_key=True),
        sa.Column("model", sa.String(256), primary_key=True),
        _count("detections"), _count("tokens_saved_estimate"), _count("first_turns"), _count("first_episodes"),
    )
    op.create_table(
        "task_outcomes",
        sa.Column("tenant", sa.String(32), primary_key=True),
        sa.Column("session_id", sa.String(256), primary_key=True),
        sa.Column("task", sa.String(32), primary_key=True),
        sa.Column("enforced", sa.Boolean(), primary_key=True),
        sa.Column("last_at", sa.DateTime(), nullable=True),
        sa.Column("last_warned", sa.Integer(), nullable=True),
        sa.Column("last_moved_on", sa.Integer(), nullable=True),
        sa.Column("stopped", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_task_outcomes_last_at", "task_outcomes", ["last_at"])
    op.create_table(
        "session_counts",
        sa.Column("tenant", sa.String(32), primary_key=True),
        sa.Column("session_id", sa.String(256), primary_key=True),
        _count("detections"),
        sa.Column("last_enforced_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_session_counts_last_enforced_at", "session_counts", ["last_enforced_at"])
    op.create_table(
        "outcome_buckets",
        sa.Column("bucket", sa.BigInteger(), primary_key=True),
        sa.Column("tenant", sa.String(32), primary_key=True),
        sa.Column("enforced", sa.Boolean(), primary_key=True),
        _count("warned_tasks"), _count("recovered_tasks"), _count("stopped_tasks"), _count("sessions"),
    )
    op.create_index("ix_judge_checks_created_at", "judge_checks", ["created_at", "tenant", "tokens"])
    for statement in rollup.recount(op.get_bind().dialect.name):
        op.execute(statement)


def downgrade() -> None:
    op.drop_index("ix_judge_checks_created_at", table_name="judge_checks")
    for table in ("outcome_buckets", "session_counts", "task_outcomes", "count_buckets"):
        op.drop_table(table)
