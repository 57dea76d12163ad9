"""The batched log writer: never blocks a request, survives a database outage, counts what it drops."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from sqlalchemy import bindparam, func, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store.models import Detection, JudgeCheckRow, ResponseRow, SessionRow

log = logging.getLogger("loopwarden.store")

BATCH = 500
FLUSH_EVERY = 0.25  # seconds: how long a record may wait for company
MAX_BACKOFF = 10.0
DROP_LOG_EVERY = 10.0


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


@dataclass
class SessionSeen:
    """A request seen for a session; many of them fold into one upsert per flush."""

    tenant: str
    session_id: str
    message_count: int
    model: str | None
    at: datetime = field(default_factory=utcnow)


def dialect_insert(engine: AsyncEngine, table):
    return (postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert)(table)


class LogWriter:
    """Detections, judge checks and session sightings go on a bounded buffer and out in batches."""

    def __init__(self, engine: AsyncEngine, capacity: int = 10_000,
                 on_drop: Callable[[int], None] | None = None) -> None:
        self.engine = engine
        self.capacity = capacity
        self.dropped = 0
        self.written = 0
        self._rows: deque[dict] = deque()  # detection and judge rows, each {"table": ..., "values": ...}
        self._sessions: dict[tuple[str, str], tuple[SessionSeen, int]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self._failing_since: float | None = None
        self._on_drop = on_drop
        self._drop_logged_at = float("-inf")
        self._insert_detections = dialect_insert(engine, Detection).on_conflict_do_nothing(
            index_elements=["episode_key"])
        self._insert_checks = dialect_insert(engine, JudgeCheckRow)
        self._insert_responses = dialect_insert(engine, ResponseRow).on_conflict_do_nothing(
            index_elements=["tenant", "response_id"])
        self._mark_recovered = update(Detection).where(
            Detection.tenant == bindparam("b_tenant"), Detection.session_id == bindparam("b_session_id"),
            Detection.task == bindparam("b_task"), Detection.episode == bindparam("b_episode"),
        ).values(recovered=True)
        upsert = dialect_insert(engine, SessionRow)
        self._upsert_sessions = upsert.on_conflict_do_update(
            index_elements=["tenant", "session_id"],
            set_={
                "last_seen": upsert.excluded.last_seen,
                "requests": SessionRow.requests + upsert.excluded.requests,
                "message_count": upsert.excluded.message_count,
                "model": func.coalesce(upsert.excluded.model, SessionRow.model),
            },
        )
        self._flushing = asyncio.Lock()
        self._in_flight = 0  # the background task and an operator's call may both flush

    # -- the request path: synchronous, O(1), never raises ------------------------------------------------

    def add_detection(self, values: dict) -> None:
        self._add({"table": Detection, "values": values})

    def add_judge_check(self, values: dict) -> None:
        self._add({"table": JudgeCheckRow, "values": values})

    def add_response(self, values: dict) -> None:
        self._add({"table": ResponseRow, "values": values})

    def add_recovery(self, values: dict) -> None:
        """Mark a task's episode as answered by a model that moved on (b_tenant, b_session_id, b_task,
        b_episode). Written after the rows before it, so the episode's own row is there first."""
        self._add({"table": "recovered", "values": values})

    def session_seen(self, seen: SessionSeen) -> None:
        key = (seen.tenant, seen.session_id)
        previous = self._sessions.get(key)
        if previous is None and len(self._sessions) >= self.capacity:
            self._count_drop(1)
            return
        self._sessions[key] = (seen, (previous[1] if previous else 0) + 1)
        if len(self._sessions) >= BATCH:
            self._wake.set()

    def _add(self, row: dict) -> None:
        if len(self._rows) >= self.capacity:
            self._rows.popleft()  # the oldest goes: the newest says most about now
            self._count_drop(1)
        self._rows.append(row)
        if len(self._rows) >= BATCH:
            self._wake.set()

    def _count_drop(self, count: int) -> None:
        self.dropped += count
        if self._on_drop is not None:
            self._on_drop(count)
        now = time.monotonic()
        if now - self._drop_logged_at >= DROP_LOG_EVERY:  # one line per interval, not one per record
            self._drop_logged_at = now
            log.warning("detection log buffer full: dropping records, %d dropped in all", self.dropped)

    @property
    def pending(self) -> int:
        """Records not written yet, counting a batch on its way to the database."""
        return len(self._rows) + len(self._sessions) + self._in_flight

    # -- the background task --------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loopwarden-log-writer")

    async def close(self, timeout: float = 5.0) -> None:
        """Flush what is buffered (within `timeout`), then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout)
            except asyncio.TimeoutError:
                lost = self.pending
                if lost:
                    self._count_drop(lost)
            self._task = None

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            if not self._closing:
                try:
                    await asyncio.wait_for(self._wake.wait(), FLUSH_EVERY)
                except asyncio.TimeoutError:
                    pass
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # the database is down or refused the batch: keep, retry later
                if self._failing_since is None:
                    self._failing_since = asyncio.get_running_loop().time()
                    log.warning("detection log write failed, will retry: %s", str(exc).splitlines()[0])
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            if self._failing_since is not None:
                log.warning("detection log writes recovered")
                self._failing_since = None
            backoff = 0.5
            if self._closing and not self.pending:
                return

    async def flush(self) -> None:
        """Write what is buffered now. On failure the records go back to the buffer."""
        async with self._flushing:
            while await self._flush_batch():
                pass

    async def _flush_batch(self) -> bool:
        """Write one batch; True when a full batch went out and more may be waiting."""
        rows = [self._rows.popleft() for _ in range(min(BATCH, len(self._rows)))]
        keys = list(itertools.islice(self._sessions, BATCH))
        sessions = [(key, self._sessions.pop(key)) for key in keys]
        if not rows and not sessions:
            return False
        self._in_flight = len(rows) + len(sessions)
        try:
            async with self.engine.begin() as connection:
                detections = [r["values"] for r in rows if r["table"] is Detection]
                checks = [r["values"] for r in rows if r["table"] is JudgeCheckRow]
                recoveries = [r["values"] for r in rows if r["table"] == "recovered"]
                responses = [r["values"] for r in rows if r["table"] is ResponseRow]
                if responses:
                    await connection.execute(self._insert_responses, responses)
                if detections:
                    await connection.execute(self._insert_detections, detections)
                if checks:
                    await connection.execute(self._insert_checks, checks)
                if recoveries:
                    await connection.execute(self._mark_recovered, recoveries)
                if sessions:
                    await connection.execute(self._upsert_sessions, [
                        {"tenant": seen.tenant, "session_id": seen.session_id, "first_seen": seen.at,
                         "last_seen": seen.at, "requests": count, "message_count": seen.message_count,
                         "model": seen.model, "disabled": False, "reset_at_message": 0}
                        for _, (seen, count) in sessions])
        except BaseException:
            self._restore(rows, sessions)
            raise
        finally:
            self._in_flight = 0
        self.written += len(rows)
        log.debug("wrote %d log records and %d session sightings", len(rows), len(sessions))
        return len(rows) == BATCH or len(sessions) == BATCH

    def _restore(self, rows: list[dict], sessions: list) -> None:
        """Put a batch that could not be written back in front, within the buffer's bound."""
        room = self.capacity - len(self._rows)
        if room < len(rows):
            self._count_drop(len(rows) - max(room, 0))
            rows = rows[len(rows) - max(room, 0):]  # the oldest go first
        self._rows.extendleft(reversed(rows))
        for key, (seen, count) in sessions:
            newer = self._sessions.get(key)
            self._sessions[key] = (newer[0], newer[1] + count) if newer else (seen, count)
