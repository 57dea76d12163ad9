"""The queries the CLI and the HTTP API share. Times in and out are naive UTC."""

from __future__ import annotations

import re
import secrets
import zlib
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import and_, case, func, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.detect.actions import Action
from proxy.detect.engine import TYPES
from proxy.detect.evidence import Chanting, from_logged, strength_of
from proxy.detect.texts import Told, cut_notice, stop_text, warning_text
from proxy.store import clean, rollup
from proxy.store.models import (CapturedRequest, CountBucket, Detection, JudgeCheckRow, OutcomeBucket, ResumeLink, SessionCount,
                                SessionRow, TaskOutcome)

# The actions every count lists (SPEC §6), as plain strings: keys of JSON objects. A detection found too late to act
# on (`late`) is counted only where there is one, so the counts a client reads keep the contract's keys.
ACTIONS = (Action.WARNED.value, Action.STOPPED.value, Action.CUT.value)


def _by_action(counted: dict) -> dict[str, int]:
    return {**{a: counted.get(a, 0) for a in ACTIONS}, **{a: n for a, n in counted.items() if a not in ACTIONS and n}}
_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
MAX_LIMIT = 1000


class QueryError(ValueError):
    """A filter the user gave cannot be used; the message says which and why."""


EARLIEST = datetime(1970, 1, 1)  # no detection is older; a `since` before it is a mistake
MAX_ID = 2**63 - 1  # a cursor is a row id: a BIGINT


def parse_since(value: str | None, now: datetime | None = None) -> datetime | None:
    """`1h`, `30m`, `7d` back from now, or an ISO time (local time when it has no zone) -> naive UTC."""
    if value is None or value == "":
        return None
    now = now or datetime.now(timezone.utc)
    match = _RELATIVE.match(value.strip())
    expected = f"since: expected a duration like 1h, 30m, 7d or a time like 2026-11-01T00:00, got {value[:60]!r}"
    try:
        if match:
            moment = now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
        else:
            moment = datetime.fromisoformat(value.strip())
            if moment.tzinfo is None:
                moment = moment.astimezone()  # the user's local time
        moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
    except (ValueError, OverflowError):  # not a time, or a duration or a time past what a date can hold
        raise QueryError(expected) from None
    if moment < EARLIEST:
        raise QueryError(f"since: {value[:60]!r} is before 1970-01-01, older than any detection")
    return moment


def parse_cursor(cursor: str | None) -> int | None:
    """A cursor as the API gave it (a row id), or a QueryError."""
    if not cursor:
        return None
    if not cursor.isdigit() or len(cursor) > 19 or int(cursor) > MAX_ID:
        raise QueryError(f"cursor is not one this API gave: {cursor[:40]!r}")
    return int(cursor)


def check_choice(name: str, value: str | None, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise QueryError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def detection_dict(row: Any) -> dict[str, Any]:
    """A detections row (Core result row) as the API and the CLI show it."""
    return {
        "id": row.id, "created_at": iso(row.created_at), "session_id": row.session_id, "tenant": row.tenant,
        "task": row.task, "model": row.model, "type": row.type, "action": row.action,
        "episode": row.episode, "episode_limit": row.episode_limit, "turn": row.turn, "detail": row.detail,
        "request_id": row.request_id, "tokens_saved_estimate": row.tokens_saved_estimate,
        "recovered": row.recovered, "enforced": row.enforced, "strength": strength_of(row.type, row.detail),
        "mark": row.mark, "marked_at": iso(row.marked_at), "mark_note": row.mark_note,
        "episode_key": row.episode_key,
    }


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.replace(tzinfo=timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class DetectionFilter:
    tenant: str | None = None  # None: every tenant (the admin)
    session: str | None = None
    type: str | None = None
    action: str | None = None
    since: datetime | None = None
    enforced: bool | None = None  # None: both; False: observe mode's would-be episodes
    mark: str | None = None  # a person's word: loop, not_a_loop, or none (not marked)
    episode_key: str | None = None  # the one detection a trace's event names

    def conditions(self) -> list:
        check_choice("type", self.type, TYPES)
        check_choice("action", self.action, tuple(action.value for action in Action))
        check_choice("mark", self.mark, (*MARKS, "none"))
        conditions = []
        if self.tenant is not None:
            conditions.append(Detection.tenant == self.tenant)
        if self.session is not None:  # as stored: no NUL (PostgreSQL refuses one even in a query)
            conditions.append(Detection.session_id == clean.column_text(Detection, "session_id", self.session))
        if self.type is not None:
            conditions.append(Detection.type == self.type)
        if self.action is not None:
            conditions.append(Detection.action == self.action)
        if self.since is not None:
            conditions.append(Detection.created_at >= self.since)
        if self.enforced is not None:
            conditions.append(Detection.enforced.is_(self.enforced))
        if self.mark is not None:
            conditions.append(Detection.mark.is_(None) if self.mark == "none" else Detection.mark == self.mark)
        if self.episode_key is not None:
            conditions.append(Detection.episode_key == self.episode_key[:64])
        return conditions


async def list_detections(engine: AsyncEngine, where: DetectionFilter, limit: int = 50,
                          cursor: str | None = None) -> tuple[list[dict], str | None]:
    """Newest first; the cursor continues after the last row returned."""
    if limit < 1 or limit > MAX_LIMIT:
        raise QueryError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    conditions = where.conditions()
    after = parse_cursor(cursor)
    if after is not None:
        conditions.append(Detection.id < after)
    statement = select(Detection).where(and_(True, *conditions)).order_by(Detection.id.desc()).limit(limit + 1)
    async with engine.connect() as connection:
        rows = (await connection.execute(statement)).all()
    items = [detection_dict(row) for row in rows[:limit]]
    next_cursor = str(items[-1]["id"]) if len(rows) > limit else None
    return items, next_cursor


async def _marked(connection, since: datetime | None, tenant: str | None) -> dict[str, dict]:
    """The period's marked detections counted by type and by agent (the session's, `unknown` when not read):
    few rows, found by the index on marks."""
    conditions = [Detection.mark.is_not(None)]
    if since is not None:
        conditions.append(Detection.created_at >= since)
    if tenant is not None:
        conditions.append(Detection.tenant == tenant)
    rows = (await connection.execute(
        select(Detection.type, Detection.mark, SessionRow.agent, func.count())
        .select_from(Detection).outerjoin(SessionRow, and_(SessionRow.tenant == Detection.tenant,
                                                           SessionRow.session_id == Detection.session_id))
        .where(*conditions).group_by(Detection.type, Detection.mark, SessionRow.agent))).all()
    counted: dict[str, dict] = {"type": {}, "agent": {}}
    for kind, mark, agent, count in rows:
        for key, name in (("type", kind), ("agent", agent or "unknown")):
            counted[key].setdefault(name, {"loop": 0, "not_a_loop": 0})[mark] += count
    return counted


async def counts_complete(engine: AsyncEngine) -> bool:
    """Whether the counts behind stats and the timeline hold every detection (False while they are rebuilt)."""
    async with engine.connect() as connection:
        rows, counted = await rollup.consistent(connection)
    return rows == counted


def _sources(since: datetime | None, coarsest: int = rollup.HOUR) -> tuple[list[list], tuple | None]:
    """Where a period's detections are counted: conditions on count_buckets, from the coarsest span allowed
    down (the period's whole hours, then the five-minute buckets before its first hour, then the minutes
    before those), and the part of a minute it starts in, [since, end), read as rows."""
    spans = [span for span in reversed(rollup.SPANS) if span <= coarsest]
    if since is None:
        return [[CountBucket.span == spans[0]]], None
    sources, end = [], None
    for span in spans:
        begin = rollup.first_bucket_from(since, span)
        source = [CountBucket.span == span, CountBucket.bucket >= begin]
        sources.append(source if end is None else [*source, CountBucket.bucket < end])
        end = begin
    head_end = rollup.bucket_start(end)
    return sources, ((since, head_end) if since < head_end else None)


async def stats(engine: AsyncEngine, since: datetime | None = None, tenant: str | None = None) -> dict[str, Any]:
    """What enforcement did; and, apart, what observe mode saw it would have done. From the counts kept per
    bucket (proxy/store/rollup.py), and for a period that starts inside a bucket, from the rows before the
    first whole one. A task or a session counts in the period of its last detection."""
    async with engine.connect() as connection:
        counts = await _detection_counts(connection, since, tenant)
        outcomes = await _task_outcomes(connection, since, tenant)
        judge_condition = [JudgeCheckRow.created_at >= since] if since else []
        if tenant is not None:
            judge_condition.append(JudgeCheckRow.tenant == tenant)
        judge = (await connection.execute(
            select(func.count(), func.coalesce(func.sum(JudgeCheckRow.tokens), 0)).where(
                and_(True, *judge_condition)))).one()
        marked = await _marked(connection, since, tenant)
    enforced, observed = _tallied(counts, outcomes)
    warned_tasks, recovered, _, sessions = enforced["tasks"]
    return {
        "since": iso(since),
        "detections": sum(enforced["by_type"].values()),
        "by_type": {t: enforced["by_type"].get(t, 0) for t in TYPES},
        "by_action": _by_action(enforced["by_action"]),
        "by_model": dict(sorted(((m, n) for m, n in enforced["by_model"].items() if n), key=lambda item: -item[1])),
        "sessions_affected": sessions,
        "average_turns_before_detection": (round(enforced["first_turns"] / enforced["first_episodes"], 1)
                                           if enforced["first_episodes"] else None),
        "warned_tasks": warned_tasks,
        # A recovery: the model was given the task's last warning and moved on, and the task never reached the stop.
        "recovered_tasks": recovered,
        "recovery_rate": round(recovered / warned_tasks, 3) if warned_tasks else None,
        "tokens_saved_estimate": enforced["saved"],
        "judge_checks": judge[0],
        "judge_tokens": int(judge[1] or 0),
        # A person's word on the period's detections, per type and per agent: how often they were not loops.
        "marked": {t: marked["type"].get(t, {"loop": 0, "not_a_loop": 0}) for t in TYPES},
        "marked_by_agent": marked["agent"],
        "observed": {
            "detections": sum(observed["by_type"].values()),
            "by_type": {t: observed["by_type"].get(t, 0) for t in TYPES},
            "by_action": _by_action(observed["by_action"]),
            "would_have_stopped_tasks": observed["tasks"][2],
        },
    }


def _of_tenant(column, tenant: str | None) -> list:
    return [column == tenant] if tenant is not None else []


async def _detection_counts(connection, since: datetime | None, tenant: str | None) -> list:
    """Detections by mode, type, action and model, with what they saved and their first turns: from the
    buckets, and the rows before the first whole one."""
    sources, head = _sources(since)
    counts = []
    for conditions in sources:
        counts += (await connection.execute(
            select(CountBucket.enforced, CountBucket.type, CountBucket.action, CountBucket.model,
                   *rollup.bucket_sums())
            .where(*conditions, *_of_tenant(CountBucket.tenant, tenant))
            .group_by(CountBucket.enforced, CountBucket.type, CountBucket.action, CountBucket.model))).all()
    if head is not None:
        counts += (await connection.execute(
            select(Detection.enforced, Detection.type, Detection.action, rollup.MODEL, *rollup.detection_sums())
            .where(Detection.created_at >= head[0], Detection.created_at < head[1],
                   *_of_tenant(Detection.tenant, tenant))
            .group_by(Detection.enforced, Detection.type, Detection.action, rollup.MODEL))).all()
    return counts


async def _task_outcomes(connection, since: datetime | None, tenant: str | None) -> list:
    """Warned, recovered and stopped tasks and the sessions affected, by mode: from the outcome buckets, and
    for the tasks and sessions whose last detection is before the first whole one, from their rows."""
    outcome_buckets = _of_tenant(OutcomeBucket.tenant, tenant)
    outcome_head = None
    if since is not None:
        begin = rollup.first_bucket_from(since, rollup.BUCKET_SECONDS)
        outcome_buckets.append(OutcomeBucket.bucket >= begin)
        if since < rollup.bucket_start(begin):
            outcome_head = (since, rollup.bucket_start(begin))
    outcomes = (await connection.execute(
        select(OutcomeBucket.enforced, func.sum(OutcomeBucket.warned_tasks),
               func.sum(OutcomeBucket.recovered_tasks), func.sum(OutcomeBucket.stopped_tasks),
               func.sum(OutcomeBucket.sessions))
        .where(*outcome_buckets).group_by(OutcomeBucket.enforced))).all()
    if outcome_head is not None:
        start, end = outcome_head
        outcomes += (await connection.execute(
            select(TaskOutcome.enforced, *rollup.task_outcomes(), literal_column("0"))
            .where(TaskOutcome.last_at >= start, TaskOutcome.last_at < end, *_of_tenant(TaskOutcome.tenant, tenant))
            .group_by(TaskOutcome.enforced))).all()
        outcomes.append((True, 0, 0, 0, (await connection.execute(
            select(func.count()).select_from(SessionCount).where(
                SessionCount.last_enforced_at >= start, SessionCount.last_enforced_at < end,
                *_of_tenant(SessionCount.tenant, tenant)))).scalar()))
    return outcomes


def _tallied(counts: list, outcomes: list) -> tuple[dict, dict]:
    """The counts and outcomes summed per mode: (enforced, observed)."""
    modes = {mode: {"by_type": defaultdict(int), "by_action": defaultdict(int), "by_model": defaultdict(int),
                    "saved": 0, "first_turns": 0, "first_episodes": 0, "tasks": [0, 0, 0, 0]} for mode in (True, False)}
    for is_enforced, kind, action, model_name, count, saved, first_turns, first_episodes in counts:
        mode = modes[bool(is_enforced)]
        mode["by_type"][kind] += int(count or 0)
        mode["by_action"][action] += int(count or 0)
        mode["by_model"][model_name or "unknown"] += int(count or 0)
        mode["saved"] += int(saved or 0)
        mode["first_turns"] += int(first_turns or 0)
        mode["first_episodes"] += int(first_episodes or 0)
    for is_enforced, *tallies in outcomes:
        totals = modes[bool(is_enforced)]["tasks"]
        for index, value in enumerate(tallies):
            totals[index] += int(value or 0)
    return modes[True], modes[False]


async def timeline(engine: AsyncEngine, where: DetectionFilter, buckets: int = 48,
                   now: datetime | None = None) -> dict[str, Any]:
    """Detections over time, by type: `buckets` equal spans from the filter's `since` (or the first match).
    Spans of a minute or more are read from the counts kept per bucket, of the widest span that fits (each
    bucket counted in the span it starts in; the part of a minute a period starts in, from its rows);
    shorter spans, and one session's, from the rows."""
    if buckets < 1 or buckets > 500:
        raise QueryError(f"buckets must be between 1 and 500, got {buckets}")
    conditions = where.conditions()
    from_counts = where.session is None  # the counts have no session
    kept = [getattr(CountBucket, name) == value for name, value in (
        ("tenant", where.tenant), ("type", where.type), ("action", where.action), ("enforced", where.enforced))
        if value is not None]
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    series = {kind: [0] * buckets for kind in TYPES}
    async with engine.connect() as connection:
        start = where.since
        if start is None and from_counts:
            first = (await connection.execute(select(func.min(CountBucket.bucket)).where(
                CountBucket.span == rollup.MINUTE, *kept))).scalar()
            start = rollup.bucket_start(first) if first is not None else None
        elif start is None:
            start = (await connection.execute(select(func.min(Detection.created_at)).where(*conditions))).scalar()
        start = start or now - timedelta(hours=1)
        width = max(1, -(-int((now - start).total_seconds() + 1) // buckets))  # seconds per bucket, rounded up
        offset = int((start - rollup.EPOCH).total_seconds())
        if from_counts and width >= rollup.MINUTE:
            sources, head = _sources(start, max(span for span in rollup.SPANS if span <= width))
            rows = []
            for source in sources:
                rows += [((bucket - offset) // width, kind, count) for bucket, kind, count in (
                    await connection.execute(
                        select(CountBucket.bucket, CountBucket.type, func.sum(CountBucket.detections))
                        .where(*source, *kept).group_by(CountBucket.bucket, CountBucket.type))).all()]
            if head is not None:  # the part of a minute the period starts in: the first span
                rows += [(0, kind, count) for kind, count in (await connection.execute(
                    select(Detection.type, func.count()).where(*conditions, Detection.created_at < head[1])
                    .group_by(Detection.type))).all()]
        else:
            bucket = (rollup.epoch_sql(engine.dialect.name, Detection.created_at) - offset) // width
            rows = (await connection.execute(
                select(bucket.label("bucket"), Detection.type, func.count()).where(*conditions)
                .group_by(bucket, Detection.type))).all()
    for index, kind, count in rows:
        index = min(max(int(index), 0), buckets - 1)
        series[kind][index] += int(count)
    return {"start": iso(start), "bucket_seconds": width, "buckets": buckets, "series": series}


# Where a session's current task stands: 2 stopped, 1 warned (or a stream cut), none: neither since the last reset.
_STANDING = (
    select(func.max(case((Detection.action == Action.STOPPED.value, 2), else_=1)))
    .where(Detection.tenant == SessionRow.tenant, Detection.session_id == SessionRow.session_id,
           Detection.task == SessionRow.task, Detection.enforced.is_(True),
           Detection.created_at >= func.coalesce(SessionRow.reset_at, EARLIEST))
    .correlate(SessionRow).scalar_subquery().label("standing")
)


def status(disabled: bool, standing: int | None) -> str:
    """`off` (detection disabled), `stopped` (its current task is stopped), `warned` (warned, not stopped), or
    `ok`; what an operator's reset or a resume forgave does not count."""
    return "off" if disabled else "stopped" if standing == 2 else "warned" if standing == 1 else "ok"


def session_dict(row: Any, detections: int = 0) -> dict[str, Any]:
    return {
        "session_id": row.session_id, "tenant": row.tenant, "status": status(row.disabled, row.standing),
        "first_seen": iso(row.first_seen), "last_seen": iso(row.last_seen), "requests": row.requests,
        "messages": row.message_count, "model": row.model, "agent": row.agent, "title": row.title,
        "disabled": row.disabled, "reset_at_message": row.reset_at_message, "detections": detections,
    }


async def list_sessions(engine: AsyncEngine, since: datetime | None = None, tenant: str | None = None,
                        limit: int = 50) -> list[dict]:
    if limit < 1 or limit > MAX_LIMIT:
        raise QueryError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    conditions = []
    if since is not None:
        conditions.append(SessionRow.last_seen >= since)
    if tenant is not None:
        conditions.append(SessionRow.tenant == tenant)
    statement = (  # each session's detections, as counted when they were written
        select(*SessionRow.__table__.c, _STANDING, func.coalesce(SessionCount.detections, 0).label("detections"))
        .outerjoin(SessionCount, and_(SessionCount.tenant == SessionRow.tenant,
                                      SessionCount.session_id == SessionRow.session_id))
        .where(and_(True, *conditions)).order_by(SessionRow.last_seen.desc()).limit(limit)
    )
    async with engine.connect() as connection:
        rows = (await connection.execute(statement)).all()
    return [session_dict(row, row.detections) for row in rows]


def shown(row: Any) -> str:
    """What loopwarden said for this episode: the warning the model was given, the stop's message, or the
    cut's notice (rebuilt from the logged detail by the same functions that wrote them)."""
    evidence = from_logged(row.type, row.detail)
    if evidence is None:  # a detail logged by an older version
        return ""
    told = Told(row.episode, row.episode_limit, evidence)
    if row.action == Action.STOPPED:
        return stop_text(told)
    if row.action == Action.CUT:
        return cut_notice(told).strip() if isinstance(evidence, Chanting) else ""
    if row.action == Action.LATE:
        return ""  # found once its task had ended: nothing was said
    return warning_text(told)


MARKS = ("loop", "not_a_loop")
MARK_NOTE_CHARS = 2000


async def mark_detection(engine: AsyncEngine, detection_id: int, verdict: str, note: str | None = None,
                         tenant: str | None = None) -> dict | None:
    """A person's word on a detection: `loop` or `not_a_loop`, with a note; a later word replaces it. The
    detection as marked, or None when there is no such detection (of that tenant). A stop marked `not_a_loop`
    is for the caller to resume (`resume_session`)."""
    check_choice("verdict", verdict, MARKS)
    conditions = [Detection.id == detection_id]
    if tenant is not None:
        conditions.append(Detection.tenant == tenant)
    note = clean.text(note, MARK_NOTE_CHARS) if note else None
    async with engine.begin() as connection:
        marked = await connection.execute(update(Detection).where(*conditions).values(
            mark=verdict, marked_at=datetime.now(timezone.utc).replace(tzinfo=None), mark_note=note))
        if marked.rowcount != 1:
            return None
        row = (await connection.execute(select(Detection).where(Detection.id == detection_id))).one()
    return detection_dict(row)


async def captured_requests(engine: AsyncEngine, mark: str | None = None, detection_id: int | None = None,
                            since: datetime | None = None) -> list[tuple[dict, bytes]]:
    """The requests kept with flagged detections (CAPTURE_FLAGGED), oldest first, each with its detection:
    those marked `mark`, the one detection, or those since a time. Their bodies as the client sent them."""
    conditions = DetectionFilter(since=since, mark=mark).conditions()
    if detection_id is not None:
        conditions.append(Detection.id == detection_id)
    async with engine.connect() as connection:
        rows = (await connection.execute(
            select(Detection, CapturedRequest.body.label("captured_body"))
            .join(CapturedRequest, CapturedRequest.episode_key == Detection.episode_key)
            .where(*conditions).order_by(Detection.id))).all()
    return [(detection_dict(row), zlib.decompress(row.captured_body)) for row in rows]


def resumes(detection: dict) -> bool:
    """Whether marking this detection resumes its task: a stop enforced, said not to be a loop."""
    return detection["mark"] == "not_a_loop" and detection["action"] == Action.STOPPED and detection["enforced"]


async def resume_session(engine: AsyncEngine, session_id: str, tenant: str | None = None) -> list[dict]:
    """Let a stopped session go on, as its stop's link does (the CLI's `resume`): its warnings and stop forgiven
    up to the messages it has sent, on every replica within a second, and the resume on its timeline. Every
    tenant's session of that id, or one tenant's."""
    session_id = clean.column_text(SessionRow, "session_id", session_id)
    conditions = [SessionRow.session_id == session_id]
    if tenant is not None:
        conditions.append(SessionRow.tenant == tenant)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    resumed = []
    async with engine.begin() as connection:
        for row in (await connection.execute(select(SessionRow).where(*conditions))).all():
            await connection.execute(update(SessionRow).where(
                SessionRow.tenant == row.tenant, SessionRow.session_id == row.session_id).values(
                reset_at_message=row.message_count, reset_at=now, controls_changed_at=now))
            task = (await connection.execute(
                select(Detection.task).where(Detection.tenant == row.tenant, Detection.session_id == session_id)
                .order_by(Detection.id.desc()).limit(1))).scalar() or ""
            await connection.execute(ResumeLink.__table__.insert().values(
                token_hash=secrets.token_hex(32), tenant=row.tenant, session_id=session_id, task=task,
                created_at=now, used_at=now))  # no link: the resume itself, for the timeline
            resumed.append({"tenant": row.tenant, "session_id": session_id, "reset_at_message": row.message_count})
    return resumed


async def session_timeline(engine: AsyncEngine, session_id: str, tenant: str | None = None) -> list[dict]:
    """Every tenant's session of that id (one, for a tenant), with detections and judge checks in order."""
    session_id = clean.column_text(SessionRow, "session_id", session_id)
    conditions = [SessionRow.session_id == session_id]
    if tenant is not None:
        conditions.append(SessionRow.tenant == tenant)
    async with engine.connect() as connection:
        sessions = (await connection.execute(select(*SessionRow.__table__.c, _STANDING).where(*conditions))).all()
        result = []
        for session in sessions:
            detections = (await connection.execute(
                select(Detection).where(Detection.tenant == session.tenant, Detection.session_id == session_id)
                .order_by(Detection.id))).all()
            checks = (await connection.execute(
                select(JudgeCheckRow).where(JudgeCheckRow.tenant == session.tenant,
                                            JudgeCheckRow.session_id == session_id)
                .order_by(JudgeCheckRow.id))).all()
            resumes = (await connection.execute(
                select(ResumeLink).where(ResumeLink.tenant == session.tenant, ResumeLink.session_id == session_id,
                                         ResumeLink.used_at.is_not(None)))).all()
            entry = session_dict(session, len(detections))
            entry["timeline"] = sorted(
                [{"at": iso(d.created_at), "kind": "detection", **detection_dict(d), "message": shown(d)}
                 for d in detections]
                + [{"at": iso(c.created_at), "kind": "judge_check", "task": c.task, "turn": c.turn,
                    "confidence": c.confidence, "confirm_confidence": c.confirm_confidence,
                    "analysis": c.analysis, "model": c.model, "tokens": c.tokens} for c in checks]
                + [{"at": iso(r.used_at), "kind": "resume", "task": r.task} for r in resumes],
                key=lambda item: item["at"] or "",
            )
            result.append(entry)
    return result
