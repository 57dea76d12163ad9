"""The transparent proxy, through the real openai client: nothing an agent can notice changes."""

from __future__ import annotations

import asyncio
import gzip
import re
import socket

import aiohttp
import openai
import orjson
import pytest

from proxy.wire import known
from tests.fake_upstream import Turn
from tests.test_fuzz import send_raw

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
MESSAGES = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the bug."}]


def clients(base_url: str):
    return (openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0),
            openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0))


def comparable(completion) -> dict:
    message = completion.choices[0].message
    return {
        "content": message.content,
        "tool_calls": [(c.function.name, c.function.arguments) for c in message.tool_calls or []],
        "finish_reason": completion.choices[0].finish_reason,
        "usage": completion.usage.model_dump() if completion.usage else None,
        "model": completion.model,
    }


def turn() -> Turn:
    return Turn(content="I'll read the file — naïve café ✓.",
                tool_calls=[("read_file", {"path": "src/app.py", "lines": [1, 20]}), ("ls", {"dir": "."})])


async def test_non_streaming_equals_direct_sync_and_async(upstream, proxy):
    direct_sync, direct_async = clients(upstream.url)
    via_sync, via_async = clients(proxy.url)
    results = []
    for client in (direct_sync, via_sync):
        upstream.script.append(turn())
        results.append(await asyncio.to_thread(client.chat.completions.create, model="m", messages=MESSAGES,
                                               tools=TOOLS))
    for client in (direct_async, via_async):
        upstream.script.append(turn())
        results.append(await client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS))
        await client.close()
    first = comparable(results[0])
    assert first["tool_calls"][0] == ("read_file", '{"path":"src/app.py","lines":[1,20]}')
    assert all(comparable(r) == first for r in results[1:])
    # The upstream received the request as the client sent it.
    assert upstream.chat_requests[0] == upstream.chat_requests[1]


async def _collect_stream(stream) -> dict:
    text, calls, usage, finish = [], {}, None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", ""])
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return {"text": "".join(text), "calls": [tuple(calls[i]) for i in sorted(calls)], "usage": usage,
            "finish": finish}


async def test_streaming_equals_direct_with_tool_calls_and_usage(upstream, proxy):
    results = []
    for base in (upstream.url, proxy.url):
        client = openai.AsyncOpenAI(base_url=base, api_key="sk-test", max_retries=0)
        upstream.script.append(turn())
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, stream=True,
                                                      stream_options={"include_usage": True})
        results.append(await _collect_stream(stream))
        await client.close()
    assert results[0] == results[1]
    assert results[0]["calls"] == [("read_file", '{"path":"src/app.py","lines":[1,20]}'), ("ls", '{"dir":"."}')]
    assert results[0]["usage"]["total_tokens"] > 0
    assert results[0]["finish"] == "tool_calls"


async def test_stream_bytes_reach_the_client_unchanged(upstream, proxy):
    prose = "".join(f"Step {i} touches module_{i}.py and nothing else. " for i in range(12))
    upstream.script.append(Turn(content=prose, chunk_chars=3, tool_calls=[("f", {"k": "v" * 40})]))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions",
                             json={"model": "m", "messages": MESSAGES, "stream": True,
                                   "stream_options": {"include_usage": True}}) as response:
            received = await response.read()
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert response.headers["x-request-id"].startswith("req-")
    assert received == bytes(upstream.streams[-1].body)
    assert b": keep-alive" in received


async def test_sync_streaming_through_proxy(upstream, proxy):
    upstream.script.append(Turn(content="Hello from the stream.", chunk_chars=2))
    client = openai.OpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)

    def consume():
        with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    assert await asyncio.to_thread(consume) == "Hello from the stream."
    client.close()


async def test_upstream_error_passes_through_with_status_body_and_headers(upstream, proxy):
    body = {"error": {"message": "Rate limit reached", "type": "requests", "param": None,
                      "code": "rate_limit_exceeded"}}
    upstream.script.append(Turn(status=429, error=body, headers={"retry-after": "7", "x-request-id": "req-429"}))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", json={"model": "m", "messages": MESSAGES}) as r:
            assert r.status == 429
            assert await r.json() == body
            assert r.headers["retry-after"] == "7"
            assert r.headers["x-request-id"] == "req-429"
    upstream.script.append(Turn(status=429, error=body))
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.code == "rate_limit_exceeded"
    await client.close()


async def test_passthrough_models_embeddings_and_unknown_paths(upstream, proxy):
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    models = await client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    embeddings = await client.embeddings.create(model="e", input=["a", "b"])
    assert [e.index for e in embeddings.data] == [0, 1]
    await client.close()
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{proxy.url}/custom/thing?x=1&y=two", data=b"raw-bytes\x00\xff",
                            headers={"Authorization": "Bearer sk-test", "X-Custom": "yes",
                                     "Content-Type": "application/octet-stream"}) as r:
            assert r.status == 201
            assert r.headers["x-upstream-echo"] == "1"
            echoed = await r.json()
    assert echoed["method"] == "PUT"
    assert echoed["path"] == "/v1/custom/thing"
    assert echoed["query"] == "x=1&y=two"
    assert echoed["body"] == b"raw-bytes\x00\xff".decode("utf-8", "replace")
    assert echoed["headers"]["x-custom"] == "yes"
    assert echoed["headers"]["authorization"] == "Bearer sk-test"


async def _raw_get(port: int, target: str) -> tuple[int, bytes]:
    """A request sent as written: no client library resolves its `..` or re-encodes it."""
    status, _, body = await send_raw(port, ("GET", target, "", None, [], "none", b""))
    return status, body


async def test_paths_and_queries_reach_the_upstream_as_encoded_and_never_climb_out_of_v1(upstream, proxy):
    for target in ("/v1/files/a%2Fb?name=a%26b&dots=%2e%2e", "/v1/chat/completions?api-version=2024%2D10"):
        await _raw_get(proxy.port, target)
        assert upstream.requests[-1].target == target  # %2F and %26 keep their meaning
    seen = len(upstream.requests)
    for target in ("/v1/%2e%2e/%2e%2e/etc/passwd", "/v1/../../admin", "/v1/models/%2F..%2F..%2Fkeys",
                   "/v1/./models", "/v1/models/..%5C..%5Cx"):
        status, body = await _raw_get(proxy.port, target)
        assert (status, orjson.loads(body)["error"]["code"]) == (400, "invalid_path"), target
    assert len(upstream.requests) == seen


async def test_compressed_request_bodies_are_read_on_watched_paths_and_relayed_as_they_came(upstream, proxy):
    """A body the client gzipped: the watched paths read it and send it on decoded (it once went up decoded
    but still labelled gzip, and the upstream failed on it); the relayed paths pass the compressed bytes on."""
    body = orjson.dumps({"model": "m", "messages": MESSAGES})
    squeezed = gzip.compress(body)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", data=squeezed,
                             headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}) as response:
            assert response.status == 200
        sent = upstream.requests[-1]
        assert "Content-Encoding" not in sent.headers and sent.json == orjson.loads(body)
        async with http.post(f"{proxy.url}/embeddings", data=squeezed,
                             headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}) as response:
            assert response.status == 200
        sent = upstream.requests[-1]
        assert (sent.headers["Content-Encoding"], sent.headers["Content-Length"]) == ("gzip", str(len(squeezed)))
        for encoding, data, status, code in (("br", squeezed, 415, "unsupported_encoding"),
                                             ("gzip", b"not gzip", 400, "invalid_body")):
            async with http.post(f"{proxy.url}/chat/completions", data=data,
                                 headers={"Content-Type": "application/json", "Content-Encoding": encoding}) as response:
                assert (response.status, (await response.json())["error"]["code"]) == (status, code)


async def test_a_chunked_body_over_the_limit_is_413_on_every_path(upstream, proxy_factory):
    """No Content-Length to refuse it by: the size is counted as the body arrives. On a relayed path that
    once came back as a 502 upstream failure."""
    running = await proxy_factory(upstream.url, max_body_bytes=1000)

    async def chunks():
        for _ in range(10):
            yield b'{"input": "' + b"y" * 500

    async with aiohttp.ClientSession() as http:
        for path in ("/embeddings", "/chat/completions"):
            async with http.post(f"{running.url}{path}", data=chunks(),
                                 headers={"Content-Type": "application/json"}) as response:
                assert (response.status, (await response.json())["error"]["code"]) == (413, "request_too_large")


async def test_a_body_that_stops_arriving_is_answered_408(upstream, proxy_factory, monkeypatch):
    """A client that sends its head and part of its body, then nothing: answered once the idle timeout has
    passed, in the OpenAI shape, on a watched path and on a relayed one; nothing is left behind."""
    monkeypatch.setattr("proxy.server.app.CLIENT_IDLE_TIMEOUT", 0.3)
    running = await proxy_factory(upstream.url)
    before = await event_loop_tasks(running)
    for path in ("/v1/chat/completions", "/v1/embeddings"):
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n{\"model\": \"m\", ".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 408 ")
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        error = orjson.loads(await reader.readexactly(length))["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "request_timeout")
        writer.close()
        await writer.wait_closed()
    assert not any(r.path == "/v1/chat/completions" for r in upstream.requests)
    for _ in range(50):
        if await event_loop_tasks(running) <= before:
            break
        await asyncio.sleep(0.02)
    assert await event_loop_tasks(running) <= before  # none left behind (a background check may have ended)


async def test_upstream_api_key_replaces_client_authorization(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, upstream_api_key="sk-real")
    client = openai.AsyncOpenAI(base_url=running.url, api_key="sk-client", max_retries=0)
    await client.chat.completions.create(model="m", messages=MESSAGES)
    await client.close()
    assert upstream.requests[-1].headers["Authorization"] == "Bearer sk-real"


async def _post(url: str, data: bytes, content_type: str = "application/json"):
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=data, headers={"Content-Type": content_type}) as r:
            return r.status, await r.json()


@pytest.mark.parametrize(
    "data, content_type, status, code",
    [
        (b"{not json", "application/json", 400, "invalid_json"),
        (b"", "application/json", 400, "invalid_json"),
        (b"[1, 2]", "application/json", 400, "invalid_json"),
        (b'{"model": "m", "messages": "hi"}', "application/json", 400, "invalid_value"),
        (b'{"model": "m", "messages": []}', "text/plain", 400, "invalid_content_type"),
    ],
)
async def test_bad_requests_get_openai_errors_and_never_reach_upstream(upstream, proxy, data, content_type,
                                                                       status, code):
    got_status, body = await _post(f"{proxy.url}/chat/completions", data, content_type)
    assert got_status == status
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == code
    assert upstream.requests == []


async def test_body_over_the_limit_is_413(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, max_body_bytes=1000)
    status, body = await _post(f"{running.url}/chat/completions",
                               orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}))
    assert status == 413
    assert body["error"]["code"] == "request_too_large"
    status, body = await _post(f"{running.url}/embeddings", b"y" * 5000)
    assert status == 413
    assert upstream.requests == []


async def test_openai_client_sees_bad_request_error(proxy):
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.post("/chat/completions", cast_to=object, content=b"{oops",
                          options={"headers": {"Content-Type": "application/json"}})
    assert caught.value.code == "invalid_json"
    await client.close()


async def test_non_json_upstream_answers(upstream, proxy):
    upstream.script.append(Turn(raw_body=b"<html>gateway exploded</html>", status=200,
                                headers={"Content-Type": "text/html"}))
    status, body = await _post(f"{proxy.url}/chat/completions", orjson.dumps({"model": "m", "messages": MESSAGES}))
    assert (status, body["error"]["type"]) == (502, "upstream_error")
    upstream.script.append(Turn(raw_body=b"<html>bad gateway</html>", status=503,
                                headers={"Content-Type": "text/html"}))
    status, body = await _post(f"{proxy.url}/chat/completions", orjson.dumps({"model": "m", "messages": MESSAGES}))
    assert status == 503
    assert body["error"]["message"] == "<html>bad gateway</html>"


async def test_upstream_closing_mid_stream_ends_the_stream_with_an_error(upstream, proxy):
    upstream.script.append(Turn(content="a long answer " * 20, drop_after=5))
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError) as caught:
        async for _ in stream:
            pass
    assert "upstream" in str(caught.value.message)
    # The proxy keeps serving.
    answer = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert answer.choices[0].message.content == "ok"
    await client.close()


async def test_upstream_that_never_answers_is_504(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, upstream_read_timeout=0.3)
    upstream.script.append(Turn(hang=True))
    status, body = await _post(f"{running.url}/chat/completions", orjson.dumps({"model": "m", "messages": MESSAGES}))
    assert status == 504
    assert body["error"]["code"] == "upstream_timeout"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_unreachable_upstream_is_502(proxy_factory):
    running = await proxy_factory(f"http://127.0.0.1:{_closed_port()}/v1")
    status, body = await _post(f"{running.url}/chat/completions", orjson.dumps({"model": "m", "messages": MESSAGES}))
    assert status == 502
    assert body["error"] == {"message": body["error"]["message"], "type": "upstream_error", "param": None,
                             "code": "upstream_unreachable"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.url}/models") as r:
            assert r.status == 502
        async with http.get(f"{running.root}/healthz") as r:
            assert (r.status, await r.json()) == (200, {"status": "ok"})


async def test_client_going_away_stops_the_upstream_read(upstream, proxy):
    prose = "".join(f"Sentence {i} is about file_{i * 7}.py. " for i in range(100))
    upstream.script.append(Turn(content=prose, chunk_chars=5, delay=0.01))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions",
                             json={"model": "m", "messages": MESSAGES, "stream": True}) as r:
            await r.content.readany()
    for _ in range(100):
        await asyncio.sleep(0.02)
        if upstream.streams and not upstream.streams[-1].completed and upstream.streams[-1].sent < 100:
            break
    record = upstream.streams[-1]
    await asyncio.sleep(0.2)
    assert not record.completed
    assert record.sent < record.planned / 2


async def event_loop_tasks(proxy) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.root}/metrics") as response:
        return float(re.search(r"^loopwarden_event_loop_tasks (\S+)$", await response.text(), re.M).group(1))


async def test_clients_that_leave_leave_no_task_behind(upstream, proxy):
    """Clients leaving mid-stream, before the upstream answers, and while sending their body: within a second
    the proxy's event loop holds as many tasks as before (the gauge /metrics shows operators)."""
    before = await event_loop_tasks(proxy)
    prose = "".join(f"Sentence {i} is about file_{i * 7}.py. " for i in range(100))
    body = orjson.dumps({"model": "m", "messages": MESSAGES, "stream": True})
    for _ in range(5):
        upstream.script.append(Turn(content=prose, chunk_chars=5, delay=0.01))
    for _ in range(5):
        upstream.script.append(Turn(content="late", latency=5.0))
    async with aiohttp.ClientSession() as http:
        for _ in range(5):  # mid-stream
            response = await http.post(f"{proxy.url}/chat/completions", data=body,
                                       headers={"Content-Type": "application/json"})
            await response.content.readany()
            response.close()
        waiting = [asyncio.create_task(http.post(f"{proxy.url}/chat/completions", json={"model": "m",
                                                                                         "messages": MESSAGES}))
                   for _ in range(5)]
        await asyncio.sleep(0.3)
        assert await event_loop_tasks(proxy) >= before + 5  # the proxy is waiting on the upstream for them
        for task in waiting:  # before the upstream answers
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    for _ in range(5):  # while sending the body: a head promising more than comes
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n{\"model\": \"m\", \"messages\": [")
        await writer.drain()
        writer.close()
    for _ in range(50):
        if await event_loop_tasks(proxy) <= before:
            break
        await asyncio.sleep(0.02)
    assert await event_loop_tasks(proxy) <= before  # none left behind (a background check may have ended)


async def test_unknown_route_is_openai_shaped_404(proxy):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/nope") as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "not_found"


async def test_a_target_that_is_no_path_is_openai_shaped_404(proxy):
    """`OPTIONS *` and `CONNECT host:port` name no path a route could take: answered in the OpenAI shape too."""
    for target in ("OPTIONS *", "CONNECT example.com:443"):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            writer.write(f"{target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 404 "), (target, head)
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
            error = orjson.loads(await reader.readexactly(length))["error"]
            assert (error["type"], error["code"]) == ("invalid_request_error", "not_found"), target
        finally:
            writer.close()
            await writer.wait_closed()


async def test_a_method_a_path_does_not_take_is_openai_shaped_405(proxy):
    async with aiohttp.ClientSession() as http:
        async with http.delete(f"{proxy.root}/healthz") as r:
            assert r.status == 405
            assert set(r.headers["Allow"].split(",")) == {"GET", "HEAD"}
            assert (await r.json())["error"]["code"] == "method_not_allowed"
        async with http.get(f"{proxy.root}/metrics") as r:
            counted = await r.text()
    assert 'loopwarden_requests_total{route="unmatched",status="405"} 1.0' in counted


async def body_bytes(proxy) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.root}/metrics") as response:
        text = await response.text()
    return {read: float(value) for read, value in
            re.findall(r'^loopwarden_request_body_bytes_total\{read="(\w+)"\} (\S+)$', text, re.M)}


async def test_a_long_conversation_is_parsed_from_where_it_grew_and_its_loop_is_still_warned(upstream, proxy):
    """An agent resending a growing 100 KB+ history: each request goes upstream as the very bytes sent, only
    its new part is parsed (where the scanner is compiled), and the loop at its end is warned as ever."""
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    messages = list(MESSAGES)
    warned_headers, client_bodies = [], []
    try:
        for step in range(40):
            path = f"src/module_{step}.py" if step < 34 else "src/config.py"  # then the same read, again and again
            messages += [{"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{step}", "type": "function",
                "function": {"name": "read_file", "arguments": orjson.dumps({"path": path}).decode()}}]},
                {"role": "tool", "tool_call_id": f"call_{step}",
                 "content": f"# {path}\n" + "def handler(request):\n    return respond(request)\n" * 60}]
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=messages, extra_headers={"X-Loopwarden-Session": "long-one"})
            warned_headers.append(raw.headers.get("X-Loopwarden-Warning"))
            client_bodies.append(raw.http_request.content)
    finally:
        await client.close()
    bodies = [r.body for r in upstream.requests
              if r.path == "/v1/chat/completions" and "X-Loopwarden-Judge" not in r.headers]
    assert len(bodies) == len(client_bodies) and len(bodies[-1]) > 100_000
    warned = [n for n, header in enumerate(warned_headers) if header]
    assert warned == [38, 39]  # the 5th and 6th identical reads (this proxy runs the ladder of five)
    for n, body in enumerate(bodies):
        if n not in warned:
            assert body == client_bodies[n]  # as the client sent it, byte for byte
        else:  # each warning spliced in at its place (the last after the last result), the rest as sent
            forwarded = orjson.loads(body)["messages"]
            assert [m for m in forwarded if not str(m["content"]).startswith("[loopwarden] ")] == \
                orjson.loads(client_bodies[n])["messages"]
            assert forwarded[-1]["content"].startswith("[loopwarden] ")
            assert body.startswith(client_bodies[n][:client_bodies[n].index(b'"call_34"')])
    read = await body_bytes(proxy)
    assert read["parsed"] + read["known"] == sum(len(body) for body in client_bodies)
    if known.member is not None:  # most of each long body was known from the request before
        assert read["known"] > 0.8 * sum(len(body) for body in client_bodies if len(body) >= known.LONG_BODY)
    else:
        assert read["known"] == 0
