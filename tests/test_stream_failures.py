"""An upstream that breaks off mid-stream, between two events or in the middle of a line: in every dialect the
client gets whole events, then an error event of its own that its SDK raises as its API error (never a JSON
decoding error, never a truncated answer passed off as whole), and the proxy serves the next request."""

from __future__ import annotations

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors, types

from tests.fake_upstream import Turn

MESSAGES = [{"role": "user", "content": "tell me a story"}]
LONG = "a long answer that goes on " * 30
POSITIONS = pytest.mark.parametrize("mid_line", [False, True], ids=["between-events", "mid-line"])


def broken(mid_line: bool, after: int) -> Turn:
    return Turn(content=LONG, chunk_chars=6, drop_after=after, drop_mid_line=mid_line, keepalive=False)


@POSITIONS
async def test_chat_completions(upstream, proxy, mid_line):
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    upstream.script.append(broken(mid_line, 6))
    received = ""
    with pytest.raises(openai.APIError) as caught:
        async for chunk in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            received += chunk.choices[0].delta.content or "" if chunk.choices else ""
    assert "upstream connection failed mid-response" in caught.value.message
    assert received and LONG.startswith(received)  # what came before the break, whole
    upstream.script.append(Turn(content="next"))
    assert (await client.chat.completions.create(model="m", messages=MESSAGES)).choices[0].message.content == "next"
    await client.close()


@POSITIONS
async def test_responses(upstream, proxy, mid_line):
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    upstream.script.append(broken(mid_line, 7))
    kinds = []
    with pytest.raises(openai.APIError) as caught:
        async for event in await client.responses.create(model="m", input="tell me a story", stream=True):
            kinds.append(event.type)
    assert "upstream connection failed mid-response" in caught.value.message
    assert kinds[0] == "response.created" and "response.completed" not in kinds
    assert caught.value.body["code"] == "upstream_unreachable"
    await client.close()


@POSITIONS
async def test_messages(upstream, proxy_factory, mid_line):
    proxy = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.root)
    client = anthropic.AsyncAnthropic(base_url=proxy.root, api_key="sk-ant-test", max_retries=0)
    upstream.script.append(broken(mid_line, 6))
    with pytest.raises(anthropic.APIError) as caught:
        async with client.messages.stream(model="claude-test", max_tokens=100, messages=MESSAGES) as stream:
            async for _ in stream:
                pass
    assert "upstream connection failed mid-response" in caught.value.message
    upstream.script.append(Turn(content="next"))
    answer = await client.messages.create(model="claude-test", max_tokens=100, messages=MESSAGES)
    assert answer.content[0].text == "next"
    await client.close()


@POSITIONS
async def test_gemini(upstream, proxy_factory, mid_line):
    proxy = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    client = genai.Client(api_key="gemini-key-1", http_options=types.HttpOptions(
        base_url=proxy.root, api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)))
    upstream.script.append(broken(mid_line, 3))
    with pytest.raises(genai_errors.APIError) as caught:
        async for _ in await client.aio.models.generate_content_stream(model="gemini-test", contents="a story"):
            pass
    assert "upstream connection failed mid-response" in caught.value.message
    upstream.script.append(Turn(content="next"))
    answer = await client.aio.models.generate_content(model="gemini-test", contents="a story")
    assert answer.text == "next"
