"""Evidence strength through the proxy, in each dialect: weak evidence (different calls meeting one error) warns
but never stops a task; strong evidence (the same call failing the same way) still stops it. An agent's requests
sent one after another, each carrying the whole conversation, through a real server in front of the fake
upstream, with the default ladder (3: warned at the 3rd and 4th repeat, stopped at the 5th)."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

UNKNOWN = "Error: tool 'search_code' does not exist. Available tools: read_file, edit, run_tests."
FAILING = "FAILED tests/test_calc.py::test_add - assert -1 == 5\n1 failed, 11 passed in 0.05s"
# Weak: a tool that does not exist, asked something new each time. Strong: the same test run failing alike.
WEAK = [("search_code", {"query": q}, UNKNOWN) for q in ("parser", "Parser class", "def parse", "parse(",
                                                         "tokenize", "Lexer", "grammar", "ast node")]
STRONG = [("run_tests", {"path": "tests/test_calc.py"}, FAILING)] * 5


def chat(steps):
    items = []
    for n, (name, args, result) in enumerate(steps):
        call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}
        items += [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": f"c{n}", "content": result}]
    return {"model": "m", "messages": [{"role": "system", "content": "You fix bugs."},
                                       {"role": "user", "content": "Fix the parser bug."}, *items]}


def responses(steps):
    items = []
    for n, (name, args, result) in enumerate(steps):
        items += [{"type": "function_call", "call_id": f"c{n}", "name": name, "arguments": orjson.dumps(args).decode()},
                  {"type": "function_call_output", "call_id": f"c{n}", "output": result}]
    return {"model": "m", "instructions": "You fix bugs.",
            "input": [{"type": "message", "role": "user", "content": "Fix the parser bug."}, *items]}


def messages(steps):
    items = []
    for n, (name, args, result) in enumerate(steps):
        items += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"c{n}", "name": name, "input": args}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"c{n}", "content": result,
                                                "is_error": True}]}]
    return {"model": "claude-test", "max_tokens": 100, "system": "You fix bugs.",
            "messages": [{"role": "user", "content": "Fix the parser bug."}, *items]}


def gemini(steps):
    items = []
    for name, args, result in steps:
        items += [{"role": "model", "parts": [{"functionCall": {"name": name, "args": args}}]},
                  {"role": "user", "parts": [{"functionResponse": {"name": name, "response": {"output": result}}}]}]
    return {"contents": [{"role": "user", "parts": [{"text": "Fix the parser bug."}]}, *items],
            "systemInstruction": {"parts": [{"text": "You fix bugs."}]}}


DIALECTS = {  # body, path, headers
    "chat": (chat, "/v1/chat/completions", {"Authorization": "Bearer k"}),
    "responses": (responses, "/v1/responses", {"Authorization": "Bearer k"}),
    "messages": (messages, "/v1/messages", {"x-api-key": "k", "anthropic-version": "2023-06-01"}),
    "gemini": (gemini, "/v1beta/models/gemini-test:generateContent", {"x-goog-api-key": "k"}),
}


async def run(proxy, dialect: str, steps) -> list[tuple[int, str]]:
    """The agent's request after each step: (status, the warning header or the loop the stop names)."""
    body, path, headers = DIALECTS[dialect]
    answers = []
    async with aiohttp.ClientSession(headers={**headers, "Content-Type": "application/json"}) as client:
        for end in range(1, len(steps) + 1):
            async with client.post(proxy.root + path, data=orjson.dumps(body(steps[:end]))) as answer:
                await answer.read()
                answers.append((answer.status, answer.headers.get("X-Loopwarden-Warning")
                                or answer.headers.get("X-Loopwarden-Loop", "")))
    return answers


@pytest.fixture
async def every_dialect(upstream, proxy_factory):
    return await proxy_factory(upstream.url, tool_call_threshold=3,
                               anthropic_upstream_url=upstream.url.removesuffix("/v1"),
                               gemini_upstream_url=upstream.root)


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_weak_evidence_warns_but_never_stops_a_task(every_dialect, dialect):
    answers = await run(every_dialect, dialect, WEAK)
    assert [status for status, _ in answers] == [200] * len(WEAK)
    assert [warned for _, warned in answers] == ["", "", "1/2 tool_error", "2/2 tool_error"] + [
        f"{k} (past 2) tool_error" for k in range(3, 7)]  # warnings past the two allowed, not read as a stop


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_strong_evidence_still_stops_a_task(every_dialect, dialect):
    answers = await run(every_dialect, dialect, STRONG)
    assert answers == [(200, ""), (200, ""), (200, "1/2 tool_call"), (200, "2/2 tool_call"), (400, "tool_call")]
