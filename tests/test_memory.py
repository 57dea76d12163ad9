"""What a request leaves behind once answered: nothing that only a garbage collection would free.

The server freezes its heap at start and collects rarely (`cli._settle_heap`), so a request whose objects form
a reference cycle keeps its body alive long after it is answered: a client sending large bodies could then run
the proxy out of memory before any collection comes. Each request's objects must be freed by reference counting
alone, in every dialect, streamed or not, warned, stopped or relayed as it came.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from types import SimpleNamespace

import aiohttp
import openai
import orjson
import pytest

from proxy.config import build
from proxy.inspection import Forward, Incoming, Inspector
from proxy.lru import LRU
from proxy.wire import known
from proxy.wire.chat import ChatDialect
from tests.agent import Agent
from tests.convo import assistant, conversation, step, steps, user
from tests.fake_upstream import Turn

LARGE = 400_000  # characters: far above anything the proxy allocates for itself
# The request path's own types: none of them may outlive its request in a cycle.
REQUEST_TYPES = {"Exchange", "ExchangeSink", "Flow", "Forward", "Stop", "Tap", "TapOrders", "Parsed", "Incoming",
                 "KnownBody", "Served", "ResponseWatcher", "Conversation"}


def cyclic_garbage() -> list:
    """What only a collection would free now (the objects themselves, kept for the test to look at)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    return found


def left_behind(garbage: list) -> tuple[list[str], list[int]]:
    """The request path's objects and the large strings and bytes among what a collection would free."""
    types = sorted({type(o).__name__ for o in garbage if type(o).__name__ in REQUEST_TYPES})
    large = [len(o) for o in garbage if isinstance(o, (str, bytes, bytearray)) and len(o) >= LARGE // 2]
    large += [len(v) for o in garbage if isinstance(o, dict) for v in o.values()
              if isinstance(v, (str, bytes)) and len(v) >= LARGE // 2]
    return types, large


@pytest.fixture
def no_collections():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_answered_requests_leave_no_cycle_holding_their_bodies(upstream, proxy_factory, no_collections):
    proxy = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.root,
                                gemini_upstream_url=upstream.root)
    big = "x" * LARGE
    async with aiohttp.ClientSession() as http:
        cyclic_garbage()  # what the fixtures' start-up left
        for n, stream in enumerate((False, True, False, True)):
            upstream.script.append(Turn(content="done"))
            body = {"model": f"m-{n}-{big}", "stream": stream,
                    "messages": [{"role": "user", "content": f"task {n}: {big}"}]}
            async with http.post(f"{proxy.url}/chat/completions", json=body,
                                 headers={"Authorization": "Bearer sk-a"}) as answer:
                assert answer.status == 200
                await answer.read()
        for path, body in (
                ("/v1/messages", {"model": "claude-test", "max_tokens": 100, "stream": True,
                                  "messages": [{"role": "user", "content": big}]}),
                ("/v1/responses", {"model": "gpt-test", "input": big}),
                ("/v1beta/models/gemini-test:generateContent", {"contents": [{"role": "user",
                                                                              "parts": [{"text": big}]}]})):
            upstream.script.append(Turn(content="done"))
            async with http.post(f"{proxy.root}{path}", json=body, headers={
                    "x-api-key": "sk-b", "anthropic-version": "2023-06-01", "x-goog-api-key": "sk-b"}) as answer:
                assert answer.status == 200, await answer.text()
                await answer.read()
        types, large = left_behind(cyclic_garbage())
    assert types == [] and large == []


async def test_warned_and_stopped_requests_leave_no_cycle(upstream, proxy, no_collections):
    agent = Agent(proxy.url, headers={"X-Session-Id": "memory-loop"})
    cyclic_garbage()
    stopped = False
    for _ in range(8):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        try:
            await agent.turn()
        except openai.BadRequestError as refused:
            assert refused.code == "loop_detected"
            stopped = True
            break
        agent.answer("x" * LARGE)
    assert stopped and agent.last_headers.get("x-loopwarden-warning") == "2/2 tool_call"
    await agent.close()
    types, large = left_behind(cyclic_garbage())
    assert types == [] and large == []


# -- what each per-session memory holds, against what its bound counts -----------------------------------------

# Tasks of many steps, in the shapes that leave the most in a task state: each a new call, most answered by a
# distinct error; long errors; parallel calls.
LONG_TASKS = {
    "distinct errors": lambda n, session: conversation(user(f"Fix the build of service {session}."), *[
        step(f"tool_{k % 7}", {"path": f"src/m{k}.py", "line": k}, f"Error: E{k}: no such symbol s{k} in m{k}"
             if k % 3 else f"content of m{k}") for k in range(n)]),
    "long errors": lambda n, session: conversation(user(f"Fix the tests of service {session}."), *[
        step("run", {"cmd": f"make t{k}"}, "Error: " + f"failure {k} " * 500) for k in range(n)]),
    "parallel calls": lambda n, session: conversation(user(f"Survey service {session}."), *[
        steps([(f"t{j}", {"p": f"{k}-{j}"}, f"Error: bad {k} {j}") for j in range(8)]) for k in range(n)]),
    # A customer asking again while the agent answers alike: the task before each message is kept, should the
    # next take it up again (a person's turns).
    "a person's turns": lambda n, session: conversation(user(f"Update reservation {session}."), *[
        part for k in range(n) for part in (
            step("update_reservation", {"card": "card-" + chr(97 + k % 26) + chr(97 + k // 26 % 26)},
                 "Error: the payment method was rejected"),
            assistant("I could not update it. Could you confirm the payment method?"),
            user("Please use the card I gave, " + chr(97 + k % 26) + chr(97 + k // 26 % 26) + "."))]),
}


def freed_by(clear) -> int:
    """Bytes freed by `clear()`, as tracemalloc traces them."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    clear()
    gc.collect()
    return before - tracemalloc.get_traced_memory()[0]


@pytest.mark.parametrize("steps_per_session", [40, 300])
@pytest.mark.parametrize("shape", list(LONG_TASKS))
def test_what_session_memories_hold_is_within_what_their_bound_counts(shape, steps_per_session):
    inspector = Inspector(build({}, environ={}), None)
    sink = SimpleNamespace(episode=lambda *a, **k: None, recovery=lambda *a, **k: None)
    tracemalloc.start()
    try:
        for session in range(4):
            messages = LONG_TASKS[shape](steps_per_session, session)
            for grown in (len(messages) // 2, len(messages)):  # seen first, then grown through the cache
                payload = {"model": "m", "messages": messages[:grown]}
                verdict = inspector.inspect(Incoming({"X-Session-Id": f"s{session}"}, orjson.dumps(payload),
                                                     payload, ChatDialect()), sink)
                assert isinstance(verdict, Forward)
                del verdict, payload
        counted = inspector._sessions.held
        held = freed_by(inspector._sessions.clear)
    finally:
        tracemalloc.stop()
    assert held <= counted <= 5 * held, (held, counted)  # never under, and not so far over that it keeps few


def test_each_memory_bounded_by_bytes_forgets_its_oldest_past_its_budget():
    kept = LRU(100, 10_000, lambda key, value: len(value))
    for n in range(30):
        kept.put(n, "x" * 1000)
    assert kept.held == sum(len(v) for v in kept.values()) <= 10_000 and list(kept) == list(range(20, 30))
    kept.put(29, "x" * 5000)  # put again, weighed again
    assert kept.held == sum(len(v) for v in kept.values()) <= 10_000 and 29 in kept and 20 not in kept
    kept.put("huge", "x" * 20_000)  # larger than the whole budget: not kept at all
    assert "huge" not in kept and kept.held == 0 and len(kept) == 0


async def test_metrics_show_what_each_cache_holds(upstream, proxy):
    history = conversation(user("Summarise the logs."), *[step("read", {"p": k}, "line " * 40) for k in range(300)])
    upstream.script.append(Turn(content="done"))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", json={"model": "m", "messages": history},
                             headers={"X-Session-Id": "long"}) as answer:
            assert answer.status == 200
        async with http.get(f"{proxy.root}/metrics") as answer:
            text = await answer.text()
    held = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("loopwarden_cache_bytes{")}
    assert set(held) == {"request_bodies", "sessions", "kept_calls", "responses", "latest_responses", "judge_checks"}
    body = len(orjson.dumps({"model": "m", "messages": history}))
    assert held["sessions"] > 300 * 1024  # the session's steps
    if known.member is None:  # without the compiled scanner every body is parsed whole: none is remembered
        assert held["request_bodies"] == 0
    else:
        assert held["request_bodies"] > body  # the long body


async def test_the_keys_known_to_have_sessions_are_bounded_and_a_forgotten_one_is_found_again(tmp_path, monkeypatch):
    from proxy.store import store as store_module
    from proxy.store.database import run_migrations

    monkeypatch.setattr(store_module, "KNOWN_TENANTS", 5)
    database = f"sqlite+aiosqlite:///{tmp_path}/tenants.db"
    await asyncio.to_thread(run_migrations, database)
    store = store_module.Store(database)
    await store.start()
    try:
        for n in range(50):  # a client drawing a new key for every request
            store.session_seen(f"tenant-{n:02d}", "s", 2, "m")
        assert len(store._tenants) == 5
        await store.writer.flush()
        assert await store.tenant_known("tenant-00")  # forgotten here, found in the log
        assert not await store.tenant_known("tenant-never")
    finally:
        await store.close()
