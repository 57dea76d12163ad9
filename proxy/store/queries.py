"""The queries the CLI and the HTTP API share. Times in and out are naive UTC."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Integer, and_, case, cast, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.detect.engine import Episode
from proxy.detect.texts import cut_notice, stop_text, warning_text
from proxy.store.models import Detection, JudgeCheckRow, SessionRow

TYPES = ("tool_call", "tool_cycle", "tool_error", "content", "llm")
ACTIONS = ("warned", "stopped", "cut")
_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
MAX_LIMIT = 1000


class QueryError(ValueError):
    """A filter the user gave cannot be used; the message says which and why."""


def parse_since(value: str | None, now: datetime | None = None) -> datetime | None:
    """`1h`, `30m`, `7d` back from now, or an ISO time (local time when it has no zone) -> naive UTC."""
    if value is None or value == "":
        return None
    now = now or datetime.now(timezone.utc)
    match = _RELATIVE.match(value.strip())
    if match:
        moment = now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
        return moment.astimezone(timezone.utc).replace(tzinfo=None)
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise QueryError(f"--since: expected a duration like 1h, 30m, 7d or a time like 2026-11-01T00:00, "
                         f"got {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # the user's local time
    return moment.astimezone(timezone.utc).replace(tzinfo=None)


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
        "recovered": row.recovered, "enforced": row.enforced,
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

    def conditions(self) -> list:
        check_choice("type", self.type, TYPES)
        check_choice("action", self.action, ACTIONS)
        conditions = []
        if self.tenant is not None:
            conditions.append(Detection.tenant == self.tenant)
        if self.session is not None:
            conditions.append(Detection.session_id == self.session)
        if self.type is not None:
            conditions.append(Detection.type == self.type)
        if self.action is not None:
            conditions.append(Detection.action == self.action)
        if self.since is not None:
            conditions.append(Detection.created_at >= self.since)
        if self.enforced is not None:
            conditions.append(Detection.enforced.is_(self.enforced))
        return conditions


async def list_detections(engine: AsyncEngine, where: DetectionFilter, limit: int = 50,
                          cursor: str | None = None) -> tuple[list[dict], str | None]:
    """Newest first; the cursor continues after the last row returned."""
    if limit < 1 or limit > MAX_LIMIT:
        raise QueryError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    conditions = where.conditions()
    if cursor:
        if not cursor.isdigit():
            raise QueryError(f"cursor is not one this API gave: {cursor!r}")
        conditions.append(Detection.id < int(cursor))
    statement = select(Detection).where(and_(True, *conditions)).order_by(Detection.id.desc()).limit(limit + 1)
    async with engine.connect() as connection:
        rows = (await connection.execute(statement)).all()
    items = [detection_dict(row) for row in rows[:limit]]
    next_cursor = str(items[-1]["id"]) if len(rows) > limit else None
    return items, next_cursor


async def stats(engine: AsyncEngine, since: datetime | None = None, tenant: str | None = None) -> dict[str, Any]:
    """What enforcement did; and, apart, what observe mode saw it would have done. A few passes over the
    period's rows, each aggregated in the database."""
    period = and_(True, *DetectionFilter(tenant=tenant, since=since).conditions())
    enforced = and_(period, Detection.enforced.is_(True))
    warned = Detection.action.in_(("warned", "cut"))
    async with engine.connect() as connection:
        counts = (await connection.execute(
            select(Detection.enforced, Detection.type, Detection.action, func.count(),
                   func.coalesce(func.sum(Detection.tokens_saved_estimate), 0))
            .where(period).group_by(Detection.enforced, Detection.type, Detection.action))).all()
        sessions = (await connection.execute(select(func.count()).select_from(
            select(Detection.tenant, Detection.session_id).where(enforced).distinct().subquery()))).scalar()
        first_turns = (await connection.execute(
            select(func.avg(Detection.turn)).where(enforced, Detection.episode == 1))).scalar()
        # Per task (tenant, session, task key): its last warning (or cut), the last one the model moved on
        # from, and whether it reached the stop.
        tasks = select(
            Detection.enforced.label("enforced"),
            func.max(case((warned, Detection.episode))).label("last_warned"),
            func.max(case((and_(warned, Detection.recovered.is_(True)), Detection.episode))).label("last_moved_on"),
            func.max(case((Detection.action == "stopped", 1), else_=0)).label("stopped"),
        ).where(period).group_by(Detection.tenant, Detection.session_id, Detection.task, Detection.enforced).subquery()
        outcome = (await connection.execute(select(
            tasks.c.enforced,
            func.count(tasks.c.last_warned),
            func.sum(case((and_(tasks.c.last_warned == tasks.c.last_moved_on, tasks.c.stopped == 0), 1), else_=0)),
            func.sum(tasks.c.stopped)).group_by(tasks.c.enforced))).all()
        judge_condition = [JudgeCheckRow.created_at >= since] if since else []
        if tenant is not None:
            judge_condition.append(JudgeCheckRow.tenant == tenant)
        judge = (await connection.execute(
            select(func.count(), func.coalesce(func.sum(JudgeCheckRow.tokens), 0)).where(
                and_(True, *judge_condition)))).one()
    tallies = {True: ({}, {}, 0), False: ({}, {}, 0)}
    for is_enforced, kind, action, count, saved in counts:
        by_type, by_action, total_saved = tallies[bool(is_enforced)]
        by_type[kind] = by_type.get(kind, 0) + count
        by_action[action] = by_action.get(action, 0) + count
        tallies[bool(is_enforced)] = (by_type, by_action, total_saved + int(saved or 0))
    per_mode = {bool(row[0]): (row[1] or 0, int(row[2] or 0), int(row[3] or 0)) for row in outcome}
    warned_tasks, recovered, _ = per_mode.get(True, (0, 0, 0))
    by_type, by_action, saved = tallies[True]
    observed_type, observed_action, _ = tallies[False]
    return {
        "since": iso(since),
        "detections": sum(by_type.values()),
        "by_type": {t: by_type.get(t, 0) for t in TYPES},
        "by_action": {a: by_action.get(a, 0) for a in ACTIONS},
        "sessions_affected": sessions or 0,
        "average_turns_before_detection": round(float(first_turns), 1) if first_turns is not None else None,
        "warned_tasks": warned_tasks,
        # A recovery: the model was given the task's last warning and moved on, and the task never reached the stop.
        "recovered_tasks": recovered,
        "recovery_rate": round(recovered / warned_tasks, 3) if warned_tasks else None,
        "tokens_saved_estimate": saved,
        "judge_checks": judge[0],
        "judge_tokens": int(judge[1] or 0),
        "observed": {
            "detections": sum(observed_type.values()),
            "by_type": {t: observed_type.get(t, 0) for t in TYPES},
            "by_action": {a: observed_action.get(a, 0) for a in ACTIONS},
            "would_have_stopped_tasks": per_mode.get(False, (0, 0, 0))[2],
        },
    }


async def timeline(engine: AsyncEngine, where: DetectionFilter, buckets: int = 48,
                   now: datetime | None = None) -> dict[str, Any]:
    """Detections over time, by type: `buckets` equal spans from the filter's `since` (or the first match)."""
    if buckets < 1 or buckets > 500:
        raise QueryError(f"buckets must be between 1 and 500, got {buckets}")
    conditions = and_(True, *where.conditions())
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    async with engine.connect() as connection:
        start = where.since or (await connection.execute(select(func.min(Detection.created_at)).where(conditions))
                                ).scalar() or now - timedelta(hours=1)
        width = max(1, -(-int((now - start).total_seconds() + 1) // buckets))  # seconds per bucket, rounded up
        offset = (start - datetime(1970, 1, 1)).total_seconds()
        if engine.dialect.name == "postgresql":
            bucket = func.floor((func.extract("epoch", Detection.created_at) - offset) / width)
        else:
            bucket = cast((cast(func.strftime("%s", Detection.created_at), Integer) - int(offset)) / width, Integer)
        rows = (await connection.execute(
            select(bucket.label("bucket"), Detection.type, func.count()).where(conditions)
            .group_by(bucket, Detection.type))).all()
    series = {kind: [0] * buckets for kind in TYPES}
    for index, kind, count in rows:
        index = min(max(int(index), 0), buckets - 1)
        series[kind][index] += count
    return {"start": iso(start), "bucket_seconds": width, "buckets": buckets, "series": series}


def session_dict(row: Any, detections: int = 0) -> dict[str, Any]:
    return {
        "session_id": row.session_id, "tenant": row.tenant, "first_seen": iso(row.first_seen),
        "last_seen": iso(row.last_seen), "requests": row.requests, "messages": row.message_count,
        "model": row.model, "disabled": row.disabled, "reset_at_message": row.reset_at_message,
        "detections": detections,
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
    counts = (select(Detection.tenant, Detection.session_id, func.count().label("n"))
              .group_by(Detection.tenant, Detection.session_id).subquery())
    statement = (
        select(*SessionRow.__table__.c, func.coalesce(counts.c.n, 0).label("detections"))
        .outerjoin(counts, and_(counts.c.tenant == SessionRow.tenant, counts.c.session_id == SessionRow.session_id))
        .where(and_(True, *conditions)).order_by(SessionRow.last_seen.desc()).limit(limit)
    )
    async with engine.connect() as connection:
        rows = (await connection.execute(statement)).all()
    return [session_dict(row, row.detections) for row in rows]


def shown(row: Any) -> str:
    """What loopwarden said for this episode: the warning the model was given, the stop's message, or the
    cut's notice (rebuilt from the logged detail by the same functions that wrote them)."""
    episode = Episode(row.episode, row.episode_limit, row.type, row.detail or {}, 0, 0, row.turn)
    try:
        if row.action == "stopped":
            return stop_text(episode)
        if row.action == "cut":
            return cut_notice(episode).strip()
        return warning_text(episode)
    except (KeyError, TypeError):  # a detail logged by an older version
        return ""


async def session_timeline(engine: AsyncEngine, session_id: str, tenant: str | None = None) -> list[dict]:
    """Every tenant's session of that id (one, for a tenant), with detections and judge checks in order."""
    conditions = [SessionRow.session_id == session_id]
    if tenant is not None:
        conditions.append(SessionRow.tenant == tenant)
    async with engine.connect() as connection:
        sessions = (await connection.execute(select(SessionRow).where(*conditions))).all()
        result = []
        for session in sessions:
            detections = (await connection.execute(
                select(Detection).where(Detection.tenant == session.tenant, Detection.session_id == session_id)
                .order_by(Detection.id))).all()
            checks = (await connection.execute(
                select(JudgeCheckRow).where(JudgeCheckRow.tenant == session.tenant,
                                            JudgeCheckRow.session_id == session_id)
                .order_by(JudgeCheckRow.id))).all()
            entry = session_dict(session, len(detections))
            entry["timeline"] = sorted(
                [{"at": iso(d.created_at), "kind": "detection", **detection_dict(d), "message": shown(d)}
                 for d in detections]
                + [{"at": iso(c.created_at), "kind": "judge_check", "task": c.task, "turn": c.turn,
                    "confidence": c.confidence, "confirm_confidence": c.confirm_confidence,
                    "analysis": c.analysis, "model": c.model, "tokens": c.tokens} for c in checks],
                key=lambda item: item["at"] or "",
            )
            result.append(entry)
    return result
