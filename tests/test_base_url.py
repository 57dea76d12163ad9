"""A client whose base URL is off by a `/v1` is told how to fix it, in its own dialect's error shape, and never
passed through unwatched; every error the proxy gives on a route is in that route's dialect shape. Real
clients (openai, anthropic) against a real server, in front of the scripted upstream."""

from __future__ import annotations

import logging

import aiohttp
import anthropic
import openai
import pytest

from tests.test_log_api import _free_port

ASK = [{"role": "user", "content": "list the files"}]


def _misdirected(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "loopwarden.server" and "base URL is off" in record.getMessage()]


async def test_claude_code_with_a_base_url_ending_in_v1_is_told_to_drop_it_and_nothing_goes_by_unwatched(
        upstream, proxy_factory, caplog):
    """ANTHROPIC_BASE_URL=http://HOST:PORT/v1 makes the client post /v1/v1/messages: a 404 in Anthropic's shape
    naming the fix, nothing sent upstream, one warning line however many requests (at most one a minute)."""
    proxy = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.root)
    client = anthropic.AsyncAnthropic(base_url=proxy.root + "/v1", api_key="sk-ant-x", max_retries=0)
    caplog.set_level(logging.WARNING, logger="loopwarden")
    for _ in range(3):
        with pytest.raises(anthropic.NotFoundError) as raised:
            await client.messages.create(model="claude-x", max_tokens=100, messages=ASK)
    await client.close()
    body = raised.value.body
    assert body["type"] == "error" and set(body) == {"type", "error"}
    error = body["error"]
    assert error["type"] == "not_found_error"
    assert f"ANTHROPIC_BASE_URL={proxy.root} without /v1" in error["message"]
    assert error["message"].startswith("/v1/v1/messages is /v1/messages with one /v1 too many")
    assert upstream.requests == []
    assert len(_misdirected(caplog)) == 1


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_openai_base_url_with_v1_twice_is_told_to_give_it_once(upstream, proxy, api):
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as raised:
        if api == "chat":
            await client.chat.completions.create(model="m", messages=ASK)
        else:
            await client.responses.create(model="m", input="list the files")
    await client.close()
    error = raised.value.body
    assert error["code"] == "wrong_base_url" and error["type"] == "invalid_request_error"
    assert f"base URL (OPENAI_BASE_URL, base_url) to {proxy.url}, with /v1 once" in error["message"]
    assert upstream.requests == []


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_openai_base_url_without_v1_is_told_to_add_it(upstream, proxy, caplog, api):
    """Before, a bare 404 with nothing in the log."""
    caplog.set_level(logging.WARNING, logger="loopwarden")
    client = openai.AsyncOpenAI(base_url=proxy.root, api_key="sk-x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as raised:
        if api == "chat":
            await client.chat.completions.create(model="m", messages=ASK)
        else:
            await client.responses.create(model="m", input="list the files")
    await client.close()
    error = raised.value.body
    assert error["code"] == "wrong_base_url"
    assert error["message"].startswith(f"/{'chat/completions' if api == 'chat' else 'responses'} is /v1/")
    assert "its /v1 missing" in error["message"] and f"to {proxy.url}, with /v1 once" in error["message"]
    assert upstream.requests == []
    assert len(_misdirected(caplog)) == 1


async def test_a_gemini_base_url_ending_in_v1_is_told_in_googles_shape(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}/v1/v1beta/models/gemini-2.5-pro:generateContent",
                             json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
                             headers={"x-goog-api-key": "g-x"}) as response:
            assert response.status == 404
            body = await response.json()
    assert set(body) == {"error"} and body["error"]["status"] == "NOT_FOUND"
    assert f"GOOGLE_GEMINI_BASE_URL={proxy.root} without a version" in body["error"]["message"]
    assert upstream.requests == []


async def test_an_unreachable_anthropic_upstream_is_a_502_in_anthropics_shape(upstream, proxy_factory):
    """Before, the 502 on /v1/messages came in OpenAI's shape, which the Anthropic SDKs do not read."""
    dead = f"http://127.0.0.1:{_free_port()}"
    proxy = await proxy_factory(upstream.url, anthropic_upstream_url=dead)
    client = anthropic.AsyncAnthropic(base_url=proxy.root, api_key="sk-ant-x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as raised:
        await client.messages.create(model="claude-x", max_tokens=100, messages=ASK)
    await client.close()
    assert raised.value.status_code == 502
    assert raised.value.body == {"type": "error", "error": {"type": "upstream_error",
                                                             "message": raised.value.body["error"]["message"]}}
    assert f"upstream {dead} unreachable" in raised.value.body["error"]["message"]


async def test_the_proxys_own_errors_on_a_dialects_routes_are_in_its_shape(upstream, proxy_factory):
    """A body over the limit on /v1/messages and on a Gemini route, and an unreachable Gemini upstream."""
    dead = f"http://127.0.0.1:{_free_port()}"
    proxy = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.root, gemini_upstream_url=dead,
                                max_body_bytes=1000)
    big = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "x" * 2000}]}
    gemini = f"{proxy.root}/v1beta/models/gemini-2.5-pro:generateContent"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}/v1/messages", json=big, headers={"x-api-key": "k"}) as response:
            assert response.status == 413
            assert (await response.json())["type"] == "error"
        async with http.post(gemini, json={"contents": [{"parts": [{"text": "x" * 2000}]}]}) as response:
            assert response.status == 413
            assert set((await response.json())["error"]) == {"code", "message", "status", "details"}
        async with http.post(gemini, json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
                             headers={"x-goog-api-key": "g"}) as response:
            assert response.status == 502
            error = (await response.json())["error"]
            assert set(error) == {"code", "message", "status", "details"} and "unreachable" in error["message"]
