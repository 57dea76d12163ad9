"""The store as the proxy uses it: the writer, and the stored facts a verdict needs, kept in memory.

Verdicts need three facts that are not in the conversation: operator disables,
operator resets and judge answers. They are stored, and every replica keeps a
copy in memory refreshed by a poll, so the request path never waits on the
database. A change made through this replica applies to its next request at
once; through another replica, within POLL_EVERY seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from sys import getsizeof

from sqlalchemy import and_, delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.conversation import Chain, Message, from_record, to_record
from proxy.detect.judge_policy import JudgeCheck
from proxy.lru import LRU
from proxy.store import clean, rollup
from proxy.store.database import create_engine, ping
from proxy.store.models import CapturedRequest, Detection, JudgeCheckRow, ResponseRow, ResumeLink, SessionRow
from proxy.store.writer import LogWriter, utcnow

log = logging.getLogger("loopwarden.store")
POLL_EVERY = 1.0
PRUNE_EVERY = 600.0  # seconds between deletions past retention
CHECK_COUNTS_EVERY = 30.0  # seconds between checks that the overview's counts match the log (and at start)
COMPLETE_FOR = 5.0  # seconds a check that the counts are whole answers `complete` for the API
PRUNE_BATCH = 1000  # detections deleted per transaction: the writer never waits long behind a deletion
CACHED_RESPONSES = 20_000  # responses kept in memory for chained requests (each bounded, see below)
JUDGED_SESSIONS = 20_000  # sessions whose judge checks are kept in memory, least recently judged out
CHECKS_PER_SESSION = 64  # the latest checks of each (the judge checks a task every few turns)
# What the memories of kept responses and judge checks may hold, in bytes as their weights count them (at most)
RESPONSES_BYTES = 128 * 1024 * 1024
LATEST_BYTES = 16 * 1024 * 1024
CHECKS_BYTES = 32 * 1024 * 1024
KNOWN_TENANTS = 100_000
MAX_CHAIN = 5_000  # responses followed back from one request
MAX_STORED_TEXT = 16_000  # characters kept of each message's text and each call's arguments
WRITER_FAILING_READY = 30.0  # seconds of failing writes after which /readyz says the proxy is not ready
PERSIST_WAIT = 1.0  # seconds an answer the service keeps may wait for its record to be written


@dataclass(frozen=True)
class StoredResponse:
    previous_id: str | None
    conversation_id: str | None
    session_id: str
    messages: list[dict]


@dataclass(frozen=True)
class Controls:
    disabled: bool = False
    reset_at_message: int = 0


NO_CONTROLS = Controls()


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _response_weight(key: tuple[str, str], stored: StoredResponse) -> int:
    """What a kept response holds: its messages' texts and calls' arguments (a client's size), and the records."""
    weight = 512 + getsizeof(key[1])
    for record in stored.messages:
        weight += 400 + getsizeof(record.get("content") or "")
        for call in record.get("tool_calls") or ():
            weight += 400 + getsizeof(call["function"]["arguments"])
    return weight


def _checks_weight(key: tuple[str, str], checks: LRU) -> int:
    """What a session's remembered judge checks hold: each check's analysis (a model's words), and its record."""
    return 512 + getsizeof(key[1]) + sum(300 + getsizeof(check.analysis) for check in checks.values())


class Store:
    def __init__(self, database_url: str, buffer_size: int = 10_000, on_drop=None,
                 response_retention_days: float = 30.0, detection_retention_days: float | None = None,
                 on_reject=None, resume_link_ttl_hours: float = 24.0) -> None:
        self.database_url = database_url
        self.engine: AsyncEngine = create_engine(database_url)
        self.writer = LogWriter(database_url, buffer_size, on_drop=on_drop, on_reject=on_reject)
        self._controls: dict[tuple[str, str], Controls] = {}
        # (tenant, session) -> LRU of (task, turn) -> JudgeCheck
        self._checks = LRU(JUDGED_SESSIONS, CHECKS_BYTES, _checks_weight)
        self._controls_seen: datetime | None = None
        self._checks_seen = 0
        self._poller: asyncio.Task | None = None
        self.response_retention = timedelta(days=response_retention_days)
        self.detection_retention = timedelta(days=detection_retention_days) if detection_retention_days else None
        self.resume_link_ttl = timedelta(hours=resume_link_ttl_hours)
        # (tenant, response id) -> StoredResponse; (tenant, conversation) -> its latest response
        self._responses = LRU(CACHED_RESPONSES, RESPONSES_BYTES, _response_weight)
        self._latest = LRU(CACHED_RESPONSES, LATEST_BYTES,
                           lambda key, latest: 256 + getsizeof(key[1]) + getsizeof(latest))
        # Key hashes known to have sessions, the latest KNOWN_TENANTS (one entry per client key: a client
        # drawing keys at will must not grow it; one forgotten is looked up in the log again)
        self._tenants = LRU(KNOWN_TENANTS)
        self._maintainer: asyncio.Task | None = None
        self._rebuilding = False
        self._complete: tuple[float, bool] | None = None  # (when checked, whether the counts were whole)
        self._checking: asyncio.Task | None = None  # a check of the counts under way for the API

    async def start(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:  # the proxy serves without the database; the poll catches up
            log.warning("database not reachable at start, serving anyway: %s", str(exc).splitlines()[0])
        self.writer.start()
        loop = asyncio.get_running_loop()
        self._poller = loop.create_task(self._poll(), name="loopwarden-controls-poll")
        self._maintainer = loop.create_task(self._maintain(), name="loopwarden-log-maintenance")

    async def close(self, timeout: float = 5.0) -> None:
        for task in (self._poller, self._maintainer, self._checking):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        await self.writer.close(timeout)
        await self.engine.dispose()

    async def ready(self) -> bool:
        """The database answers, and the log writer is not stuck failing."""
        return self.writer.failing_for() < WRITER_FAILING_READY and await ping(self.engine)

    # -- the request path: memory only ------------------------------------------------------------------------

    def controls(self, tenant: str, session_id: str) -> Controls:
        return self._controls.get((tenant, session_id), NO_CONTROLS)

    def judge_checks(self, tenant: str, session_id: str, task: str) -> list[JudgeCheck]:
        checks = self._checks.get((tenant, session_id))
        if not checks:
            return []
        return sorted((c for c in checks.values() if c.task == task), key=lambda c: c.turn)

    def record_judge_check(self, tenant: str, session_id: str, check: JudgeCheck, model: str | None,
                           tokens: int) -> None:
        self._remember_check(tenant, session_id, check)
        self.writer.add_judge_check({
            "created_at": utcnow(), "tenant": tenant, "session_id": session_id, "task": check.task,
            "turn": check.turn, "confidence": check.confidence, "confirm_confidence": check.confirm_confidence,
            "analysis": check.analysis, "model": model, "tokens": tokens,
        })

    def _remember_check(self, tenant: str, session_id: str, check: JudgeCheck) -> None:
        checks = self._checks.get((tenant, session_id)) or LRU(CHECKS_PER_SESSION)
        checks.put((check.task, check.turn), check)
        self._checks.put((tenant, session_id), checks)

    def session_seen(self, tenant: str, session_id: str, message_count: int, model: str | None,
                     agent: str | None = None, title: str | None = None, task: str | None = None) -> None:
        self._tenants.put(tenant, True)
        self.writer.session_seen(tenant, session_id, message_count, model, agent, title, task)

    async def tenant_known(self, tenant: str) -> bool:
        """Whether a key has sessions (on this replica, or in the log)."""
        if tenant in self._tenants:
            return True
        async with self.engine.connect() as connection:
            found = (await connection.execute(
                select(SessionRow.session_id).where(SessionRow.tenant == tenant).limit(1))).first()
        if found is not None:
            self._tenants.put(tenant, True)
        return found is not None

    def caches(self) -> dict:
        """The memories bounded in bytes (for /metrics)."""
        return {"responses": self._responses, "latest_responses": self._latest, "judge_checks": self._checks}

    # -- Responses conversations the service keeps --------------------------------------------------------

    def record_response(self, tenant: str, response_id: str | None, previous_id: str | None,
                        conversation_id: str | None, session_id: str, messages: list[Message]) -> None:
        """A response the service keeps: what its request added and its answer, for requests that continue it.
        Long texts keep their start (their verdicts are the same on every replica)."""
        if not response_id:
            return
        stored = StoredResponse(previous_id, conversation_id, session_id,
                                [to_record(m, MAX_STORED_TEXT) for m in messages])
        self._responses.put((tenant, response_id), stored)
        if conversation_id:
            self._latest.put((tenant, conversation_id), response_id)
        self.writer.add_response({"tenant": tenant, "response_id": response_id[:128], "previous_id": previous_id,
                                  "conversation_id": conversation_id, "session_id": session_id,
                                  "created_at": utcnow(), "messages": stored.messages})

    async def persist(self) -> None:
        """Write what is buffered now: a response a chained request may continue from is then readable by every
        replica before its client has the last byte. A database slower than PERSIST_WAIT is not waited for
        further (the records stay buffered and are written as usual)."""
        try:
            await asyncio.wait_for(asyncio.shield(self.writer.flush()), PERSIST_WAIT)
        except Exception as exc:  # a slow or failing database never fails the request
            log.warning("a kept response was not written before its answer ended: %s",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    async def chain(self, tenant: str, previous_id: str | None, conversation_id: str | None) -> Chain:
        """The conversation a request continues, oldest first: from memory, else from the database (another
        replica's responses, or this one's before a restart). What cannot be found is left out."""
        # Looked up as they were stored: cut and cleaned to their columns. The conversation keeps its name
        # as sent (cut to a session id's length): it names the session.
        given = None if conversation_id is None else conversation_id[:256]
        previous_id = clean.column_text(ResponseRow, "previous_id", previous_id)
        conversation_id = clean.column_text(ResponseRow, "conversation_id", conversation_id)
        try:
            start = previous_id
            if start is None and conversation_id:
                start = self._latest.get((tenant, conversation_id)) or await self._latest_in(tenant, conversation_id)
            found: list[StoredResponse] = []
            current = start
            seen: set[str] = set()
            while current is not None and current not in seen and len(found) < MAX_CHAIN:
                seen.add(current)  # a chain that comes back to itself (an id reused) ends there
                stored = self._responses.get((tenant, current))
                if stored is None:
                    loaded = await self._load_chain(tenant, current)
                    found += loaded
                    break
                found.append(stored)
                current = stored.previous_id
        except Exception as exc:  # the database is down: analyse what this replica has
            log.warning("could not read the conversation before response %s: %s", previous_id or conversation_id,
                        str(exc).splitlines()[0])
            return Chain([], previous_id, None, given)
        messages = [from_record(message) for stored in reversed(found) for message in stored.messages]
        session_id = found[-1].session_id if found else None
        return Chain(messages, start, session_id, given)

    async def _latest_in(self, tenant: str, conversation_id: str) -> str | None:
        async with self.engine.connect() as connection:
            return (await connection.execute(
                select(ResponseRow.response_id).where(ResponseRow.tenant == tenant,
                                                      ResponseRow.conversation_id == conversation_id)
                .order_by(ResponseRow.created_at.desc()).limit(1))).scalar()

    async def _load_chain(self, tenant: str, start: str) -> list[StoredResponse]:
        """The chain from `start` back to its root, in one recursive query; newest first."""
        rows = ResponseRow.__table__
        chain = select(rows).where(rows.c.tenant == tenant, rows.c.response_id == start).cte("chain", recursive=True)
        chain = chain.union_all(select(rows).join(chain, and_(rows.c.tenant == chain.c.tenant,
                                                              rows.c.response_id == chain.c.previous_id)))
        async with self.engine.connect() as connection:
            found = {row.response_id: row for row in (await connection.execute(select(chain).limit(MAX_CHAIN))).all()}
        result = []
        current: str | None = start
        while current in found and len(result) < MAX_CHAIN:
            row = found.pop(current)
            stored = StoredResponse(row.previous_id, row.conversation_id, row.session_id, row.messages)
            self._responses.put((tenant, current), stored)
            result.append(stored)
            current = row.previous_id
        return result

    async def prune_detections(self, batch: int = PRUNE_BATCH) -> int:
        """Delete detections past DETECTION_RETENTION_DAYS, oldest first, `batch` rows a transaction, each
        taking its rows out of the overview's counts. The cutoff is a bucket's start: no bucket is left
        counting rows that are gone."""
        if self.detection_retention is None:
            return 0
        cutoff = rollup.bucket_start(rollup.bucket_of(utcnow() - self.detection_retention))
        dialect = self.engine.dialect.name
        deleted = 0
        while True:
            async with self.engine.begin() as connection:
                rows = (await connection.execute(select(Detection.id, *rollup.COUNTED)
                                                 .where(Detection.created_at < cutoff)
                                                 .order_by(Detection.id).limit(batch))).all()
                if rows:
                    await connection.execute(delete(Detection).where(Detection.id.in_([row.id for row in rows])))
                    await rollup.forget(connection, dialect, rows)
                else:
                    await rollup.forget_before(connection, cutoff)
            deleted += len(rows)
            if not rows:
                return deleted
            await asyncio.sleep(0.05)  # the writer and the API get the database between batches

    async def check_counts(self) -> bool:
        """Rebuild the overview's counts when they do not match the detections. True when rebuilt. While it
        rebuilds, what is reported from the counts says it is not complete."""
        rows, counted = await self._look_at_counts()
        if rows == counted:
            return False
        log.warning("overview counts hold %d of %d detections: rebuilding them from the log", counted, rows)
        self._rebuilding = True
        try:
            async with self.engine.begin() as connection:
                return await rollup.rebuild(connection, self.engine.dialect.name)
        finally:
            self._rebuilding = False
            self._complete = None

    async def counts_complete(self) -> bool:
        """Whether the overview's counts hold every detection (False while this replica rebuilds them, or while
        they did not match the log when last looked at). Looking counts the log's rows, which takes a while on a
        large one: it is done at most every COMPLETE_FOR seconds, in the background, and meanwhile the last
        answer stands; only the very first look is waited for."""
        if self._rebuilding:
            return False
        if self._complete is None:
            await self._look_at_counts()
        elif asyncio.get_running_loop().time() - self._complete[0] >= COMPLETE_FOR and self._checking is None:
            self._checking = asyncio.get_running_loop().create_task(self._look_in_background(),
                                                                  name="loopwarden-counts-check")
        return self._complete is not None and self._complete[1] and not self._rebuilding

    async def _look_at_counts(self) -> tuple[int, int]:
        """(detections in the log, detections counted), remembered as whether the counts are whole."""
        async with self.engine.connect() as connection:
            rows, counted = await rollup.consistent(connection)
        self._complete = (asyncio.get_running_loop().time(), rows == counted)
        return rows, counted

    async def _look_in_background(self) -> None:
        try:
            await self._look_at_counts()
        except Exception as exc:  # the database away: the last answer stands, the next call tries again
            log.debug("overview counts check failed: %s", exc)
        finally:
            self._checking = None

    async def prune_responses(self) -> int:
        """Forget responses past their retention, and the requests kept with flagged detections with them."""
        cutoff = utcnow() - self.response_retention
        async with self.engine.begin() as connection:
            result = await connection.execute(delete(ResponseRow).where(ResponseRow.created_at < cutoff))
            captured = await connection.execute(delete(CapturedRequest).where(CapturedRequest.created_at < cutoff))
        return (result.rowcount or 0) + (captured.rowcount or 0)

    # -- operator controls: awaited, off the request path -------------------------------------------------------

    async def set_controls(self, session_id: str, tenant: str | None, *, disabled: bool | None = None,
                           reset: bool = False, known_counts: dict | None = None) -> list[dict]:
        """Disable/enable or reset a session (every tenant's, when tenant is None). Returns what changed."""
        await self.writer.flush()  # sessions this replica saw but has not written yet
        session_id = clean.column_text(SessionRow, "session_id", session_id)
        now = utcnow()
        conditions = [SessionRow.session_id == session_id]
        if tenant is not None:
            conditions.append(SessionRow.tenant == tenant)
        async with self.engine.begin() as connection:
            rows = (await connection.execute(select(SessionRow).where(*conditions))).all()
            targets = {(row.tenant, row.session_id): row for row in rows}
            changed = []
            for key, row in targets.items():
                values: dict = {"controls_changed_at": now}
                if disabled is not None:
                    values["disabled"] = disabled
                if reset:
                    # Everything the session has sent so far is forgiven: a fresh task from here.
                    count = max(row.message_count, (known_counts or {}).get(key, 0))
                    values["reset_at_message"] = count
                    values["reset_at"] = now
                await connection.execute(update(SessionRow).where(SessionRow.tenant == key[0],
                                                                  SessionRow.session_id == key[1]).values(**values))
                merged = Controls(values.get("disabled", row.disabled),
                                  values.get("reset_at_message", row.reset_at_message))
                self._controls[key] = merged
                changed.append({"tenant": key[0], "session_id": key[1], "disabled": merged.disabled,
                                "reset_at_message": merged.reset_at_message})
        return changed

    # -- resume links: a person lets a stopped session go on -------------------------------------------------------

    def resume_link_issued(self, token: str, tenant: str, session_id: str, task: str) -> None:
        """A stop named a resume link: its hash goes to the log with the stop's own record."""
        self.writer.add_resume_link({"token_hash": token_hash(token), "tenant": tenant, "session_id": session_id,
                                     "task": task, "created_at": utcnow(), "used_at": None})

    async def resume_link(self, token: str) -> dict | None:
        """What a link would resume: its session, task, whether it was used and whether it has expired; None for
        a token never issued. (A link this replica named moments ago may still be in the log's buffer: written
        first.)"""
        await self.writer.flush()
        async with self.engine.connect() as connection:
            row = (await connection.execute(select(ResumeLink).where(
                ResumeLink.token_hash == token_hash(token)))).first()
        if row is None:
            return None
        return {"tenant": row.tenant, "session_id": row.session_id, "task": row.task,
                "created_at": row.created_at, "used_at": row.used_at,
                "expired": row.created_at < utcnow() - self.resume_link_ttl}

    async def resume_confirmation(self, token: str) -> str:
        """A new one-time value for the link's page to send back: drawn here and kept only as a hash, so it
        cannot be derived from the token, and each showing of the page replaces the one before."""
        value = secrets.token_urlsafe(18)
        async with self.engine.begin() as connection:
            await connection.execute(update(ResumeLink).where(ResumeLink.token_hash == token_hash(token))
                                     .values(confirm_hash=token_hash(value)))
        return value

    async def use_resume_link(self, token: str, confirmation: str,
                              known_counts: dict | None = None) -> dict | None:
        """Spend the link and reset its session, as an operator's reset does, when `confirmation` is the value
        its page showed last; None when it was never issued, is spent or expired, or the value is not that one
        (a second use, or another replica's at the same moment, changes nothing)."""
        link = await self.resume_link(token)
        if link is None or link["used_at"] is not None or link["expired"]:
            return None
        async with self.engine.begin() as connection:
            spent = await connection.execute(update(ResumeLink).where(
                ResumeLink.token_hash == token_hash(token), ResumeLink.used_at.is_(None),
                ResumeLink.confirm_hash == token_hash(confirmation)).values(used_at=utcnow(), confirm_hash=None))
        if spent.rowcount != 1:
            return None
        await self.set_controls(link["session_id"], link["tenant"], reset=True, known_counts=known_counts)
        log.info("session %s resumed by its stop's link (task %s)", link["session_id"], link["task"])
        return link

    async def prune_resume_links(self) -> int:
        """Forget links past their use: unused ones once expired; used ones (a resume on a session's timeline)
        with the detections, past DETECTION_RETENTION_DAYS."""
        now = utcnow()
        spent = ResumeLink.used_at.is_(None)
        if self.detection_retention is not None:
            spent = spent | (ResumeLink.used_at < now - self.detection_retention)
        async with self.engine.begin() as connection:
            result = await connection.execute(delete(ResumeLink).where(
                ResumeLink.created_at < now - self.resume_link_ttl, spent))
        return result.rowcount or 0

    # -- keeping the memory fresh -----------------------------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_EVERY)
            try:
                await self.refresh()
            except Exception as exc:
                log.debug("controls poll failed: %s", exc)

    async def _maintain(self) -> None:
        """The overview's counts checked at start and every CHECK_COUNTS_EVERY seconds (rebuilt when they do not
        match the log); deletions past retention every PRUNE_EVERY. Apart from the controls' poll, which a
        rebuild of a large log (tens of seconds) must not hold up."""
        loop = asyncio.get_running_loop()
        pruned_at = float("-inf")
        while True:
            try:
                await self.check_counts()
                if loop.time() - pruned_at >= PRUNE_EVERY:
                    pruned_at = loop.time()
                    await self.prune_responses()
                    await self.prune_detections()
                    await self.prune_resume_links()
            except Exception as exc:
                log.debug("log maintenance failed: %s", exc)
            await asyncio.sleep(CHECK_COUNTS_EVERY)

    async def refresh(self) -> None:
        async with self.engine.connect() as connection:
            statement = select(SessionRow.tenant, SessionRow.session_id, SessionRow.disabled,
                               SessionRow.reset_at_message, SessionRow.controls_changed_at)
            if self._controls_seen is None:
                statement = statement.where(SessionRow.controls_changed_at.is_not(None))
            else:
                statement = statement.where(SessionRow.controls_changed_at >= self._controls_seen)
            for row in (await connection.execute(statement)).all():
                self._controls[(row.tenant, row.session_id)] = Controls(row.disabled, row.reset_at_message)
                if self._controls_seen is None or row.controls_changed_at > self._controls_seen:
                    self._controls_seen = row.controls_changed_at
            statement = select(JudgeCheckRow).where(JudgeCheckRow.id > self._checks_seen)
            if not self._checks_seen:  # at start, the newest only: one per session memory keeps
                statement = statement.order_by(JudgeCheckRow.id.desc()).limit(JUDGED_SESSIONS)
            checks = sorted((await connection.execute(statement)).all(), key=lambda row: row.id)
            for row in checks:
                self._remember_check(row.tenant, row.session_id, JudgeCheck(
                    row.task, row.turn, row.confidence, row.confirm_confidence, row.analysis or ""))
                self._checks_seen = row.id

