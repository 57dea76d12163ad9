"""What a request leaves behind once answered: nothing that only a garbage collection would free.

The server freezes its heap at start and collects rarely (`cli._settle_heap`), so a request whose objects form
a reference cycle keeps its body alive long after it is answered: a client sending large bodies could then run
the proxy out of memory before any collection comes. Each request's objects must be freed by reference counting
alone, in every dialect, streamed or not, warned, stopped or relayed as it came.
"""

from __future__ import annotations

import gc

import aiohttp
import openai
import pytest

from tests.agent import Agent
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
