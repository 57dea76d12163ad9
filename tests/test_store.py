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
from proxy.store.writer import LogWriter, SessionSeen, utcnow
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


async def test_writer_batches_dedupes_and_folds_session_sightings(database_url):
    engine = await migrated(database_url)
    writer = LogWriter(database_url)
    writer.start()
    for n in range(1200):
        writer.add_detection(detection(n))
    for n in range(50):
        writer.add_detection(detection(n))  # the same episodes again: one row each
    for n in range(30):
        writer.session_seen(SessionSeen("t1", "s0", n + 1, "gpt-test"))
    await writer.close()
    assert await count(engine) == 1200
    async with engine.connect() as connection:
        row = (await connection.execute(select(SessionRow))).one()
    assert (row.requests, row.message_count) == (30, 30)
    assert writer.dropped == 0
    await engine.dispose()


async def test_writer_survives_an_outage_and_counts_what_it_drops(database_url):
    await asyncio.to_thread(run_migrations, database_url)
    url = make_url(database_url)
    relay = None
    if url.get_backend_name() == "postgresql":
        relay = await TcpRelay(url.host or "127.0.0.1", url.port or 5432).start()
        url = url.set(host="127.0.0.1", port=relay.port)
    engine = create_engine(url.render_as_string(hide_password=False))
    drops: list[int] = []
    writer = LogWriter(url.render_as_string(hide_password=False), capacity=40, on_drop=drops.append)
    writer.start()
    writer.add_detection(detection(0))
    await writer.flush()
    assert await count(engine) == 1

    # The database goes away while requests keep coming: PostgreSQL behind a relay that is cut,
    # SQLite with its table gone.
    if relay is not None:
        await relay.cut()
    else:
        async with engine.begin() as connection:
            await connection.execute(text("ALTER TABLE detections RENAME TO detections_away"))
    for n in range(1, 61):
        writer.add_detection(detection(n))  # never blocks, never raises
    await asyncio.sleep(1.0)
    assert writer.pending == 40
    assert writer.dropped == 20 and sum(drops) == 20

    # It comes back: everything still buffered is written.
    if relay is not None:
        relay = TcpRelay(make_url(database_url).host or "127.0.0.1", make_url(database_url).port or 5432)
        relay.port = url.port  # the same address the engine knows
        await relay.start()
    else:
        async with engine.begin() as connection:
            await connection.execute(text("ALTER TABLE detections_away RENAME TO detections"))
    for _ in range(100):
        if writer.pending == 0:
            break
        await asyncio.sleep(0.2)
    assert writer.pending == 0
    assert await count(engine) == 41
    async with engine.connect() as connection:
        keys = set((await connection.execute(select(Detection.episode_key))).scalars())
    assert keys == {"key-0"} | {f"key-{n}" for n in range(21, 61)}  # the oldest went first
    await writer.close()
    await engine.dispose()
    if relay is not None:
        await relay.cut()


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
        writer.session_seen(SessionSeen(tenant, session, 12, "gpt-test"))
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
    first.writer.session_seen(SessionSeen("tenant-a", "shared", 8, None))
    first.writer.session_seen(SessionSeen("tenant-b", "shared", 3, None))
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
