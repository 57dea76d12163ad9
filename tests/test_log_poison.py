"""One client's odd values can never stop the detection log for everyone: values are clipped to what the
columns hold before they are queued, and a record the database still refuses is set aside (kept in
dead_letters, counted) while the rest of its batch lands. On SQLite and on PostgreSQL."""

from __future__ import annotations

import aiohttp
import orjson
from sqlalchemy import func, select

from proxy.store.database import create_engine
from proxy.store.models import DeadLetter, Detection, SessionRow
from proxy.store.writer import LogWriter, Pending, utcnow
from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.test_log_api import api, loop_until_stopped, wait_for

SENTENCE = "I will look at the configuration file one more time now. "


def detection(n: int, **overrides) -> dict:
    """A detection row as the proxy queues it."""
    return {"created_at": utcnow(), "session_id": f"s{n}", "tenant": "t1", "task": "task", "model": "gpt-test",
            "type": "tool_call", "action": "warned", "episode": 1, "episode_limit": 2, "turn": 5,
            "detail": {"tool": "read_file"}, "request_id": None, "tokens_saved_estimate": 0,
            "episode_key": f"key-{n}", "recovered": False, "enforced": True, **overrides}


async def test_poisoned_requests_leave_another_tenants_loop_logged(upstream, proxy_factory, database_url):
    running = await proxy_factory(upstream.url, database_url=database_url)
    async with aiohttp.ClientSession() as http:
        poisons = [
            # a model name longer than the column, holding NUL
            {"model": "m\u0000" * 400, "messages": [{"role": "user", "content": "hi"}]},
            # a chant cut in a stream whose max_tokens overflows every integer column
            {"model": "gpt-test", "stream": True, "max_tokens": 2**63 + 5,
             "messages": [{"role": "user", "content": "talk"}]},
        ]
        upstream.script += [Turn(content="fine"), Turn(content=SENTENCE * 30, delay=0.002)]
        for body in poisons:
            async with http.post(f"{running.url}/chat/completions", data=orjson.dumps(body),
                                 headers={"Authorization": "Bearer sk-poisoner", "Content-Type": "application/json",
                                          "X-Loopwarden-Session": "p" * 300}) as answer:
                assert answer.status == 200
                await answer.read()
        # a kept Responses answer continuing an id longer than its column, with NUL
        upstream.script.append(Turn(content="fine"))
        async with http.post(f"{running.url}/responses", data=orjson.dumps(
                {"model": "gpt-test", "input": "hi", "previous_response_id": "r\u0000" * 200}),
                headers={"Authorization": "Bearer sk-poisoner", "Content-Type": "application/json"}) as answer:
            await answer.read()
    upstream.script.clear()  # whatever the last answer did not take
    agent = Agent(running.url, api_key="sk-innocent", headers={"X-Loopwarden-Session": "innocent"})
    await loop_until_stopped(agent, upstream)
    await agent.close()

    async def logged():
        status, body = await api("GET", f"{running.root}/loopwarden/api/detections")
        sessions = {d["session_id"] for d in body.get("data", [])}
        return body["data"] if status == 200 and "innocent" in sessions and len(body["data"]) >= 4 else None

    data = await wait_for(logged)
    innocent = [(d["episode"], d["action"]) for d in data if d["session_id"] == "innocent"]
    assert innocent == [(3, "stopped"), (2, "warned"), (1, "warned")]
    cut = next(d for d in data if d["session_id"] != "innocent")
    assert cut["type"] == "content" and cut["tokens_saved_estimate"] == 2**31 - 1
    assert len(cut["session_id"]) == 256
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.root}/readyz") as ready:
            assert ready.status == 200


async def test_a_record_the_database_refuses_is_set_aside_and_the_rest_lands(database_url):
    from proxy.store.database import run_migrations
    import asyncio

    await asyncio.to_thread(run_migrations, database_url)
    rejected = []
    writer = LogWriter(database_url, on_reject=lambda: rejected.append(1))
    writer.start()

    for number in range(6):
        # one detail the database driver cannot write (not JSON): the whole batch used to be retried forever
        values = detection(number, detail={"tool": "ls"})
        if number == 3:  # a detail the driver cannot write (not JSON), past the cleaning that would mend it
            writer._add(Pending(Detection, {**values, "detail": {"bad": {1, 2}}},
                                ("t1", "s3", "task", 1)))
        else:
            writer.add_detection(values)
    await writer.flush()
    await writer.close()
    engine = create_engine(database_url)
    async with engine.connect() as connection:
        landed = (await connection.execute(select(func.count()).select_from(Detection))).scalar()
        (dead,) = (await connection.execute(select(DeadLetter))).all()
    await engine.dispose()
    assert landed == 5 and rejected == [1] and writer.rejected == 1
    assert dead.kind == "detections" and "s3" in dead.record and dead.reason
    assert SessionRow  # the sessions table is untouched by this
