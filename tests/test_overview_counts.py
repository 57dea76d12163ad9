"""The overview's counts kept as the log is written (proxy/store/rollup.py), on SQLite and a real PostgreSQL:
what `stats` and the timeline answer from them is what the detections say, however the rows came (in
batches, as duplicates from two replicas at once, with recoveries marked later, written by another tool,
pruned by the retention)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import timedelta
from itertools import accumulate

from sqlalchemy import delete, insert, select

from proxy.store import queries, rollup
from proxy.store.database import create_engine, run_migrations
from proxy.store.models import CountBucket, Detection, OutcomeBucket, SessionCount, TaskOutcome
from proxy.store.store import Store
from proxy.store.writer import LogWriter, utcnow
from tests.test_store import detection, migrated

TYPES = list(queries.TYPES)


def expected(rows: list, since=None, tenant=None) -> dict:
    """The overview's figures computed from the detections themselves."""
    rows = [r for r in rows if tenant is None or r.tenant == tenant]
    period = [r for r in rows if since is None or r.created_at >= since]
    enforced = [r for r in period if r.enforced]
    firsts = [r.turn for r in enforced if r.episode == 1]
    tasks: dict[tuple, list] = {}
    for r in rows:  # a task's whole story; it counts in the period of its last detection
        tasks.setdefault((r.tenant, r.session_id, r.task, r.enforced), []).append(r)
    warned = recovered = stopped_observed = 0
    for (_, _, _, is_enforced), story in tasks.items():
        if since is not None and max(r.created_at for r in story) < since:
            continue
        warnings = [r.episode for r in story if r.action in ("warned", "cut")]
        moved_on = [r.episode for r in story if r.action in ("warned", "cut") and r.recovered]
        stopped = any(r.action == "stopped" for r in story)
        if is_enforced:
            warned += bool(warnings)
            recovered += bool(warnings) and not stopped and max(moved_on, default=None) == max(warnings)
        else:
            stopped_observed += stopped
    return {
        "detections": len(enforced),
        "by_type": {t: sum(r.type == t for r in enforced) for t in TYPES},
        "by_action": {**{a: sum(r.action == a for r in enforced) for a in ("warned", "stopped", "cut")},
                      **({"late": late} if (late := sum(r.action == "late" for r in enforced)) else {})},
        "sessions_affected": len({(r.tenant, r.session_id) for r in enforced}),
        "average_turns_before_detection": round(sum(firsts) / len(firsts), 1) if firsts else None,
        "warned_tasks": warned,
        "recovered_tasks": recovered,
        "tokens_saved_estimate": sum(r.tokens_saved_estimate for r in enforced),
        "observed_detections": sum(not r.enforced for r in period),
        "would_have_stopped_tasks": stopped_observed,
    }


def reported(stats: dict) -> dict:
    keys = ("detections", "by_type", "by_action", "sessions_affected", "average_turns_before_detection",
            "warned_tasks", "recovered_tasks", "tokens_saved_estimate")
    return {**{k: stats[k] for k in keys}, "observed_detections": stats["observed"]["detections"],
            "would_have_stopped_tasks": stats["observed"]["would_have_stopped_tasks"]}


async def all_rows(engine) -> list:
    async with engine.connect() as connection:
        return (await connection.execute(select(Detection))).all()


async def kept_counts(engine) -> dict:
    """The four tables' rows, without rows that count nothing."""
    tables = {}
    async with engine.connect() as connection:
        for table, counts in ((CountBucket, ("detections",)), (TaskOutcome, ()), (SessionCount, ()),
                              (OutcomeBucket, ("warned_tasks", "recovered_tasks", "stopped_tasks", "sessions"))):
            rows = (await connection.execute(select(table))).all()
            tables[table.__tablename__] = sorted(
                tuple(row) for row in rows if not counts or any(getattr(row, name) for name in counts))
    return tables


async def assert_counts_equal_a_rebuild(engine) -> None:
    kept = await kept_counts(engine)
    async with engine.begin() as connection:
        await connection.execute(delete(CountBucket))
        assert await rollup.rebuild(connection, engine.dialect.name)
    assert await kept_counts(engine) == kept


def story(rng: random.Random, now, tasks: int = 40) -> list[tuple[dict, bool]]:
    """Tasks over three days (a quarter in the last hour), each warned one to three times, some stopped,
    some in observe mode; with whether the model moved on from each warning."""
    events = []
    for n in range(tasks):
        tenant, session = f"tenant-{n % 3}", f"session-{n % 11}"
        enforced = n % 5 != 0
        began = now - timedelta(seconds=rng.randint(60, 3600 if n % 4 == 1 else 3 * 86400))  # some just now
        warnings = rng.randint(1, 3)
        for episode in range(1, warnings + 2):
            action = "warned" if episode <= warnings else rng.choice(["stopped", None])
            if action is None:
                break
            if episode == 1 and rng.random() < 0.2:
                action = "cut"
            at = min(began + timedelta(seconds=rng.randint(1, 1200) * episode), now)
            events.append((detection(
                len(events), created_at=at, tenant=tenant, session_id=session, task=f"task-{n}",
                type=rng.choice(TYPES), action=action, episode=episode, turn=rng.randint(3, 40),
                model=rng.choice(["gpt-a", "gpt-b", None]), enforced=enforced,
                tokens_saved_estimate=rng.choice([0, 500, 2000]), episode_key=f"ep-{n}-{episode}"),
                action != "stopped" and rng.random() < 0.5))
    return events


async def write(writer: LogWriter, events, rng: random.Random) -> None:
    """In several batches; a recovery marked while its warning is buffered, or after it is written."""
    for values, moved_on in events:
        writer.add_detection(dict(values))
        if rng.random() < 0.3:
            await writer.flush()
        if moved_on:
            writer.add_recovery({"b_tenant": values["tenant"], "b_session_id": values["session_id"],
                                 "b_task": values["task"], "b_episode": values["episode"]})
    await writer.flush()


async def test_stats_and_timeline_from_the_counts_are_what_the_rows_say(database_url):
    engine = await migrated(database_url)
    rng = random.Random(7)
    now = utcnow()
    writer = LogWriter(database_url)
    writer.start()
    await write(writer, story(rng, now), rng)
    await write(writer, story(random.Random(7), now)[:30], rng)  # a replica's duplicates: nothing new
    await writer.close()
    rows = await all_rows(engine)
    assert len(rows) == len(story(random.Random(7), now))
    on_a_bucket = rollup.bucket_start(rollup.bucket_of(now - timedelta(days=1)))
    for since in (None, now - timedelta(days=2, seconds=7), now - timedelta(hours=5, microseconds=3), on_a_bucket,
                  now - timedelta(minutes=3), now + timedelta(minutes=1)):
        for tenant in (None, "tenant-1"):
            result = await queries.stats(engine, since, tenant)
            assert reported(result) == expected(rows, since, tenant), (since, tenant)
    assert sum((await queries.stats(engine))["by_model"].values()) == sum(r.enforced for r in rows)

    # The timeline: each detection in its span or, when its five-minute bucket starts in the span before,
    # that one; so every running total is between the rows' own and the next span's.
    for since, filters in ((now - timedelta(days=2, seconds=7), {}), (None, {"type": "tool_cycle"}),
                           (now - timedelta(hours=30), {"tenant": "tenant-2", "enforced": True}),
                           (now - timedelta(hours=1), {"action": "warned"})):
        where = queries.DetectionFilter(since=since, **filters)
        result = await queries.timeline(engine, where, buckets=48, now=now)
        assert result["bucket_seconds"] >= rollup.MINUTE
        start = queries.parse_since(result["start"].replace("Z", "+00:00"))
        matching = [r for r in rows if (since is None or r.created_at >= since)
                    and all(getattr(r, name) == value for name, value in filters.items())]
        assert len(matching) >= 3
        for kind in TYPES:
            exact = Counter(min(int((r.created_at - start).total_seconds()) // result["bucket_seconds"], 47)
                            for r in matching if r.type == kind)
            exact_running = list(accumulate(exact.get(i, 0) for i in range(48)))
            running = list(accumulate(result["series"][kind]))
            assert running[-1] == exact_running[-1] == sum(r.type == kind for r in matching)
            assert all(exact_running[i] <= running[i] <= exact_running[min(i + 1, 47)] for i in range(48))
    # Spans under a minute are read from the rows, exactly.
    since = now - timedelta(minutes=30)
    short = await queries.timeline(engine, queries.DetectionFilter(since=since), now=now)
    assert sum(r.created_at >= since for r in rows) >= 3
    assert short["bucket_seconds"] == 38
    for kind in TYPES:
        exact = Counter(int((r.created_at - since).total_seconds()) // 38
                        for r in rows if r.created_at >= since and r.type == kind)
        assert short["series"][kind] == [exact.get(i, 0) for i in range(48)]

    await assert_counts_equal_a_rebuild(engine)
    await engine.dispose()


async def test_two_replicas_writing_one_tasks_at_once_count_each_episode_once(database_url):
    """Both replicas write the same episodes (one inserts them) and later ones of the same tasks and sessions
    at the same moment: the counts are those a rebuild from the rows gives."""
    engine = await migrated(database_url)
    now = utcnow()
    events = story(random.Random(11), now, tasks=60)
    writers = [LogWriter(database_url), LogWriter(database_url)]
    for writer in writers:
        writer.start()
    await asyncio.gather(*(write(writer, events, random.Random(seed)) for seed, writer in enumerate(writers)))
    for writer in writers:
        await writer.close()
    rows = await all_rows(engine)
    assert len(rows) == len(events)
    assert reported(await queries.stats(engine)) == expected(rows)
    await assert_counts_equal_a_rebuild(engine)
    await engine.dispose()


async def test_two_replicas_adding_to_the_same_tasks_at_the_same_moment(database_url):
    """Each round both replicas write one more episode of the same 40 tasks and flush together: on
    PostgreSQL the two transactions change the same task rows at once."""
    engine = await migrated(database_url)
    now = utcnow()
    writers = [LogWriter(database_url), LogWriter(database_url)]
    for writer in writers:
        writer.start()
    for round_ in range(6):
        for side, writer in enumerate(writers):
            episode = 2 * round_ + side + 1
            for n in range(40):
                writer.add_detection(detection(
                    n, created_at=now - timedelta(hours=12 - round_, minutes=side * 7), tenant="t",
                    session_id=f"session-{n % 4}", task=f"task-{n}", episode=episode,
                    action="stopped" if round_ == 5 and side == 1 and n % 2 else "warned",
                    recovered=bool((n + side) % 3), episode_key=f"{n}-{episode}"))
        await asyncio.gather(*(writer.flush() for writer in writers))
    for writer in writers:
        await writer.close()
    rows = await all_rows(engine)
    assert len(rows) == 6 * 2 * 40
    assert reported(await queries.stats(engine)) == expected(rows)
    await assert_counts_equal_a_rebuild(engine)
    await engine.dispose()


async def test_rows_written_by_another_tool_are_counted_after_a_rebuild(database_url, caplog):
    engine = await migrated(database_url)
    now = utcnow()
    async with engine.begin() as connection:  # a restore, or a script: not through the writer
        await connection.execute(insert(Detection), [
            {**detection(n, created_at=now - timedelta(minutes=n)), "recovered": False, "enforced": True}
            for n in range(12)])
    assert (await queries.stats(engine))["detections"] == 0
    store = Store(database_url)
    assert await store.check_counts()
    assert "overview counts hold 0 of 12 detections" in caplog.text
    assert reported(await queries.stats(engine)) == expected(await all_rows(engine))
    assert not await store.check_counts()  # whole now: nothing to do
    await store.close()
    await engine.dispose()


async def test_an_existing_log_is_counted_by_the_upgrade(database_url):
    """A log written before the counts existed (migration 0005) is whole after `loopwarden migrate`."""
    await asyncio.to_thread(run_migrations, database_url, "0005")
    engine = create_engine(database_url)
    now = utcnow()
    async with engine.begin() as connection:
        await connection.execute(insert(Detection), [
            {**values, "recovered": moved_on, "enforced": values.get("enforced", True)}
            for values, moved_on in story(random.Random(3), now)])
    await asyncio.to_thread(run_migrations, database_url)
    rows = await all_rows(engine)
    for since in (None, now - timedelta(hours=20, seconds=13)):
        assert reported(await queries.stats(engine, since)) == expected(rows, since)
    async with engine.connect() as connection:
        assert await rollup.consistent(connection) == (len(rows), len(rows))
    await engine.dispose()


async def test_retention_takes_pruned_rows_out_of_the_counts(database_url):
    engine = await migrated(database_url)
    now = utcnow()
    store = Store(database_url, detection_retention_days=1)
    store.writer.start()  # and no poll: its first round would prune (and check the counts) while this writes
    events = story(random.Random(5), now)  # three days of tasks: about two thirds are past the retention
    await write(store.writer, events, random.Random(5))
    assert await store.prune_detections(batch=7) > 0
    rows = await all_rows(engine)
    assert rows and all(r.created_at >= now - timedelta(days=1, minutes=5) for r in rows)
    async with engine.connect() as connection:
        assert await rollup.consistent(connection) == (len(rows), len(rows))
    assert reported(await queries.stats(engine)) == expected(rows)
    await assert_counts_equal_a_rebuild(engine)
    await store.close()
    await engine.dispose()


async def test_figures_say_they_are_not_whole_until_a_restart_rebuilds_the_counts(upstream, proxy_factory,
                                                                                  database_url, monkeypatch, capsys):
    """Detections written beside the counts (a restore, an older replica): stats and the timeline say
    `complete: false` (the API and the CLI), never partial figures as if whole; a replica started on that
    log rebuilds the counts at once, then the figures are whole and right."""
    from proxy.cli import main
    from proxy.store import store as store_module

    monkeypatch.setattr(store_module, "CHECK_COUNTS_EVERY", 3600.0)  # only at start, here
    monkeypatch.setattr(store_module, "COMPLETE_FOR", 0.0)
    import aiohttp

    first = await proxy_factory(upstream.url, database_url=database_url)
    engine = create_engine(database_url)
    try:
        now = utcnow()
        written = 5_000
        async with engine.begin() as connection:
            await connection.execute(insert(Detection), [
                {**detection(n, created_at=now - timedelta(seconds=n)), "recovered": False, "enforced": True}
                for n in range(written)])

        async def overview(proxy) -> tuple[dict, dict]:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{proxy.root}/loopwarden/api/stats") as response:
                    stats = await response.json()
                async with http.get(f"{proxy.root}/loopwarden/api/timeline", params={"since": "1d"}) as response:
                    return stats, await response.json()

        for _ in range(100):  # the running replica's next look at the counts (made in the background) finds out
            stats, timeline = await overview(first)
            if not stats["complete"]:
                break
            await asyncio.sleep(0.02)
        assert (stats["complete"], timeline["complete"], stats["detections"]) == (False, False, 0)
        assert await asyncio.to_thread(main, ["stats", "--database-url", database_url, "--format", "json"]) == 0
        assert '"complete": false' in capsys.readouterr().out
        second = await proxy_factory(upstream.url, database_url=database_url)  # a restart: counts rebuilt at start
        for _ in range(200):
            stats, timeline = await overview(second)
            if stats["complete"]:
                break
            await asyncio.sleep(0.05)
        assert stats["complete"] and timeline["complete"] and stats["detections"] == written
        assert sum(sum(series) for series in timeline["series"].values()) == written
        for _ in range(100):  # every replica agrees, at its next look
            stats, _ = await overview(first)
            if stats["complete"]:
                break
            await asyncio.sleep(0.02)
        assert stats["complete"] and stats["detections"] == written
    finally:  # disposed whatever happens, so a failure here leaks no connection into later tests
        await engine.dispose()
