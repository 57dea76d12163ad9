"""Deep nesting, wherever a client puts it, is a 400 in the dialect's error shape, never a 500; and the
conversation is not broken for good (arguments nested deep inside a string are compared as sent)."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.fake_upstream import Turn


MARKER = "@@deep@@"  # where the deep value goes: orjson writes at most 255 levels, so it is spliced in as text


def deep_text(depth: int) -> str:
    return "[" * depth + "]" * depth


def chat(depth: int, in_string: bool) -> tuple[str, dict]:
    arguments = deep_text(depth) if in_string else orjson.dumps({"a": "b"}).decode()
    body = {"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    if not in_string:
        body["metadata"] = MARKER
    return "/v1/chat/completions", body


def responses(depth: int, in_string: bool) -> tuple[str, dict]:
    call = {"type": "function_call", "call_id": "c1", "name": "f",
            "arguments": deep_text(depth) if in_string else "{}"}
    body = {"model": "m", "input": [{"role": "user", "content": "go"}, call,
                                   {"type": "function_call_output", "call_id": "c1", "output": "ok"}]}
    if not in_string:
        body["input"][0]["content"] = [{"type": "input_text", "text": "go", "extra": MARKER}]
    return "/v1/responses", body


def messages(depth: int, in_string: bool) -> tuple[str, dict]:
    value = deep_text(depth) if in_string else MARKER
    body = {"model": "m", "max_tokens": 10, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "go"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                                            "input": {"v": value}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                       "content": "ok"}]}]}
    return "/v1/messages", body


DIALECTS = {"chat": chat, "responses": responses, "messages": messages}


def error_shape(dialect: str, body: dict) -> str:
    if dialect == "messages":
        assert body["type"] == "error"
        return body["error"]["type"]
    return body["error"]["type"]


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest.mark.parametrize("depth", [260, 1_000, 10_000])
async def test_deep_nesting_in_the_body_is_never_a_500(upstream, proxy_factory, dialect, depth):
    """Past what JSON is read here (1,024 levels), or where the proxy reads it (a tool call's input), a 400 in
    the dialect's shape; in a field the proxy does not read, the body goes on as it came, for the upstream to
    judge."""
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url.removesuffix("/v1"))
    path, body = DIALECTS[dialect](depth, in_string=False)
    upstream.script.append(Turn(content="done"))
    async with aiohttp.ClientSession() as http:
        raw = orjson.dumps(body).decode().replace(f'"{MARKER}"', '{"k": ' + deep_text(depth - 1) + "}")
        async with http.post(running.root + path, data=raw.encode(),
                             headers={"Content-Type": "application/json"}) as response:
            answer = await response.json()
    read_here = dialect == "messages"  # the deep value is a tool call's input
    if depth > 1_000 or read_here:
        assert response.status == 400, answer
        assert error_shape(dialect, answer) == "invalid_request_error"
        assert upstream.requests == []
    else:
        assert response.status == 200, answer
        assert upstream.requests[0].body == raw.encode()  # byte for byte


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest.mark.parametrize("depth", [260, 1_000, 10_000])
async def test_arguments_nested_deep_inside_a_string_are_relayed(upstream, proxy_factory, dialect, depth):
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url.removesuffix("/v1"))
    path, body = DIALECTS[dialect](depth, in_string=True)
    async with aiohttp.ClientSession() as http:
        for _ in range(2):  # the next request carries the same history: still served
            upstream.script.append(Turn(content="done"))
            async with http.post(running.root + path, json=body) as response:
                assert response.status == 200, await response.text()
