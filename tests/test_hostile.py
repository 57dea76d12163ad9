"""What a client cannot do: skip detection by spelling a watched path another way or by posing as the judge,
or have headers it names in `Connection` sent on upstream."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.test_log_api import same_calls

BODY = orjson.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1//chat/completions", "/v1/chat%2fcompletions",
                                  "/v1/responses/", "/v1//messages", "/v1beta/models/gemini-test:generateContent/"])
async def test_another_spelling_of_a_watched_path_is_refused_not_relayed(upstream, proxy, path):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}{path}", data=BODY,
                             headers={"Content-Type": "application/json"}) as answer:
            body = await answer.json()
    assert answer.status == 400 and body["error"]["code"] == "invalid_path"
    assert upstream.requests == []


async def test_a_client_posing_as_the_judge_is_inspected_like_any_other(upstream, proxy):
    agent = Agent(proxy.url, headers={"X-Loopwarden-Judge": "1", "X-Loopwarden-Session": "forged"})
    await same_calls(agent, upstream, 6)
    assert "[loopwarden] Loop detected (1/2)" in orjson.dumps(upstream.chat_requests[-1]).decode()
    await agent.close()


async def test_headers_named_in_connection_stay_on_this_hop(upstream, proxy):
    upstream.script.append(Turn(content="ok"))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", data=BODY, headers={
                "Content-Type": "application/json", "Connection": "keep-alive, X-Hop-Secret",
                "X-Hop-Secret": "for the proxy only", "X-Kept": "yes"}) as answer:
            assert answer.status == 200
    (sent,) = upstream.requests
    assert "X-Hop-Secret" not in sent.headers and sent.headers["X-Kept"] == "yes"
