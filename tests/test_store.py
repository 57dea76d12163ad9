"""The detection log on SQLite and on a real PostgreSQL: migrations, the writer under faults, queries."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, inspect, select, text
from sqlalchemy.engine import make_url

from proxy.detect.judge_policy import JudgeCheck
from proxy.store import queries
from proxy.store.database import create_engine, downgrade, run_migrations
from proxy.store.models import Detection, SessionRow
from proxy.store.store import Store
from proxy.store.writer import LogWriter, utcnow
from tests.tcp_relay import TcpRelay


def detection(n: int, **overrides) -> dict:
    values = {
        "created_at": utcnow(), "session_id": f"s{n % 3}", "tenant": "t1", "task": f"task{n % 5}",
        "model": "gpt-test", "type": "tool_call", "action": "warned", "episode": 1, "episode_limit": 2, "turn": 5,
        "detail": {"tool": "read_file", "arguments": '{"path":"a.py"}', "repeats": 5}, "request_id": None,
        "tokens_saved_estimate": 0, "episode_key": f"key-{n}",
    }
    values.update(overrides)
    return values


async def migrated(url: str):
    await asyncio.to_thread(run_migrations, url)
    return create_engine(url)


async def count(engine, model=Detection) -> int:
    async with engine.connect() as connection:
        return (await connection.execute(select(func.count()).select_from(model))).scalar()


async def test_migrations_upgrade_idempotent_and_downgrade(database_url):
    await asyncio.to_thread(run_migrations, database_url)
    await asyncio.to_thread(run_migrations, database_url)
    engine = create_engine(database_url)
    async with engine.connect() as connection:
        tables = set(await connection.run_sync(lambda c: inspect(c).get_table_names()))
        indexes = {i["name"] for i in await connection.run_sync(lambda c: inspect(c).get_indexes("detections"))}
    assert {"detections", "sessions", "judge_checks", "alembic_version"} <= tables
    assert {"ix_detections_session", "ix_detections_type", "ix_detections_created_at"} <= indexes
    await engine.dispose()
    await asyncio.to_thread(downgrade, database_url, "base")
    engine = create_engine(database_url)
    async with engine.connect() as connection:
        tables = set(await connection.run_sync(lambda c: inspect(c).get_table_names()))
    await engine.dispose()
    assert tables <= {"alembic_version"}
    await asyncio.to_thread(run_migrations, database_url)


async def test_the_migrations_build_the_schema_the_models_describe(database_url):
    """What the code reads and writes (proxy/store/models.py) is what the migrations made: no table, column,
    index or type missing on either side."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from proxy.store.models import Base

    await asyncio.to_thread(run_migrations, database_url)
    engine = create_engine(database_url)
    async with engine.connect() as connection:
        differences = await connection.run_sync(
            lambda c: compare_metadata(MigrationContext.configure(c, opts={"compare_type": True}), Base.metadata))
    await engine.dispose()
    assert [d for d in differences if not (isinstance(d, tuple) and d[0] == "remove_table"
                                           and d[1].name == "alembic_version")] == []


async def test_writer_batches_dedupes_and_folds_session_sightings(database_url):
    engine = await migrated(database_url)
    writer = LogWriter(database_url)
    writer.start()
    for n in range(1200):
        writer.add_detection(detection(n))
    for n in range(50):
        writer.add_detection(detection(n))  # the same episodes again: one row each
    for n in range(30):
        writer.session_seen("t1", "s0", n + 1, "gpt-test")
    await writer.close()
    assert await count(engine) == 1200
    async with engine.connect() as connection:
        row = (await connection.execute(select(SessionRow))).one()
    assert (row.requests, row.message_count) == (30, 30)
    assert writer.dropped == 0
    await engine.dispose()


async def test_a_sessions_agent_and_title_are_the_first_seen_and_fit_their_columns(database_url):
    engine = await migrated(database_url)
    writer = LogWriter(database_url)
    writer.start()
    writer.session_seen("t1", "named", 2, "gpt-test", agent="Claude Code 2.1.330", title="fix a.py")
    writer.session_seen("t1", "named", 4, "gpt-test")  # later requests carry neither
    writer.session_seen("t1", "named", 6, "gpt-test", agent="other", title="other")
    writer.session_seen("t1", "long", 1, None, agent="a\x00" * 200, title="t" * 500)
    # Two ids the column holds alike (one with a NUL) are one session, one row.
    writer.session_seen("t1", "odd\x00id", 3, None)
    writer.session_seen("t1", "oddid", 5, None)
    await writer.flush()
    # Another replica's later sighting of the same session renames nothing.
    writer.session_seen("t1", "named", 8, "gpt-test", agent="Codex CLI 0.169.0", title="later")
    await writer.close()
    sessions = {s["session_id"]: s for s in await queries.list_sessions(engine)}
    assert (sessions["named"]["agent"], sessions["named"]["title"]) == ("Claude Code 2.1.330", "fix a.py")
    assert sessions["named"]["requests"] == 4 and sessions["named"]["messages"] == 8
    assert 0 < len(sessions["long"]["agent"]) <= 128 and "\x00" not in sessions["long"]["agent"]
    assert len(sessions["long"]["title"]) == 120
    odd = sessions["oddid"]
    assert odd["requests"] == 2 and odd["messages"] == 5
    timeline = await queries.session_timeline(engine, "named")
    assert timeline[0]["agent"] == "Claude Code 2.1.330" and timeline[0]["title"] == "fix a.py"
    assert writer.rejected == 0
    await engine.dispose()


class Outage:
    """The log's database going away and coming back: PostgreSQL behind a relay that is cut, SQLite with its
    table renamed."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.url = make_url(database_url)
        self.relay = None

    async def start(self) -> str:
        """Migrate; the address the writer is to use."""
        await asyncio.to_thread(run_migrations, self.database_url)
        if self.url.get_backend_name() == "postgresql":
            self.relay = await TcpRelay(self.url.host or "127.0.0.1", self.url.port or 5432).start()
            self.url = self.url.set(host="127.0.0.1", port=self.relay.port)
        self.engine = create_engine(self.url.render_as_string(hide_password=False))
        return self.url.render_as_string(hide_password=False)

    async def away(self) -> None:
        if self.relay is not None:
            await self.relay.cut()
        else:
            async with self.engine.begin() as connection:
                await connection.execute(text("ALTER TABLE detections RENAME TO detections_away"))

    async def back(self) -> None:
        if self.relay is not None:
            original = make_url(self.database_url)
            self.relay = TcpRelay(original.host or "127.0.0.1", original.port or 5432)
            self.relay.port = self.url.port  # the same address the engine knows
            await self.relay.start()
        else:
            async with self.engine.begin() as connection:
                await connection.execute(text("ALTER TABLE detections_away RENAME TO detections"))

    async def close(self) -> None:
        await self.engine.dispose()
        if self.relay is not None:
            await self.relay.cut()


async def drained(writer: LogWriter) -> None:
    for _ in range(100):
        if writer.pending == 0:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{writer.pending} records still pending")


async def test_writer_survives_an_outage_and_counts_what_it_drops(database_url):
    outage = Outage(database_url)
    drops: list[int] = []
    writer = LogWriter(await outage.start(), capacity=40, on_drop=drops.append)
    writer.start()
    writer.add_detection(detection(0))
    await writer.flush()
    assert await count(outage.engine) == 1

    # The database goes away while requests keep coming.
    await outage.away()
    for n in range(1, 61):
        writer.add_detection(detection(n))  # never blocks, never raises
    await asyncio.sleep(1.0)
    assert writer.pending == 40
    assert writer.dropped == 20 and sum(drops) == 20

    # It comes back: everything still buffered is written.
    await outage.back()
    await drained(writer)
    assert await count(outage.engine) == 41
    async with outage.engine.connect() as connection:
        keys = set((await connection.execute(select(Detection.episode_key))).scalars())
    assert keys == {"key-0"} | {f"key-{n}" for n in range(21, 61)}  # the oldest went first
    await writer.close()
    await outage.close()


async def test_recoveries_during_an_outage_take_no_room_of_their_own(database_url):
    """Each warning the model moved on from owes a row and a recovery mark. While the database is away, the
    mark is set on the buffered row, so the buffer holds as many warnings as its size (it once held half)."""
    outage = Outage(database_url)
    writer = LogWriter(await outage.start(), capacity=40)
    writer.start()
    writer.add_detection(detection(0, session_id="written", episode=1))
    await writer.flush()
    await outage.away()
    writer.add_recovery({"b_tenant": "t1", "b_session_id": "written", "b_task": "task0", "b_episode": 1})
    for n in range(1, 40):
        writer.add_detection(detection(n, session_id=f"s-{n}", task="t", episode=1))
        writer.add_recovery({"b_tenant": "t1", "b_session_id": f"s-{n}", "b_task": "t", "b_episode": 1})
    await asyncio.sleep(0.5)
    assert writer.dropped == 0
    await outage.back()
    await drained(writer)
    async with outage.engine.connect() as connection:
        rows = (await connection.execute(select(Detection.session_id, Detection.recovered))).all()
    assert len(rows) == 40 and all(recovered for _, recovered in rows)
    await writer.close()
    await outage.close()


async def _seed(database_url: str) -> None:
    writer = LogWriter(database_url)
    writer.start()
    now = utcnow()
    rows = [
        detection(1, session_id="alpha", task="t-a", type="tool_call", action="warned", episode=1, turn=5,
                  created_at=now - timedelta(hours=3)),
        detection(2, session_id="alpha", task="t-a", type="tool_call", action="warned", episode=2, turn=6),
        detection(3, session_id="alpha", task="t-a", type="tool_call", action="stopped", episode=3, turn=7,
                  tokens_saved_estimate=1200),
        detection(4, session_id="beta", task="t-b", type="content", action="cut", episode=1, turn=2,
                  detail={"repeated": "I will check again."}, tokens_saved_estimate=3000),
        detection(5, session_id="gamma", tenant="t2", task="t-c", type="tool_error", action="warned", episode=1,
                  turn=9),
    ]
    for row in rows:
        writer.add_detection(row)
    # The model moved on after t-b's cut and after t-a's first warning (t-a reached the stop all the same);
    # t-c's warning was never followed by a model's answer.
    for session, task in (("beta", "t-b"), ("alpha", "t-a")):
        writer.add_recovery({"b_tenant": "t1", "b_session_id": session, "b_task": task, "b_episode": 1})
    for tenant, session in (("t1", "alpha"), ("t1", "beta"), ("t2", "gamma")):
        writer.session_seen(tenant, session, 12, "gpt-test")
    writer.add_judge_check({"created_at": now, "tenant": "t1", "session_id": "alpha", "task": "t-a", "turn": 30,
                            "confidence": 0.4, "confirm_confidence": None, "analysis": "progressing",
                            "model": "judge", "tokens": 900})
    await writer.close()


async def test_queries_filters_paging_and_stats(database_url):
    engine = await migrated(database_url)
    await _seed(database_url)
    items, cursor = await queries.list_detections(engine, queries.DetectionFilter(), limit=2)
    assert [i["id"] for i in items] == [5, 4] and cursor == "4"
    items, cursor = await queries.list_detections(engine, queries.DetectionFilter(), limit=2, cursor=cursor)
    assert [i["id"] for i in items] == [3, 2] and cursor == "2"
    items, cursor = await queries.list_detections(engine, queries.DetectionFilter(), limit=2, cursor=cursor)
    assert [i["id"] for i in items] == [1] and cursor is None

    async def select_ids(**where) -> list[int]:
        found, _ = await queries.list_detections(engine, queries.DetectionFilter(**where), limit=100)
        return [i["id"] for i in found]

    assert await select_ids(session="alpha") == [3, 2, 1]
    assert await select_ids(type="content") == [4]
    assert await select_ids(action="warned") == [5, 2, 1]
    assert await select_ids(tenant="t2") == [5]
    assert await select_ids(since=queries.parse_since("1h")) == [5, 4, 3, 2]
    with pytest.raises(queries.QueryError):
        await select_ids(type="nonsense")

    result = await queries.stats(engine)
    assert result["detections"] == 5
    assert result["by_type"]["tool_call"] == 3 and result["by_action"]["cut"] == 1
    assert result["sessions_affected"] == 3
    assert result["average_turns_before_detection"] == round((5 + 2 + 9) / 3, 1)
    # Warned tasks: t-a (stopped later), t-b (cut, then moved on), t-c (never answered): 1 of 3 recovered.
    assert (result["warned_tasks"], result["recovered_tasks"], result["recovery_rate"]) == (3, 1, 0.333)
    assert [i["recovered"] for i in (await queries.list_detections(engine, queries.DetectionFilter(
        session="beta")))[0]] == [True]
    assert result["tokens_saved_estimate"] == 4200
    assert (result["judge_checks"], result["judge_tokens"]) == (1, 900)
    assert (await queries.stats(engine, tenant="t2"))["detections"] == 1

    sessions = await queries.list_sessions(engine)
    assert {(s["session_id"], s["detections"]) for s in sessions} == {("alpha", 3), ("beta", 1), ("gamma", 1)}
    (timeline,) = await queries.session_timeline(engine, "alpha")
    assert [e["kind"] for e in timeline["timeline"]].count("judge_check") == 1
    assert [e.get("action") for e in timeline["timeline"] if e["kind"] == "detection"] == [
        "warned", "warned", "stopped"]
    assert await queries.session_timeline(engine, "alpha", tenant="t2") == []
    await engine.dispose()


def test_parse_since():
    now = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
    assert queries.parse_since("1h", now) == datetime(2026, 11, 22, 11, 0)
    assert queries.parse_since("30m", now) == datetime(2026, 11, 22, 11, 30)
    assert queries.parse_since("2026-11-01T00:00+00:00") == datetime(2026, 11, 1)
    for bad in ("yesterday", "1y", "2026-13-01"):
        with pytest.raises(queries.QueryError):
            queries.parse_since(bad)


async def test_controls_and_judge_checks_reach_every_replica(database_url):
    await asyncio.to_thread(run_migrations, database_url)
    first, second = Store(database_url), Store(database_url)
    await first.start()
    await second.start()
    first.writer.session_seen("tenant-a", "shared", 8, None)
    first.writer.session_seen("tenant-b", "shared", 3, None)
    changed = await first.set_controls("shared", "tenant-a", disabled=True)
    assert changed == [{"tenant": "tenant-a", "session_id": "shared", "disabled": True, "reset_at_message": 0}]
    assert first.controls("tenant-a", "shared").disabled  # at once on this replica
    assert not first.controls("tenant-b", "shared").disabled  # another tenant's session of that name
    await second.refresh()
    assert second.controls("tenant-a", "shared").disabled
    assert not second.controls("tenant-b", "shared").disabled

    await first.set_controls("shared", None, reset=True, known_counts={("tenant-b", "shared"): 5})
    await second.refresh()
    assert second.controls("tenant-a", "shared").reset_at_message == 8
    assert second.controls("tenant-b", "shared").reset_at_message == 5

    first.record_judge_check("tenant-a", "shared", JudgeCheck("task1", 30, 0.95, None, "circling"), "judge", 500)
    await first.writer.flush()
    await second.refresh()
    assert second.judge_checks("tenant-a", "shared", "task1") == [JudgeCheck("task1", 30, 0.95, None, "circling")]
    assert await first.set_controls("no-such-session", None, disabled=True) == []
    await first.close()
    await second.close()


async def test_judge_checks_in_memory_are_bounded(database_url, monkeypatch):
    """The verdicts the request path reads are kept for the latest judged sessions, each its latest checks; a
    fresh replica loads no more of the log than that."""
    monkeypatch.setattr("proxy.store.store.JUDGED_SESSIONS", 3)
    monkeypatch.setattr("proxy.store.store.CHECKS_PER_SESSION", 4)
    await asyncio.to_thread(run_migrations, database_url)
    store = Store(database_url)
    await store.start()
    for turn in range(10):
        store.record_judge_check("t", "long", JudgeCheck("task", turn, 0.2, None, "progress"), "judge", 10)
    assert [c.turn for c in store.judge_checks("t", "long", "task")] == [6, 7, 8, 9]
    for n in range(3):
        store.record_judge_check("t", f"other-{n}", JudgeCheck("task", 1, 0.2, None, "progress"), "judge", 10)
    assert store.judge_checks("t", "long", "task") == []  # the least recently judged session went
    assert store.judge_checks("t", "other-0", "task") != []
    await store.writer.flush()
    fresh = Store(database_url)
    await fresh.start()
    loaded = [(session, check.turn) for session in ("long", "other-0", "other-1", "other-2")
              for check in fresh.judge_checks("t", session, "task")]
    assert loaded == [("other-0", 1), ("other-1", 1), ("other-2", 1)]  # the three newest rows of 13
    await store.close()
    await fresh.close()


async def test_detections_past_their_retention_are_deleted_in_small_batches(database_url):
    engine = await migrated(database_url)
    store = Store(database_url)  # writes the rows; it keeps all, so its own maintenance deletes none meanwhile
    await store.start()
    old = utcnow() - timedelta(days=31)
    for n in range(25):
        store.writer.add_detection(detection(n, created_at=old - timedelta(minutes=n)))
    for n in range(25, 30):
        store.writer.add_detection(detection(n, created_at=utcnow() - timedelta(days=29)))
    await store.writer.flush()
    pruner = Store(database_url, detection_retention_days=30)  # not started: this prune is the only one
    assert await pruner.prune_detections(batch=10) == 25  # three transactions: 10, 10, 5
    async with engine.connect() as connection:
        kept = (await connection.execute(select(Detection.episode_key).order_by(Detection.id))).scalars().all()
    assert kept == [f"key-{n}" for n in range(25, 30)]
    assert await store.prune_detections() == 0  # unset: keep all
    await pruner.engine.dispose()
    await store.close()
    await engine.dispose()
