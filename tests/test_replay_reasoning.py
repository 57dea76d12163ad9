"""`loopwarden replay` sees what the proxy sees: the reasoning a recorded assistant turn carries, in each API's
shape. The same conversation is driven through a live proxy in observe mode (in front of the scripted upstream)
and then replayed from the body the client sent, with the answer it got; both give the same episodes, whether
the answer came streamed (the chant where the stream would have been cut) or whole (the next request warned)."""

from __future__ import annotations

import json

import aiohttp
import orjson
import pytest

from proxy.config import build
from proxy.conversation import Message
from proxy.detect.engine import DetectConfig
from proxy.replay import _record, replay
from proxy.wire.chat import ChatDialect
from proxy.wire.gemini import GeminiDialect
from proxy.wire.messages import MessagesDialect
from proxy.wire.responses import ResponsesDialect
from proxy.wire.sse import SSEParser
from tests.conftest import with_ladder_of_five
from tests.fake_upstream import Turn
from tests.test_served_episodes import logged

# A model adding two columns that falls into printing the answer over and over: a two-character unit for 30,000
# characters, in the reasoning only (the answer itself is a tool call).
REASONING = "The first column sums to 40 and the second to 2, so the total is " + "42" * 15000
PROMPT = "Add the first two columns of data.csv and tell me the total."
RESULT = "a,b\n40,2\n"


class Chat:
    dialect = ChatDialect()
    path = "/v1/chat/completions"
    headers = {"Authorization": "Bearer sk-test-1"}

    def __init__(self, field: str = "reasoning_content") -> None:
        self.field = field

    def body(self, items: list, stream: bool) -> dict:
        return {"model": "deepseek-reasoner", "messages": items, "stream": stream,
                "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]}

    @staticmethod
    def user(text: str) -> list:
        return [{"role": "user", "content": text}]

    def assistant(self, reasoning: str, answer: Message) -> list:
        calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for c in answer.calls]
        return [{"role": "assistant", "content": answer.text or None, self.field: reasoning,
                 **({"tool_calls": calls} if calls else {})}]

    @staticmethod
    def result(answer: Message, text: str) -> list:
        return [{"role": "tool", "tool_call_id": answer.calls[0].id, "content": text}]


class Responses:
    dialect = ResponsesDialect()
    path = "/v1/responses"
    headers = {"Authorization": "Bearer sk-test-1"}
    field = "reasoning_text"

    @staticmethod
    def body(items: list, stream: bool) -> dict:
        return {"model": "gpt-oss-120b", "input": items, "stream": stream, "store": False}

    @staticmethod
    def user(text: str) -> list:
        return [{"role": "user", "content": text}]

    @staticmethod
    def assistant(reasoning: str, answer: Message) -> list:
        items: list[dict] = [{"type": "reasoning", "id": "rs_1", "summary": [],
                              "content": [{"type": "reasoning_text", "text": reasoning}]}]
        if answer.text:
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": answer.text}]})
        items += [{"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
                  for c in answer.calls]
        return items

    @staticmethod
    def result(answer: Message, text: str) -> list:
        return [{"type": "function_call_output", "call_id": answer.calls[0].id, "output": text}]


class Messages:
    dialect = MessagesDialect()
    path = "/v1/messages"
    headers = {"x-api-key": "sk-ant-1", "anthropic-version": "2023-06-01"}
    field = "reasoning_content"

    @staticmethod
    def body(items: list, stream: bool) -> dict:
        return {"model": "claude-sonnet-5-5", "max_tokens": 8000, "messages": items, "stream": stream,
                "thinking": {"type": "enabled", "budget_tokens": 6000}}

    @staticmethod
    def user(text: str) -> list:
        return [{"role": "user", "content": text}]

    @staticmethod
    def assistant(reasoning: str, answer: Message) -> list:
        blocks: list[dict] = [{"type": "thinking", "thinking": reasoning, "signature": "sig-EqQBCkgIARAB"}]
        if answer.text:
            blocks.append({"type": "text", "text": answer.text})
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)}
                   for c in answer.calls]
        return [{"role": "assistant", "content": blocks}]

    @staticmethod
    def result(answer: Message, text: str) -> list:
        return [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": answer.calls[0].id,
                                              "content": text}]}]


class Gemini:
    dialect = GeminiDialect()
    headers = {"x-goog-api-key": "gemini-key-1"}
    field = "reasoning_content"

    @staticmethod
    def route(stream: bool) -> str:
        return "/v1beta/models/gemini-test:" + ("streamGenerateContent?alt=sse" if stream else "generateContent")

    @staticmethod
    def body(items: list, stream: bool) -> dict:
        return {"contents": items, "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}

    @staticmethod
    def user(text: str) -> list:
        return [{"role": "user", "parts": [{"text": text}]}]

    @staticmethod
    def assistant(reasoning: str, answer: Message) -> list:
        parts: list[dict] = [{"text": reasoning, "thought": True}]
        if answer.text:
            parts.append({"text": answer.text})
        parts += [{"functionCall": {"name": c.name, "args": json.loads(c.arguments)}} for c in answer.calls]
        return [{"role": "model", "parts": parts}]

    @staticmethod
    def result(answer: Message, text: str) -> list:
        return [{"role": "user", "parts": [{"functionResponse": {"name": answer.calls[0].name,
                                                                  "response": {"result": text}}}]}]


DIALECTS = {"chat reasoning_content": Chat(), "chat reasoning": Chat("reasoning"), "responses": Responses(),
            "messages": Messages(), "gemini": Gemini()}


def answer_of(api, raw: bytes, streamed: bool) -> Message:
    """The assistant's turn as the client got it (its calls' ids, to send their results back)."""
    if not streamed:
        return api.dialect.answer(orjson.loads(raw))
    assembler = api.dialect.stream()
    for event in SSEParser().feed(raw):
        if event.data != b"[DONE]":
            assembler.add(orjson.loads(event.data), event.event)
    return assembler.message()


async def drive(proxy, api, session: str, streamed: bool) -> dict:
    """Two turns through the proxy, as an agent sends them: a read whose reasoning chants, then the answer. The
    record: the client's last request body, with the answer it got."""
    items = api.user(PROMPT)
    answers = []
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            body = api.body(items, streamed)
            path = api.route(streamed) if isinstance(api, Gemini) else api.path
            async with http.post(proxy.root + path, data=orjson.dumps(body),
                                 headers={**api.headers, "X-Loopwarden-Session": session,
                                          "Content-Type": "application/json"}) as response:
                assert response.status == 200, await response.text()
                answers.append(answer_of(api, await response.read(), streamed))
            if len(answers) == 1:
                items = items + api.assistant(REASONING, answers[0]) + api.result(answers[0], RESULT)
    record = api.body(items + api.assistant("Both columns read; adding them.", answers[1]), streamed)
    return {**record, "stream": True} if streamed else record


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("name", sorted(DIALECTS))
async def test_replay_finds_the_reasoning_chant_the_live_proxy_logs_in_observe_mode(upstream, proxy_factory, name,
                                                                                    streamed):
    api = DIALECTS[name]
    proxy = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.root, gemini_upstream_url=upstream.root,
                                mode="observe")
    upstream.script += [Turn(thinking=REASONING, thinking_chars=40, reasoning_field=api.field,
                             tool_calls=[("read_file", {"path": "data.csv"})]),
                        Turn(content="The total is 42.", chunk_chars=6)]
    session = f"replayed-{name}-{streamed}".replace(" ", "-")
    record = await drive(proxy, api, session, streamed)
    live = [(r["turn"], r["type"], r["action"], r["episode"], r["detail"].get("channel"))
            for r in await logged(proxy, session, 1)]
    assert live == [(1, "content", "cut" if streamed else "warned", 1, "reasoning")]

    config = DetectConfig.from_settings(build(with_ladder_of_five({"mode": "observe"}), environ={}))
    replayed = replay(config, _record(orjson.loads(orjson.dumps(record)), f"{name}:1")).episodes
    assert [(e["turn"], e["type"], e["action"], e["episode"], e["detail"].get("channel")) for e in replayed] == live
