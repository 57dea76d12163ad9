"""The overview's counts, kept as the log is written, so that `stats`, the timeline and the page cost what
their period has buckets, not what it has rows.

Four tables (proxy/store/models.py), each changed in the same transaction as the rows it counts:

- count_buckets: detections per minute, per five minutes and per hour (three sets of buckets), by tenant,
  mode, type, action and model, with tokens saved and the turns of first episodes. Additive: a new row
  adds one to its minute, its five minutes and its hour; a pruned row takes them away. A month is read
  from its hours; the part before its first hour from five-minute buckets, the part before those from
  minutes, and the part of a minute it starts in from the rows.
- task_outcomes: each task's story (its last detection, its last warning, the last warning the model moved
  on from, whether it reached the stop). A task counts in the bucket of its last detection: when it gets
  another, its outcome leaves the old bucket of outcome_buckets and joins the new one.
- session_counts: each session's detections, and its last enforced one; a session is affected in that
  one's bucket of outcome_buckets.

On PostgreSQL several replicas write at once: a task's or a session's row is created first if missing and
then read FOR UPDATE, so two writers' changes to one task come one after the other. SQLite has one writer.

When the counts do not match the detections (tables new after an upgrade, a restore, rows written by
another tool) `rebuild` recomputes them from the log in one transaction.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (BigInteger, Integer, and_, bindparam, case, cast, delete, false, func, literal_column, or_,
                        select, text, true, union_all, update)
from sqlalchemy.dialects.postgresql import ARRAY

from proxy.detect.actions import Action
from proxy.store.database import dialect_insert
from proxy.store.models import CountBucket, Detection, OutcomeBucket, SessionCount, TaskOutcome

log = logging.getLogger("loopwarden.store")

MINUTE = 60
BUCKET_SECONDS = 300  # outcome_buckets' span, and the one whose sum is checked against the rows
HOUR = 3600
SPANS = (MINUTE, BUCKET_SECONDS, HOUR)
EPOCH = datetime(1970, 1, 1)
WARNED = (Action.WARNED, Action.CUT)  # what a task's warnings are, for its outcome

# What the writer reads back of each detection it inserted (a duplicate episode inserts nothing).
COUNTED = (Detection.created_at, Detection.tenant, Detection.session_id, Detection.task, Detection.model,
           Detection.type, Detection.action, Detection.episode, Detection.turn, Detection.tokens_saved_estimate,
           Detection.recovered, Detection.enforced)


def bucket_of(moment: datetime, span: int = BUCKET_SECONDS) -> int:
    """The bucket a naive-UTC time falls in, as its start in Unix seconds."""
    seconds = int((moment - EPOCH).total_seconds() // 1)
    return seconds - seconds % span


def first_bucket_from(moment: datetime, span: int) -> int:
    """The first bucket that starts at `moment` or after."""
    bucket = bucket_of(moment, span)
    return bucket if bucket_start(bucket) >= moment else bucket + span


def bucket_start(bucket: int) -> datetime:
    return EPOCH + timedelta(seconds=bucket)


def epoch_sql(dialect: str, column) -> Any:
    """A naive-UTC time column as whole Unix seconds, in SQL."""
    if dialect == "postgresql":
        return cast(func.floor(func.extract("epoch", column)), BigInteger)
    return cast(func.strftime(literal_column("'%s'"), column), Integer)


def bucket_sql(dialect: str, column, span: int = BUCKET_SECONDS) -> Any:
    """bucket_of() in SQL."""
    seconds = epoch_sql(dialect, column)
    return seconds - seconds % literal_column(str(span))


# TaskState.outcome's rule in SQL, over task_outcomes rows.
RECOVERED = and_(TaskOutcome.last_warned.is_not(None), TaskOutcome.last_moved_on == TaskOutcome.last_warned,
                 TaskOutcome.stopped.is_(False))


def task_outcomes() -> tuple:
    """Warned, recovered and stopped tasks among the task_outcomes rows selected."""
    return (func.count(TaskOutcome.last_warned), func.sum(case((RECOVERED, 1), else_=0)),
            func.sum(case((TaskOutcome.stopped.is_(True), 1), else_=0)))


@dataclass
class TaskState:
    last_at: datetime | None = None
    last_warned: int | None = None
    last_moved_on: int | None = None
    stopped: bool = False

    def add(self, row: Any) -> None:
        self.last_at = row.created_at if self.last_at is None else max(self.last_at, row.created_at)
        if row.action in WARNED:
            self.last_warned = _higher(self.last_warned, row.episode)
            if row.recovered:
                self.last_moved_on = _higher(self.last_moved_on, row.episode)
        elif row.action == Action.STOPPED:
            self.stopped = True

    def moved_on(self, episode: int) -> None:
        if self.last_warned is not None:
            self.last_moved_on = _higher(self.last_moved_on, episode)

    def outcome(self) -> tuple[int, int, int]:
        """(warned, recovered, stopped), each 0 or 1. A recovery: the model was given the task's last warning
        and moved on, and the task never reached the stop."""
        if self.last_at is None:
            return 0, 0, 0
        warned = self.last_warned is not None
        recovered = warned and self.last_moved_on == self.last_warned and not self.stopped
        return int(warned), int(recovered), int(self.stopped)


def _higher(a: int | None, b: int) -> int:
    return b if a is None else max(a, b)


TASK_KEY = ("tenant", "session_id", "task", "enforced")
SUMS = ("detections", "tokens_saved_estimate", "first_turns", "first_episodes")  # count_buckets' figures
MODEL = func.coalesce(Detection.model, literal_column("''"))  # count_buckets.model of a detection


def detection_sums() -> list:
    """SUMS over detections rows, in SQL (as Changes.count adds them up)."""
    first = Detection.episode == 1
    return [func.count(), func.coalesce(func.sum(Detection.tokens_saved_estimate), 0),
            func.sum(case((first, Detection.turn), else_=0)), func.sum(case((first, 1), else_=0))]


def bucket_sums() -> list:
    """SUMS over count_buckets rows."""
    return [func.sum(getattr(CountBucket, name)) for name in SUMS]


COUNT_KEY = ("span", "bucket", "tenant", "enforced", "type", "action", "model")


class Changes:
    """Deltas for the bucket tables, summed over a batch."""

    def __init__(self) -> None:
        self.counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self.outcomes: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])

    def count(self, row: Any, sign: int = 1) -> None:
        first = row.episode == 1
        for span in SPANS:
            delta = self.counts[(span, bucket_of(row.created_at, span), row.tenant, bool(row.enforced), row.type,
                                 row.action, row.model or "")]
            delta[0] += sign
            delta[1] += sign * (row.tokens_saved_estimate or 0)
            delta[2] += sign * row.turn if first else 0
            delta[3] += sign if first else 0

    def move_task(self, tenant: str, enforced: bool, before: TaskState, after: TaskState) -> None:
        for state, sign in ((before, -1), (after, 1)):
            if state.last_at is not None:
                delta = self.outcomes[(bucket_of(state.last_at), tenant, enforced)]
                for index, value in enumerate(state.outcome()):
                    delta[index] += sign * value

    def move_session(self, tenant: str, before: datetime | None, after: datetime) -> None:
        if before is not None:
            self.outcomes[(bucket_of(before), tenant, True)][3] -= 1
        self.outcomes[(bucket_of(after), tenant, True)][3] += 1

    async def write(self, connection, dialect: str) -> None:
        """Add the deltas, in key order (two writers lock bucket rows in the same order)."""
        counts = [{**dict(zip(COUNT_KEY, k)), **dict(zip(SUMS, d))}
                  for k, d in sorted(self.counts.items()) if any(d)]
        if counts:
            upsert = dialect_insert(dialect, CountBucket)
            await connection.execute(upsert.on_conflict_do_update(
                index_elements=list(COUNT_KEY),
                set_={name: getattr(CountBucket, name) + getattr(upsert.excluded, name) for name in SUMS}),
                counts)
        outcomes = [{"bucket": k[0], "tenant": k[1], "enforced": k[2], "warned_tasks": d[0],
                     "recovered_tasks": d[1], "stopped_tasks": d[2], "sessions": d[3]}
                    for k, d in sorted(self.outcomes.items()) if any(d)]
        if outcomes:
            upsert = dialect_insert(dialect, OutcomeBucket)
            await connection.execute(upsert.on_conflict_do_update(
                index_elements=["bucket", "tenant", "enforced"],
                set_={name: getattr(OutcomeBucket, name) + getattr(upsert.excluded, name)
                      for name in ("warned_tasks", "recovered_tasks", "stopped_tasks", "sessions")}),
                outcomes)


KEYS_PER_QUERY = 200  # SQLite: an OR of 200 keys stays well inside its expression depth (1,000)
SLOTS = (1, 4, 16, 64, KEYS_PER_QUERY)  # SQLite: a statement per size, built once, its SQL compiled once


def _slots(keys: list[tuple]) -> int:
    return next(size for size in SLOTS if size >= len(keys))


@functools.cache
def _keyed(dialect: str, table, key_names: tuple[str, ...], slots: int, lock: bool) -> Any:
    """The rows of `table` (with `lock`, whole and locked; else a detection's COUNTED columns) whose key is
    one of a list: on PostgreSQL a join with the keys unnested from arrays, on SQLite an OR of `slots` ANDs.
    Each finds a row by one index lookup per key (SQLite scans the table for a row-value IN list; PostgreSQL
    factors an OR's common terms out and scans all of a tenant's rows)."""
    columns = [getattr(table, name) for name in key_names]
    statement = select(table) if lock else select(*COUNTED).select_from(table)
    if dialect == "postgresql":
        wanted = func.unnest(*(bindparam(f"keys_{name}", type_=ARRAY(column.type))
                               for name, column in zip(key_names, columns))
                             ).table_valued(*key_names).render_derived(name="wanted")
        statement = statement.join(wanted, and_(*(column == wanted.c[name]
                                                  for name, column in zip(key_names, columns))))
    else:
        statement = statement.where(or_(*(and_(*(column == bindparam(f"k{i}_{j}")
                                                 for j, column in enumerate(columns))) for i in range(slots))))
    return statement.order_by(*columns).with_for_update(of=table) if lock else statement


async def _rows_by_key(connection, dialect: str, table, key_names: tuple[str, ...], keys: list[tuple],
                       lock: bool) -> list:
    rows = []
    for start in range(0, len(keys), KEYS_PER_QUERY):
        chunk = keys[start:start + KEYS_PER_QUERY]
        if dialect == "postgresql":
            statement = _keyed(dialect, table, key_names, 0, lock)
            params = {f"keys_{name}": [key[j] for key in chunk] for j, name in enumerate(key_names)}
        else:
            statement = _keyed(dialect, table, key_names, _slots(chunk), lock)
            padded = chunk + [chunk[-1]] * (_slots(chunk) - len(chunk))  # a repeated key finds the same row
            params = {f"k{i}_{j}": value for i, key in enumerate(padded) for j, value in enumerate(key)}
        rows += (await connection.execute(statement, params)).all()
    return rows


async def _locked(connection, dialect: str, table, keys: list[tuple], key_columns: tuple[str, ...],
                  blank: dict, create: bool) -> dict[tuple, Any]:
    """The rows of `table` with these keys, locked for this transaction; with `create`, missing ones are
    inserted blank first (so a concurrent writer waits for ours instead of inserting its own)."""
    if not keys:
        return {}
    if create:
        blanks = dialect_insert(dialect, table).on_conflict_do_nothing(index_elements=list(key_columns))
        await connection.execute(blanks, [dict(zip(key_columns, key), **blank) for key in keys])
    rows = await _rows_by_key(connection, dialect, table, key_columns, keys, lock=True)
    return {tuple(getattr(row, name) for name in key_columns): row for row in rows}


async def _save_tasks(connection, changes: Changes, before: dict[tuple, TaskState],
                      after: dict[tuple, TaskState]) -> None:
    """Write the tasks whose story changed (a task left with no detection goes), moving their outcomes."""
    changed = [(key, state) for key, state in sorted(after.items()) if state != before[key]]
    for key, state in changed:
        changes.move_task(key[0], key[3], before[key], state)
    where = and_(*(getattr(TaskOutcome, name) == bindparam(f"k_{name}") for name in TASK_KEY))
    kept = [{**dict(zip([f"k_{name}" for name in TASK_KEY], key)), **vars(state)}
            for key, state in changed if state.last_at is not None]
    if kept:
        await connection.execute(update(TaskOutcome).where(where).values(
            last_at=bindparam("last_at"), last_warned=bindparam("last_warned"),
            last_moved_on=bindparam("last_moved_on"), stopped=bindparam("stopped")), kept)
    gone = [dict(zip([f"k_{name}" for name in TASK_KEY], key)) for key, state in changed if state.last_at is None]
    if gone:
        await connection.execute(delete(TaskOutcome).where(where), gone)


def _state(row: Any) -> TaskState:
    return TaskState(row.last_at, row.last_warned, row.last_moved_on, bool(row.stopped))


async def record(connection, dialect: str, detections: list, recoveries: list[dict]) -> None:
    """Count a batch the writer has just inserted (`detections`: COUNTED rows) and the recovery marks it has
    just set, in the writer's transaction."""
    if not detections and not recoveries:
        return
    changes = Changes()
    for row in detections:
        changes.count(row)

    task_keys = sorted({(r.tenant, r.session_id, r.task, bool(r.enforced)) for r in detections})
    marked = sorted({(v["b_tenant"], v["b_session_id"], v["b_task"], enforced)
                     for v in recoveries for enforced in (True, False)} - set(task_keys))
    rows = await _locked(connection, dialect, TaskOutcome, task_keys, TASK_KEY, {"stopped": False}, create=True)
    rows.update(await _locked(connection, dialect, TaskOutcome, marked, TASK_KEY, {}, create=False))
    before = {key: _state(row) for key, row in rows.items()}
    after = {key: TaskState(**vars(state)) for key, state in before.items()}
    for row in detections:
        after[(row.tenant, row.session_id, row.task, bool(row.enforced))].add(row)
    for values in recoveries:
        for enforced in (True, False):
            state = after.get((values["b_tenant"], values["b_session_id"], values["b_task"], enforced))
            if state is not None:
                state.moved_on(values["b_episode"])
    await _save_tasks(connection, changes, before, after)

    sessions: dict[tuple, list] = {}
    for row in detections:
        entry = sessions.setdefault((row.tenant, row.session_id), [0, None])
        entry[0] += 1
        if row.enforced and (entry[1] is None or row.created_at > entry[1]):
            entry[1] = row.created_at
    if sessions:
        keys = sorted(sessions)
        found = await _locked(connection, dialect, SessionCount, keys, ("tenant", "session_id"),
                              {"detections": 0}, create=True)
        updates = []
        for key in keys:
            added, last = sessions[key]
            previous = found[key].last_enforced_at
            if last is not None and (previous is None or last > previous):
                if previous is None or bucket_of(previous) != bucket_of(last):
                    changes.move_session(key[0], previous, last)
            else:
                last = previous
            updates.append({"k_tenant": key[0], "k_session_id": key[1], "added": added, "last": last})
        await connection.execute(
            update(SessionCount).where(SessionCount.tenant == bindparam("k_tenant"),
                                       SessionCount.session_id == bindparam("k_session_id"))
            .values(detections=SessionCount.detections + bindparam("added"), last_enforced_at=bindparam("last")),
            updates)
    await changes.write(connection, dialect)


async def forget(connection, dialect: str, rows: list) -> None:
    """Take deleted detections (COUNTED rows) out of the counts, in the deleting transaction: their tasks'
    stories are read again from the rows left."""
    changes = Changes()
    per_session: dict[tuple, int] = defaultdict(int)
    for row in rows:
        changes.count(row, -1)
        per_session[(row.tenant, row.session_id)] += 1
    keys = sorted({(r.tenant, r.session_id, r.task, bool(r.enforced)) for r in rows})
    found = await _locked(connection, dialect, TaskOutcome, keys, TASK_KEY, {}, create=False)
    before = {key: _state(row) for key, row in found.items()}
    after = {key: TaskState() for key in before}
    for row in await _rows_by_key(connection, dialect, Detection, TASK_KEY, keys, lock=False):
        state = after.get((row.tenant, row.session_id, row.task, bool(row.enforced)))
        if state is not None:
            state.add(row)
    await _save_tasks(connection, changes, before, after)
    if per_session:
        await connection.execute(
            update(SessionCount).where(SessionCount.tenant == bindparam("k_tenant"),
                                       SessionCount.session_id == bindparam("k_session_id"))
            .values(detections=SessionCount.detections - bindparam("removed")),
            [{"k_tenant": k[0], "k_session_id": k[1], "removed": n} for k, n in sorted(per_session.items())])
    await changes.write(connection, dialect)


async def forget_before(connection, cutoff: datetime) -> None:
    """After the detections before `cutoff` (a bucket's start) are deleted: tasks and sessions whose last
    detection was before it, and the buckets before it."""
    bucket = bucket_of(cutoff)
    await connection.execute(delete(TaskOutcome).where(TaskOutcome.last_at < cutoff))
    await connection.execute(update(SessionCount).where(SessionCount.last_enforced_at < cutoff)
                             .values(last_enforced_at=None))
    await connection.execute(delete(SessionCount).where(SessionCount.detections <= 0,
                                                        SessionCount.last_enforced_at.is_(None)))
    await connection.execute(delete(OutcomeBucket).where(OutcomeBucket.bucket < bucket))
    await connection.execute(delete(CountBucket).where(CountBucket.bucket < bucket, CountBucket.detections <= 0))


async def consistent(connection) -> tuple[int, int]:
    """(detections in the log, detections counted): equal when the counts are whole. One statement, so one
    snapshot: the writer changes both in one transaction."""
    row = (await connection.execute(select(
        select(func.count()).select_from(Detection).scalar_subquery(),
        select(func.coalesce(func.sum(CountBucket.detections), 0)).where(CountBucket.span == BUCKET_SECONDS)
        .scalar_subquery()))).one()
    return int(row[0]), int(row[1])


def recount(dialect: str) -> list:
    """The statements that recompute every count from the detections, in order (also run by migration
    0006 on an existing log)."""
    statements: list = []
    for table in (CountBucket, TaskOutcome, SessionCount, OutcomeBucket):
        statements.append(delete(table))
    minute = bucket_sql(dialect, Detection.created_at, MINUTE)
    warned = Detection.action.in_(WARNED)
    statements.append(dialect_insert(dialect, CountBucket).from_select(
        list(COUNT_KEY) + list(SUMS),
        select(literal_column(str(MINUTE)), minute, Detection.tenant, Detection.enforced, Detection.type,
               Detection.action, MODEL, *detection_sums())
        .group_by(minute, Detection.tenant, Detection.enforced, Detection.type, Detection.action, MODEL)))
    dimensions = [CountBucket.tenant, CountBucket.enforced, CountBucket.type, CountBucket.action, CountBucket.model]
    for finer, span in zip(SPANS, SPANS[1:]):  # five minutes from minutes, hours from five minutes
        wider = CountBucket.bucket - CountBucket.bucket % literal_column(str(span))
        statements.append(dialect_insert(dialect, CountBucket).from_select(
            list(COUNT_KEY) + list(SUMS),
            select(literal_column(str(span)), wider, *dimensions, *bucket_sums())
            .where(CountBucket.span == finer).group_by(wider, *dimensions)))
    statements.append(dialect_insert(dialect, TaskOutcome).from_select(
        ["tenant", "session_id", "task", "enforced", "last_at", "last_warned", "last_moved_on", "stopped"],
        select(Detection.tenant, Detection.session_id, Detection.task, Detection.enforced,
               func.max(Detection.created_at), func.max(case((warned, Detection.episode))),
               func.max(case((and_(warned, Detection.recovered.is_(True)), Detection.episode))),
               func.max(case((Detection.action == Action.STOPPED, 1), else_=0)) == 1)
        .group_by(Detection.tenant, Detection.session_id, Detection.task, Detection.enforced)))
    statements.append(dialect_insert(dialect, SessionCount).from_select(
        ["tenant", "session_id", "detections", "last_enforced_at"],
        select(Detection.tenant, Detection.session_id, func.count(),
               func.max(case((Detection.enforced.is_(True), Detection.created_at))))
        .group_by(Detection.tenant, Detection.session_id)))
    task_bucket = bucket_sql(dialect, TaskOutcome.last_at)
    session_bucket = bucket_sql(dialect, SessionCount.last_enforced_at)
    zero, one = literal_column("0"), literal_column("1")
    parts = union_all(
        select(task_bucket.label("bucket"), TaskOutcome.tenant.label("tenant"),
               TaskOutcome.enforced.label("enforced"),
               case((TaskOutcome.last_warned.is_not(None), 1), else_=0).label("w"),
               case((RECOVERED, 1), else_=0).label("r"),
               case((TaskOutcome.stopped.is_(True), 1), else_=0).label("s"), zero.label("n")),
        select(session_bucket, SessionCount.tenant, true(), zero, zero, zero, one)
        .where(SessionCount.last_enforced_at.is_not(None)),
    ).subquery()
    statements.append(dialect_insert(dialect, OutcomeBucket).from_select(
        ["bucket", "tenant", "enforced", "warned_tasks", "recovered_tasks", "stopped_tasks", "sessions"],
        select(parts.c.bucket, parts.c.tenant, parts.c.enforced, func.sum(parts.c.w), func.sum(parts.c.r),
               func.sum(parts.c.s), func.sum(parts.c.n)).group_by(parts.c.bucket, parts.c.tenant, parts.c.enforced)))
    return statements


async def rebuild(connection, dialect: str) -> bool:
    """Recompute every count from the detections, unless another writer has just done it. True when it did."""
    # Writers wait (their batches stay buffered); a second rebuild waits, then finds the counts whole.
    if dialect == "postgresql":
        await connection.execute(text("LOCK TABLE detections IN SHARE ROW EXCLUSIVE MODE"))
    else:  # a write first takes SQLite's one write lock, so what is read next is not stale
        await connection.execute(delete(OutcomeBucket).where(false()))
    rows, counted = await consistent(connection)
    if rows == counted:
        return False
    for statement in recount(dialect):
        await connection.execute(statement)
    log.warning("overview counts rebuilt from %d detections", rows)
    return True
