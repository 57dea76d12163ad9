"""The batched log writer: never blocks a request, survives a database outage, counts what it drops."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import orjson
from sqlalchemy import bindparam, func, insert, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError

from proxy.store import clean, rollup
from proxy.store.database import create_engine, dialect_insert, ping
from proxy.store.models import (
    CapturedRequest, DeadLetter, Detection, JudgeCheckRow, ResponseRow, ResumeLink, SessionRow)

log = logging.getLogger("loopwarden.store")

BATCH = 500
FLUSH_EVERY = 0.25  # seconds: how long a record may wait for company
# Requests kept with flagged detections (CAPTURE_FLAGGED): one larger than this is not kept (a log line says
# so), and those waiting for the database hold at most CAPTURE_BUFFER_BYTES (the oldest dropped, counted).
CAPTURE_MAX_BYTES = 8 * 1024 * 1024
CAPTURE_BUFFER_BYTES = 64 * 1024 * 1024
MAX_BACKOFF = 10.0
DROP_LOG_EVERY = 10.0


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _refused_data(exc: Exception) -> bool:
    """The database (or its driver) refused a value, not the write: a value too long, out of range, not
    encodable, a constraint broken. A missing table, a lost connection or a lock is not the data's fault: the
    batch waits and is tried again whole."""
    if isinstance(exc, (DataError, IntegrityError)):
        return True
    return isinstance(exc, StatementError) and not isinstance(exc, DBAPIError)  # refused before it was sent


RECOVERY = "recovered"  # a mark set on a buffered or written episode's detections, not a table of its own


@dataclass(slots=True)
class Pending:
    """One record waiting in the buffer: where it goes (a table's model, or RECOVERY), its column values as
    the table holds them, and, for a detection, its episode (a recovery mark finds its rows by it)."""

    table: Any
    values: dict
    episode: tuple | None = None


@dataclass(slots=True)
class SessionSeen:
    """A session's requests since the last flush, folded into one upsert: the latest sighting's counts and
    time, the first sighting's agent and title, each text as its column holds it."""

    tenant: str
    session_id: str
    message_count: int
    model: str | None
    agent: str | None = None  # the agent that sent the session's first request seen, and its version
    title: str | None = None  # its first prompt, masked and cut
    task: str | None = None  # the task its latest request is in (None: not read)
    at: float = 0.0  # when last seen (time.time())
    requests: int = 1

    def merge(self, earlier: "SessionSeen") -> None:
        """Fold an earlier sighting (of the same session) into this later one."""
        self.agent = earlier.agent or self.agent
        self.title = earlier.title or self.title
        self.model = self.model or earlier.model
        self.task = self.task or earlier.task
        self.requests += earlier.requests

    def row(self) -> dict:
        at = datetime.fromtimestamp(self.at, timezone.utc).replace(tzinfo=None)
        return {"tenant": self.tenant, "session_id": self.session_id, "first_seen": at, "last_seen": at,
                "requests": self.requests, "message_count": self.message_count, "model": self.model,
                "agent": self.agent, "title": self.title, "task": self.task, "disabled": False,
                "reset_at_message": 0}


class LogWriter:
    """Detections, judge checks and session sightings go on a bounded buffer and out in batches.

    The writing runs on a thread of its own, with its own event loop and its own connections: when the
    proxy's loop is saturated with requests, a batch's round trips to the database do not wait behind
    them (on the proxy's loop, the log once fell seconds behind a busy proxy, all of it lost to a kill).
    The request path only appends to the buffer, under a lock held for an append.
    """

    def __init__(self, database_url: str, capacity: int = 10_000,
                 on_drop: Callable[[int], None] | None = None, on_reject: Callable[[], None] | None = None) -> None:
        self.database_url = database_url
        self.capacity = capacity
        self.dropped = 0
        self.rejected = 0  # records the database refused even alone, kept in dead_letters
        self._on_reject = on_reject
        self.written = 0
        self._lock = threading.Lock()  # the buffer is shared by the proxy's loop and the writer's thread
        self._rows: deque[Pending] = deque()  # every record but a session's sighting
        self._sessions: dict[tuple[str, str], SessionSeen] = {}
        # Detections still in the buffer, by episode: a recovery mark for one is set on its rows.
        self._buffered_episodes: dict[tuple, list[dict]] = {}
        self._in_flight = 0  # a batch on its way to the database
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._wake: asyncio.Event | None = None
        self._closing = False
        self._abandon = False
        self._failing_since: float | None = None
        self._on_drop = on_drop
        # Called (on the writer's thread) with the detections a batch inserted first: another replica, or a
        # resent request, may have logged the same episode already, and then it is not called for it.
        self.on_inserted = None
        self._drop_logged_at = float("-inf")
        self._captures: deque[dict] = deque()  # requests kept with flagged detections, waiting (their bodies raw)
        self._captured_bytes = 0
        dialect = self._dialect = make_url(database_url).get_backend_name()
        # What a batch inserted comes back (a duplicate episode inserts nothing) for the overview's counts.
        self._insert_detections = dialect_insert(dialect, Detection).on_conflict_do_nothing(
            index_elements=["episode_key"]).returning(*rollup.COUNTED, Detection.episode_key, Detection.id)
        self._insert_captures = dialect_insert(dialect, CapturedRequest).on_conflict_do_nothing(
            index_elements=["episode_key"])
        self._insert_checks = dialect_insert(dialect, JudgeCheckRow)
        self._insert_links = dialect_insert(dialect, ResumeLink)
        self._insert_responses = dialect_insert(dialect, ResponseRow).on_conflict_do_nothing(
            index_elements=["tenant", "response_id"])
        self._mark_recovered = update(Detection).where(
            Detection.tenant == bindparam("b_tenant"), Detection.session_id == bindparam("b_session_id"),
            Detection.task == bindparam("b_task"), Detection.episode == bindparam("b_episode"),
        ).values(recovered=True)
        # Where each kind of record goes, in the order a batch writes them (a detection's response and link
        # first; its recovery mark after it).
        self._statements = ((ResumeLink, self._insert_links), (ResponseRow, self._insert_responses),
                            (Detection, self._insert_detections), (JudgeCheckRow, self._insert_checks),
                            (RECOVERY, self._mark_recovered))
        upsert = dialect_insert(dialect, SessionRow)
        self._upsert_sessions = upsert.on_conflict_do_update(
            index_elements=["tenant", "session_id"],
            set_={
                "last_seen": upsert.excluded.last_seen,
                "requests": SessionRow.requests + upsert.excluded.requests,
                "message_count": upsert.excluded.message_count,
                "model": func.coalesce(upsert.excluded.model, SessionRow.model),
                # The first seen wins: another replica's later sighting never renames a session.
                "agent": func.coalesce(SessionRow.agent, upsert.excluded.agent),
                "title": func.coalesce(SessionRow.title, upsert.excluded.title),
                "task": func.coalesce(upsert.excluded.task, SessionRow.task),
            },
        )

    # -- the request path: synchronous, O(1), never raises ------------------------------------------------

    def add_detection(self, values: dict) -> None:
        clean.row(Detection, values)
        values.setdefault("recovered", False)  # every row of a batch has the same keys
        self._add(Pending(Detection, values, (values["tenant"], values["session_id"], values["task"],
                                              values["episode"])))

    def add_judge_check(self, values: dict) -> None:
        self._add(Pending(JudgeCheckRow, clean.row(JudgeCheckRow, values)))

    def add_response(self, values: dict) -> None:
        self._add(Pending(ResponseRow, clean.row(ResponseRow, values)))

    def add_resume_link(self, values: dict) -> None:
        self._add(Pending(ResumeLink, clean.row(ResumeLink, values)))

    def add_capture(self, values: dict) -> None:
        """A request kept with a flagged detection (episode_key, created_at, tenant, session_id, dialect, path,
        body as the client sent it): compressed and written on the writer's thread, apart from the log's
        batches, within CAPTURE_BUFFER_BYTES."""
        size = len(values["body"])
        if size > CAPTURE_MAX_BYTES:
            log.warning("the request of episode %s is %d bytes: over %d, not kept", values["episode_key"][:12],
                        size, CAPTURE_MAX_BYTES)
            return
        dropped = 0
        with self._lock:
            self._captures.append(clean.row(CapturedRequest, values))
            self._captured_bytes += size
            while self._captured_bytes > CAPTURE_BUFFER_BYTES:
                self._captured_bytes -= len(self._captures.popleft()["body"])
                dropped += 1
        if dropped:
            self._count_drop(dropped)

    def add_recovery(self, values: dict) -> None:
        """Mark a task's episode as answered by a model that moved on (b_tenant, b_session_id, b_task,
        b_episode). An episode whose rows are still buffered takes the mark on them (a busy or unreachable
        database then holds one record per warning, not two); otherwise the mark is written after the rows
        before it, so the episode's own rows are there first."""
        key = (values["b_tenant"], values["b_session_id"], values["b_task"], values["b_episode"])
        with self._lock:
            buffered = self._buffered_episodes.get(key)
            if buffered:
                for row in buffered:
                    row["recovered"] = True
                return
        self._add(Pending(RECOVERY, values))

    def session_seen(self, tenant: str, session_id: str, message_count: int, model: str | None,
                     agent: str | None = None, title: str | None = None, task: str | None = None) -> None:
        """A request of a session. Called on every request: a session already in the batch is one lookup (keyed
        by its id as the table holds it, which is the id as sent but for a rare one the cleaning changes)."""
        now = time.time()
        dropped = full = False
        with self._lock:
            seen = self._sessions.get((tenant, session_id))
            if seen is None:
                key = (tenant, clean.column_text(SessionRow, "session_id", session_id))
                seen = self._sessions.get(key)
                if seen is None:
                    dropped = len(self._sessions) >= self.capacity
                    if not dropped:
                        seen = self._sessions[key] = SessionSeen(tenant, key[1], message_count, None, requests=0)
                        full = len(self._sessions) >= BATCH
            if seen is not None:
                seen.requests += 1
                seen.message_count = message_count
                seen.at = now
                if task is not None:
                    seen.task = task
                if model is not None and model != seen.model:
                    seen.model = clean.column_text(SessionRow, "model", model)
                if agent is not None and seen.agent is None:  # the first request this process saw of it
                    seen.agent = clean.column_text(SessionRow, "agent", agent)
                if title is not None and seen.title is None:
                    seen.title = clean.column_text(SessionRow, "title", title)
        if dropped:
            self._count_drop(1)
        elif full:
            self._poke()

    def _add(self, row: Pending) -> None:
        with self._lock:
            dropped = len(self._rows) >= self.capacity
            if dropped:
                self._unindex(self._rows.popleft())  # the oldest goes: the newest says most about now
            self._rows.append(row)
            if row.episode is not None:
                self._buffered_episodes.setdefault(row.episode, []).append(row.values)
            full = len(self._rows) >= BATCH
        if dropped:
            self._count_drop(1)
        if full:
            self._poke()

    def _unindex(self, row: Pending) -> None:
        """A row leaves the buffer (for the database, or dropped): later marks are rows of their own. (Under
        the lock.)"""
        buffered = self._buffered_episodes.get(row.episode) if row.episode is not None else None
        if buffered is not None:
            buffered[:] = [values for values in buffered if values is not row.values]
            if not buffered:
                del self._buffered_episodes[row.episode]

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the writer's loop has just closed
                pass

    def _count_drop(self, count: int) -> None:
        self.dropped += count
        if self._on_drop is not None:
            self._on_drop(count)
        now = time.monotonic()
        if now - self._drop_logged_at >= DROP_LOG_EVERY:  # one line per interval, not one per record
            self._drop_logged_at = now
            log.warning("detection log buffer full: dropping records, %d dropped in all", self.dropped)

    def failing_for(self) -> float:
        """Seconds since writes began failing (0 while they succeed)."""
        since = self._failing_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def pending(self) -> int:
        """Records not written yet, counting a batch on its way to the database."""
        return len(self._rows) + len(self._sessions) + self._in_flight + len(self._captures)

    # -- the writer's thread ----------------------------------------------------------------------------------

    def start(self) -> None:
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), name="loopwarden-log-writer",
                                        daemon=True)
        self._thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()  # the writer's own flushes and a caller's, one at a time
        self.engine = create_engine(self.database_url)
        self._loop = loop
        started.set()
        try:
            loop.run_until_complete(self._run())
        finally:
            loop.run_until_complete(self.engine.dispose())
            self._loop = None
            loop.close()

    async def close(self, timeout: float = 5.0) -> None:
        """Flush what is buffered (within `timeout`), then stop."""
        if self._thread is None:
            return
        self._closing = True
        self._poke()
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():  # the database did not take it in time: what is left is lost
            lost = self.pending
            if lost:
                self._count_drop(lost)
            self._abandon = True
            self._poke()
            await asyncio.to_thread(self._thread.join, 5.0)
        self._thread = None

    async def flush(self) -> None:
        """Write what is buffered now, from the caller's loop. On failure the records stay buffered."""
        loop = self._loop
        if loop is None:
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._flush(), loop))

    async def _run(self) -> None:
        backoff = 0.5
        while not self._abandon:
            if not self._closing:
                try:
                    await asyncio.wait_for(self._wake.wait(), FLUSH_EVERY)
                except asyncio.TimeoutError:
                    pass
            self._wake.clear()
            try:
                await self._flush()
            except Exception as exc:  # the database is down or refused the batch: keep, retry later
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    log.warning("detection log write failed, will retry: %s", str(exc).splitlines()[0])
                try:
                    await asyncio.wait_for(self._wake.wait(), backoff)  # a close wakes the retry early
                except asyncio.TimeoutError:
                    pass
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            if self._failing_since is not None:
                log.warning("detection log writes recovered")
                self._failing_since = None
            backoff = 0.5
            if self._closing and not self.pending:
                return

    async def _flush(self) -> None:
        """Write what is buffered, batch by batch (on the writer's loop), then the requests kept."""
        async with self._flushing:
            while await self._flush_batch():
                pass
            await self._flush_captures()

    async def _flush_captures(self) -> None:
        """The requests kept with flagged detections, compressed here (off the proxy's loop), in one
        transaction; on failure they wait for the next flush."""
        with self._lock:
            captures = list(self._captures)
            self._captures.clear()
            self._captured_bytes = 0
        if not captures:
            return
        try:
            async with self.engine.begin() as connection:
                await connection.execute(self._insert_captures, [
                    {**values, "body": zlib.compress(values["body"])} for values in captures])
        except BaseException:
            with self._lock:
                self._captures.extendleft(reversed(captures))
                self._captured_bytes += sum(len(values["body"]) for values in captures)
            raise

    async def _flush_batch(self) -> bool:
        """Write one batch; True when a full batch went out and more may be waiting. A batch the database
        refuses while it answers is split until the record it refuses is found and set aside (one bad record
        never holds back the log); while it does not answer, the batch waits in the buffer."""
        with self._lock:
            rows = [self._rows.popleft() for _ in range(min(BATCH, len(self._rows)))]
            for row in rows:
                self._unindex(row)
            keys = list(itertools.islice(self._sessions, BATCH))
            sessions = [(key, self._sessions.pop(key)) for key in keys]
            self._in_flight = len(rows) + len(sessions)
        if not rows and not sessions:
            return False
        try:
            try:
                await self._write(rows, sessions)
            except Exception as exc:
                if not _refused_data(exc) or not await ping(self.engine):
                    raise
                await self._write_apart(rows, [], exc)
                await self._write_apart([], sessions, exc)
        except BaseException:
            self._restore(rows, sessions)
            raise
        finally:
            self._in_flight = 0
        self.written += len(rows)
        log.debug("wrote %d log records and %d session sightings", len(rows), len(sessions))
        return len(rows) == BATCH or len(sessions) == BATCH

    async def _write(self, rows: list[Pending], sessions: list) -> None:
        """Write records in one transaction, with the overview's counts: each table's rows with its statement
        (`_statements`, in their order), the detections first inserted counted."""
        by_table: dict[Any, list[dict]] = {}
        for row in rows:
            by_table.setdefault(row.table, []).append(row.values)
        inserted = []
        async with self.engine.begin() as connection:
            for table, statement in self._statements:
                values = by_table.get(table)
                if values:
                    result = await connection.execute(statement, values)
                    if table is Detection:
                        inserted = result.all()
            await rollup.record(connection, self._dialect, inserted, by_table.get(RECOVERY, []))
            if sessions:
                await connection.execute(self._upsert_sessions, [seen.row() for _, seen in sessions])
        if inserted and self.on_inserted is not None:
            first = {row.episode_key: row.id for row in inserted}
            self.on_inserted([{**values, "id": first[values["episode_key"]]} for values in by_table[Detection]
                              if values["episode_key"] in first])

    async def _write_apart(self, rows: list[Pending], sessions: list, cause: Exception) -> None:
        """A refused batch, halved until each half is written or is one record, which is set aside."""
        if not rows and not sessions:
            return
        if len(rows) + len(sessions) == 1:
            try:
                await self._write(rows, sessions)
            except Exception as exc:
                if not _refused_data(exc) or not await ping(self.engine):
                    raise
                await self._set_aside(rows[0] if rows else Pending(SessionRow, sessions[0][1].row()), exc)
            return
        for part_rows, part_sessions in ((rows[:len(rows) // 2], sessions[:len(sessions) // 2]),
                                         (rows[len(rows) // 2:], sessions[len(sessions) // 2:])):
            try:
                await self._write(part_rows, part_sessions)
            except Exception as exc:
                if not _refused_data(exc) or not await ping(self.engine):
                    raise
                await self._write_apart(part_rows, part_sessions, cause)

    async def _set_aside(self, row: Pending, exc: Exception) -> None:
        """Keep a record the database refuses in `dead_letters`, count it, say why (once per record)."""
        kind = row.table if row.table is RECOVERY else row.table.__tablename__
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:2000]
        record = orjson.dumps(row.values, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        self.rejected += 1
        if self._on_reject is not None:
            self._on_reject()
        log.warning("the database refused a %s record; it is kept in dead_letters: %s", kind, reason)
        try:
            async with self.engine.begin() as connection:
                await connection.execute(insert(DeadLetter).values(
                    created_at=utcnow(), kind=kind, reason=reason.replace("\x00", ""),
                    record=record.replace("\\u0000", "")))
        except Exception as dead:  # not even that: it is lost, and counted as dropped
            log.warning("a refused %s record could not be kept either: %s", kind, str(dead).splitlines()[0])
            self._count_drop(1)

    def _restore(self, rows: list[Pending], sessions: list) -> None:
        """Put a batch that could not be written back in front, within the buffer's bound."""
        with self._lock:
            room = self.capacity - len(self._rows)
            dropped = max(0, len(rows) - max(room, 0))
            rows = rows[dropped:]  # the oldest go first
            self._rows.extendleft(reversed(rows))
            for key, seen in sessions:
                newer = self._sessions.get(key)
                if newer is not None:
                    newer.merge(seen)
                else:
                    self._sessions[key] = seen
        if dropped:
            self._count_drop(dropped)
