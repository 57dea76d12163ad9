"""Upstream faults beyond a single bad answer: a storm of 5xx, compressed answers the proxy did not ask
for, a 50 MB answer. For each, what the client gets, and that the proxy is well for the next request."""

from __future__ import annotations

import gzip
import hashlib

import aiohttp
import openai
import orjson
import pytest

from tests.agent import Agent
from tests.fake_upstream import Turn

CHAT = {"model": "m", "messages": [{"role": "user", "content": "go"}]}


def completion(content: str | None = None, calls=()) -> dict:
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                  "function": {"name": name, "arguments": orjson.dumps(args).decode()}}
                                 for i, (name, args) in enumerate(calls)]
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


async def healthy(proxy, upstream) -> None:
    upstream.script.append(Turn(content="still here"))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", json=CHAT) as response:
            assert response.status == 200
            assert (await response.json())["choices"][0]["message"]["content"] == "still here"
        async with http.get(f"{proxy.root}/metrics") as response:
            assert "loopwarden_open_streams 0.0" in await response.text()


async def test_a_storm_of_5xx_passes_through_and_leaves_the_proxy_well(upstream, proxy):
    async with aiohttp.ClientSession() as http:
        for n in range(200):
            if n % 2:
                upstream.script.append(Turn(status=503, error={"error": {"message": "overloaded", "type": "server_error",
                                                                         "param": None, "code": "overloaded"}}))
            else:
                upstream.script.append(Turn(status=502, raw_body=b"<html><body>Bad gateway</body></html>",
                                            headers={"Content-Type": "text/html"}))
            async with http.post(f"{proxy.url}/chat/completions", json={**CHAT, "stream": n % 3 == 0}) as response:
                body = await response.json()
                assert response.status == (503 if n % 2 else 502)
                assert body["error"]["message"] == ("overloaded" if n % 2 else "<html><body>Bad gateway</body></html>")
    await healthy(proxy, upstream)


async def test_a_gzip_answer_it_did_not_ask_for_reaches_the_client_and_is_still_read(upstream, proxy):
    agent = Agent(proxy.url)  # the openai client decodes gzip
    for _ in range(6):
        upstream.script.append(Turn(raw_body=gzip.compress(orjson.dumps(completion(calls=[("ls", {})]))),
                                    headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}))
        message = await agent.turn()
        assert message["tool_calls"][0]["function"]["name"] == "ls"
        agent.answer("a.py")
    # The proxy read the compressed answers too: the loop is warned like any other.
    assert agent.last_headers["x-loopwarden-warning"] == "1/2 tool_call"
    await agent.close()
    await healthy(proxy, upstream)


async def test_a_compressed_stream_is_relayed_untouched(upstream, proxy):
    events = b"".join(b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": f"part {i} "}, "finish_reason": None}]}) + b"\n\n" for i in range(50))
    body = gzip.compress(events + b"data: [DONE]\n\n")
    upstream.script.append(Turn(raw_body=body, headers={"Content-Type": "text/event-stream",
                                                        "Content-Encoding": "gzip"}))
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(f"{proxy.url}/chat/completions", json={**CHAT, "stream": True}) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            assert await response.read() == body
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-x", max_retries=0)
    upstream.script.append(Turn(raw_body=body, headers={"Content-Type": "text/event-stream",
                                                        "Content-Encoding": "gzip"}))
    stream = await client.chat.completions.create(model="m", messages=CHAT["messages"], stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == "".join(f"part {i} " for i in range(50))
    await client.close()
    await healthy(proxy, upstream)


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_50_mb_answer_arrives_whole(upstream, proxy, streamed, caplog):
    if streamed:  # 50 MB of text that never repeats (a repeating one would be cut as chanting)
        def chunk(i: int) -> bytes:
            text = "".join(hashlib.sha256(f"{i}:{j}".encode()).hexdigest() for j in range(16))
            return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"content": text}, "finish_reason": None}]}) + b"\n\n"
        answer = b"".join(chunk(i) for i in range(50 * 1024 * 1024 // len(chunk(0)))) + b"data: [DONE]\n\n"
        headers = {"Content-Type": "text/event-stream"}
    else:
        answer = orjson.dumps(completion("".join(f"{i:08d} " for i in range(50 * 1024 * 1024 // 9))))
        headers = {"Content-Type": "application/json"}
    upstream.script.append(Turn(raw_body=answer, headers=headers))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", json={**CHAT, "stream": streamed}) as response:
            received = await response.read()
    assert response.status == 200 and len(received) == len(answer) and received == answer
    # Not streamed, it is larger than what is read of an answer: relayed as it came, and the log says so.
    relayed_unread = [r.getMessage() for r in caplog.records if "relayed uninspected" in r.getMessage()]
    assert len(relayed_unread) == (0 if streamed else 1)
    await healthy(proxy, upstream)


async def test_an_upstream_that_stalls_mid_stream_ends_the_stream_with_an_error(upstream, proxy_factory):
    """Headers sent, then silence longer than UPSTREAM_READ_TIMEOUT: the client gets the stream so far and
    an error event (the SDK raises), and the proxy serves the next request."""
    running = await proxy_factory(upstream.url, upstream_read_timeout=0.3)
    upstream.script.append(Turn(content="a sentence that never ends", chunk_chars=5, delay=1.0))
    client = openai.AsyncOpenAI(base_url=running.url, api_key="sk-test", max_retries=0)
    stream = await client.chat.completions.create(model="m", messages=CHAT["messages"], stream=True)
    with pytest.raises(openai.APIError) as caught:
        async for _ in stream:
            pass
    assert "upstream" in str(caught.value.message)
    await client.close()
    await healthy(running, upstream)
