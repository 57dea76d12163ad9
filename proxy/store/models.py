"""The log's tables. Schema changes go through Alembic migrations in migrations/ only."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON, BigInteger, Boolean, DateTime, Float, Index, Integer, LargeBinary, String, Text, UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
_ID = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Detection(Base):
    """One episode: a warning given, a stop answered, or a stream cut. Times are naive UTC."""

    __tablename__ = "detections"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(DateTime())
    session_id: Mapped[str] = mapped_column(String(256))
    tenant: Mapped[str] = mapped_column(String(32))
    task: Mapped[str] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(256))
    type: Mapped[str] = mapped_column(String(16))
    action: Mapped[str] = mapped_column(String(16))
    episode: Mapped[int] = mapped_column(Integer())
    episode_limit: Mapped[int] = mapped_column(Integer())
    turn: Mapped[int] = mapped_column(Integer())
    detail: Mapped[dict] = mapped_column(JSON())
    request_id: Mapped[str | None] = mapped_column(String(256))
    tokens_saved_estimate: Mapped[int] = mapped_column(Integer(), default=0)
    # The model answered a request carrying this warning without completing another episode.
    recovered: Mapped[bool] = mapped_column(Boolean(), default=False)
    # False for observe mode: what enforcement would have done, while the request passed unchanged.
    enforced: Mapped[bool] = mapped_column(Boolean(), default=True)
    # One row per episode, however many replicas or requests see it.
    episode_key: Mapped[str] = mapped_column(String(64))
    # A person's word on it: "loop", "not_a_loop", or none given (migration 0011).
    mark: Mapped[str | None] = mapped_column(String(16))
    marked_at: Mapped[datetime | None] = mapped_column(DateTime())
    mark_note: Mapped[str | None] = mapped_column(String(2000))

    __table_args__ = (
        UniqueConstraint("episode_key", name="uq_detections_episode_key"),
        Index("ix_detections_created_at", "created_at"),
        Index("ix_detections_session", "tenant", "session_id", "created_at"),
        Index("ix_detections_type", "type", "created_at"),
        # Covering the overview's aggregates (migration 0005).
        Index("ix_detections_task_outcome", "tenant", "session_id", "task", "enforced", "created_at", "action",
              "episode", "recovered"),
        Index("ix_detections_period", "created_at", "enforced", "type", "action", "tokens_saved_estimate", "tenant",
              "session_id", "turn", "episode"),
        Index("ix_detections_mark", "mark", "created_at"),  # the few marked ones, counted per period
    )


class SessionRow(Base):
    """A session as last seen, and the operator's controls over it."""

    __tablename__ = "sessions"

    tenant: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    first_seen: Mapped[datetime] = mapped_column(DateTime())
    last_seen: Mapped[datetime] = mapped_column(DateTime())
    requests: Mapped[int] = mapped_column(Integer(), default=0)
    message_count: Mapped[int] = mapped_column(Integer(), default=0)
    model: Mapped[str | None] = mapped_column(String(256))
    agent: Mapped[str | None] = mapped_column(String(128))  # the agent and its version, as first seen
    title: Mapped[str | None] = mapped_column(String(120))  # the first prompt, masked and cut
    task: Mapped[str | None] = mapped_column(String(32))  # the task of its latest request (its status reads it)
    disabled: Mapped[bool] = mapped_column(Boolean(), default=False)
    reset_at_message: Mapped[int] = mapped_column(Integer(), default=0)
    reset_at: Mapped[datetime | None] = mapped_column(DateTime())  # the latest reset or resume
    controls_changed_at: Mapped[datetime | None] = mapped_column(DateTime())

    __table_args__ = (
        Index("ix_sessions_last_seen", "last_seen"),
        Index("ix_sessions_controls_changed_at", "controls_changed_at"),
    )


class JudgeCheckRow(Base):
    """A judge's answer on a task at a turn: not in the conversation, so stored."""

    __tablename__ = "judge_checks"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(DateTime())
    tenant: Mapped[str] = mapped_column(String(32))
    session_id: Mapped[str] = mapped_column(String(256))
    task: Mapped[str] = mapped_column(String(32))
    turn: Mapped[int] = mapped_column(Integer())
    confidence: Mapped[float | None] = mapped_column(Float())
    confirm_confidence: Mapped[float | None] = mapped_column(Float())
    analysis: Mapped[str] = mapped_column(Text(), default="")
    model: Mapped[str | None] = mapped_column(String(256))
    tokens: Mapped[int] = mapped_column(Integer(), default=0)

    __table_args__ = (
        Index("ix_judge_checks_session", "tenant", "session_id", "task"),
        Index("ix_judge_checks_created_at", "created_at", "tenant", "tokens"),
    )


class ResponseRow(Base):
    """A response the proxy relayed whose conversation the service keeps (Responses API, `store` on): what
    its request added to the conversation, as sent, and the answer. Requests that continue it with
    `previous_response_id` or a `conversation` id are analysed through these, on every replica."""

    __tablename__ = "responses"

    tenant: Mapped[str] = mapped_column(String(32), primary_key=True)
    response_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    previous_id: Mapped[str | None] = mapped_column(String(128))
    conversation_id: Mapped[str | None] = mapped_column(String(128))
    session_id: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(DateTime())
    messages: Mapped[list] = mapped_column(JSON())

    __table_args__ = (
        Index("ix_responses_conversation", "tenant", "conversation_id", "created_at"),
        Index("ix_responses_created_at", "created_at"),
    )


class DeadLetter(Base):
    """A log record the database refused even alone (after its batch failed and was split): kept here, with
    the reason, for an operator to read, instead of holding back every record behind it."""

    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(DateTime())
    kind: Mapped[str] = mapped_column(String(32))  # the table the record was for
    reason: Mapped[str] = mapped_column(Text())
    record: Mapped[str] = mapped_column(Text())  # the record as JSON text


# -- The overview's counts, kept by the log writer in the same transaction as the rows they count (see
# proxy/store/rollup.py). Buckets are named by their start in Unix seconds.


class CountBucket(Base):
    """Detections in a bucket of five minutes and, apart, of an hour: by tenant, mode, type, action, model."""

    __tablename__ = "count_buckets"

    span: Mapped[int] = mapped_column(Integer(), primary_key=True)  # the bucket's length in seconds
    bucket: Mapped[int] = mapped_column(BigInteger(), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(32), primary_key=True)
    enforced: Mapped[bool] = mapped_column(Boolean(), primary_key=True)
    type: Mapped[str] = mapped_column(String(16), primary_key=True)
    action: Mapped[str] = mapped_column(String(16), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)  # "" when the request named none
    detections: Mapped[int] = mapped_column(BigInteger(), default=0)
    tokens_saved_estimate: Mapped[int] = mapped_column(BigInteger(), default=0)
    first_turns: Mapped[int] = mapped_column(BigInteger(), default=0)  # the turns of episodes 1, summed
    first_episodes: Mapped[int] = mapped_column(BigInteger(), default=0)


class TaskOutcome(Base):
    """A task's story so far: its last detection, its last warning, the last one the model moved on from,
    whether it reached the stop. It counts in the bucket of its last detection."""

    __tablename__ = "task_outcomes"

    tenant: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    task: Mapped[str] = mapped_column(String(32), primary_key=True)
    enforced: Mapped[bool] = mapped_column(Boolean(), primary_key=True)
    last_at: Mapped[datetime | None] = mapped_column(DateTime())
    last_warned: Mapped[int | None] = mapped_column(Integer())
    last_moved_on: Mapped[int | None] = mapped_column(Integer())
    stopped: Mapped[bool] = mapped_column(Boolean(), default=False)

    __table_args__ = (Index("ix_task_outcomes_last_at", "last_at"),)


class SessionCount(Base):
    """A session's detections, and its last enforced one: it is affected in that one's bucket."""

    __tablename__ = "session_counts"

    tenant: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    detections: Mapped[int] = mapped_column(BigInteger(), default=0)
    last_enforced_at: Mapped[datetime | None] = mapped_column(DateTime())

    __table_args__ = (Index("ix_session_counts_last_enforced_at", "last_enforced_at"),)


class OutcomeBucket(Base):
    """Tasks by outcome and sessions affected, each in the five-minute bucket of its last detection."""

    __tablename__ = "outcome_buckets"

    bucket: Mapped[int] = mapped_column(BigInteger(), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(32), primary_key=True)
    enforced: Mapped[bool] = mapped_column(Boolean(), primary_key=True)
    warned_tasks: Mapped[int] = mapped_column(BigInteger(), default=0)
    recovered_tasks: Mapped[int] = mapped_column(BigInteger(), default=0)
    stopped_tasks: Mapped[int] = mapped_column(BigInteger(), default=0)
    sessions: Mapped[int] = mapped_column(BigInteger(), default=0)


class ResumeLink(Base):
    """A stop's one-time resume link: a hash of its token (the token itself is never stored), the session and
    task it lets go on, and when a person used it."""

    __tablename__ = "resume_links"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(32))
    session_id: Mapped[str] = mapped_column(String(256))
    task: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime())
    used_at: Mapped[datetime | None] = mapped_column(DateTime())
    confirm_hash: Mapped[str | None] = mapped_column(String(64))  # the value its page showed last, hashed

    __table_args__ = (Index("ix_resume_links_session", "tenant", "session_id"),)


class CapturedRequest(Base):
    """With CAPTURE_FLAGGED, the request that carried an episode's warning or was refused: its body as the
    client sent it (zlib), never a key or a header, kept for `loopwarden export` and deleted with
    RESPONSE_RETENTION_DAYS."""

    __tablename__ = "captured_requests"

    episode_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime())
    tenant: Mapped[str] = mapped_column(String(32))
    session_id: Mapped[str] = mapped_column(String(256))
    dialect: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(String(512))
    body: Mapped[bytes] = mapped_column(LargeBinary())

    __table_args__ = (Index("ix_captured_requests_created_at", "created_at"),)
