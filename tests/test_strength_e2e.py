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


# -- across a person's messages ---------------------------------------------------------------------------------
# A customer-facing agent: the person writes after every answer. Weak evidence (the same reply after each of the
# person's rephrasings) warns on and never stops; strong evidence (the same failing call after each message) stops.

REPHRASE = "I'm sorry, but I couldn't understand your request. Could you please rephrase it?"
SAYS = ["Yes, please cancel it.", "I confirm, cancel the reservation.", "Yes. Go ahead.", "Please cancel it, yes.",
        "Cancel it, I said yes.", "Yes, proceed with the cancellation.", "I'm confirming the cancellation."]
REFUSED = "Error: payment amount does not add up, total price is 1203, but paid 833"
BOOKING = {"flight_number": "HAT271", "date": "2024-05-26", "payment_id": "gift_card_5094406", "amount": 833}
PUSHES = ["Yes, please book it.", "Can you try booking it again?", "Please go ahead with the booking.",
          "Yes, I still want that flight.", "Please just book it."]
PERSON_WEAK = [("user", "Hi, I want to cancel reservation EHGLP3. Yes, go ahead.")] + \
    [item for say in SAYS for item in (("reply", REPHRASE), ("user", say))]
PERSON_STRONG = [("user", "Book HAT271 on May 26 for me, please.")] + \
    [item for push in PUSHES for item in (("call", "book_reservation", BOOKING, REFUSED),
                                           ("reply", "Sorry, the booking failed. Let me try again."), ("user", push))]


def person_chat(items):
    messages = [{"role": "system", "content": "You are an airline agent."}]
    for n, item in enumerate(items):
        if item[0] == "user":
            messages.append({"role": "user", "content": item[1]})
        elif item[0] == "reply":
            messages.append({"role": "assistant", "content": item[1]})
        else:
            _, name, args, result = item
            messages += [{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{n}", "type": "function",
                          "function": {"name": name, "arguments": orjson.dumps(args).decode()}}]},
                         {"role": "tool", "tool_call_id": f"c{n}", "content": result}]
    return {"model": "m", "messages": messages}


def person_responses(items):
    out = []
    for n, item in enumerate(items):
        if item[0] == "user":
            out.append({"type": "message", "role": "user", "content": item[1]})
        elif item[0] == "reply":
            out.append({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": item[1]}]})
        else:
            _, name, args, result = item
            out += [{"type": "function_call", "call_id": f"c{n}", "name": name, "arguments": orjson.dumps(args).decode()},
                    {"type": "function_call_output", "call_id": f"c{n}", "output": result}]
    return {"model": "m", "instructions": "You are an airline agent.", "input": out}


def person_messages(items):
    out = []
    for n, item in enumerate(items):
        if item[0] == "user":
            if out and out[-1]["role"] == "user":  # the person's text joins the tool results' message
                out[-1]["content"].append({"type": "text", "text": item[1]})
            else:
                out.append({"role": "user", "content": [{"type": "text", "text": item[1]}]})
        elif item[0] == "reply":
            out.append({"role": "assistant", "content": [{"type": "text", "text": item[1]}]})
        else:
            _, name, args, result = item
            out += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"c{n}", "name": name, "input": args}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"c{n}", "content": result,
                                                  "is_error": True}]}]
    merged = []
    for message in out:  # consecutive turns of one role are one message
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1] = {**merged[-1], "content": merged[-1]["content"] + message["content"]}
        else:
            merged.append(message)
    return {"model": "claude-test", "max_tokens": 100, "system": "You are an airline agent.", "messages": merged}


def person_gemini(items):
    out = []
    for item in items:
        if item[0] == "user":
            out.append({"role": "user", "parts": [{"text": item[1]}]})
        elif item[0] == "reply":
            out.append({"role": "model", "parts": [{"text": item[1]}]})
        else:
            _, name, args, result = item
            out += [{"role": "model", "parts": [{"functionCall": {"name": name, "args": args}}]},
                    {"role": "user", "parts": [{"functionResponse": {"name": name, "response": {"error": result}}}]}]
    merged = []
    for content in out:
        if merged and merged[-1]["role"] == content["role"]:
            merged[-1] = {**merged[-1], "parts": merged[-1]["parts"] + content["parts"]}
        else:
            merged.append(content)
    return {"contents": merged, "systemInstruction": {"parts": [{"text": "You are an airline agent."}]}}


PERSON_DIALECTS = {"chat": person_chat, "responses": person_responses, "messages": person_messages,
                   "gemini": person_gemini}


async def run_person(proxy, dialect: str, items) -> list[tuple[int, str]]:
    """The agent's request after each of the person's messages and each tool result."""
    _, path, headers = DIALECTS[dialect]
    answers = []
    ends = [n + 1 for n, item in enumerate(items) if item[0] in ("user", "call")]
    async with aiohttp.ClientSession(headers={**headers, "Content-Type": "application/json"}) as client:
        for end in ends:
            body = PERSON_DIALECTS[dialect](items[:end])
            async with client.post(proxy.root + path, data=orjson.dumps(body)) as answer:
                await answer.read()
                answers.append((answer.status, answer.headers.get("X-Loopwarden-Warning")
                                or answer.headers.get("X-Loopwarden-Loop", "")))
                if answer.status != 200:
                    break
    return answers


@pytest.mark.parametrize("dialect", list(PERSON_DIALECTS))
async def test_the_same_reply_across_a_persons_messages_warns_but_never_stops(every_dialect, dialect):
    answers = await run_person(every_dialect, dialect, PERSON_WEAK)
    assert [status for status, _ in answers] == [200] * len(answers)
    # The 4th reply alike (one turn more than for a harness) is warned in the request after it, then each one more.
    assert [warned for _, warned in answers] == ["", "", "", "", "1/2 reply", "2/2 reply", "3 (past 2) reply",
                                                 "4 (past 2) reply"]


@pytest.mark.parametrize("dialect", list(PERSON_DIALECTS))
async def test_the_same_failing_call_across_a_persons_messages_still_stops(every_dialect, dialect):
    answers = await run_person(every_dialect, dialect, PERSON_STRONG)
    # Warned after the 3rd failure (that request, and the person's next one, carry it), again after the 4th,
    # stopped at the 5th.
    assert answers[-1] == (400, "tool_call")
    warned = [w for status, w in answers if status == 200 and w]
    assert warned == ["1/2 tool_call", "1/2 tool_call", "2/2 tool_call", "2/2 tool_call"]
