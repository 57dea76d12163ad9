"""A long conversation's next request parsed from where it differs from the one before (`proxy/wire/known.py`):
the payload, the dialect's reading and the verdict are those of a whole parse, whatever the body."""

from __future__ import annotations

import json
import os
import tracemalloc

import orjson
import pytest
from hypothesis import given, strategies as st

from proxy.config import build
from proxy.detect.engine import fingerprints_of
from proxy.inspection import Forward, Incoming, Inspector, Stop, body_slot
from proxy.wire import known
from proxy.wire.chat import ChatDialect
from proxy.wire.gemini import GeminiDialect
from proxy.wire.known import KnownBodies, written
from proxy.wire.messages import MessagesDialect
from proxy.wire.responses import ResponsesDialect

if known.member is None:
    if os.environ.get("LOOPWARDEN_REQUIRE_COMPILED") == "1" and os.environ.get("LOOPWARDEN_NO_EXTENSIONS") != "1":
        pytest.fail("the body scanner (proxy/wire/_items.pyx) was not compiled by the install",
                    pytrace=False)
    pytest.skip("the body scanner is not compiled here: every body is parsed whole", allow_module_level=True)

from proxy.wire._items import common_prefix, item_ends, member  # noqa: E402


@pytest.fixture(autouse=True)
def every_body_is_long(request, monkeypatch):
    if "real_sizes" not in request.keywords:
        monkeypatch.setattr(known, "LONG_BODY", 0)


# Text that trips a scanner: quotes, backslashes before quotes, brackets and commas inside strings, non-ASCII.
TRICKY = st.text(alphabet=st.sampled_from(list('ab"\\[]{},: \n\té😀\u2028')), max_size=12)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4),
    max_leaves=12)
WRITERS = [orjson.dumps, lambda v: json.dumps(v).encode(), lambda v: json.dumps(v, indent=2).encode(),
           lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode()]


@given(st.lists(VALUES, max_size=6), st.dictionaries(TRICKY, VALUES, max_size=3), st.sampled_from(WRITERS))
def test_the_scanner_finds_every_item_of_the_list_whatever_the_strings_hold(items, others, write):
    document = {**{k: v for k, v in others.items() if k != "messages"}, "messages": items, "z": others}
    raw = write(document)
    start, end, _ = member(raw, b"messages")
    assert orjson.loads(raw[start:end]) == orjson.loads(orjson.dumps(items))
    ends, close, _ = item_ends(raw, start + 1, False)
    assert close == end - 1 and len(ends) == len(items)
    begin = start + 1
    for item, stop in zip(items, ends):
        assert orjson.loads(raw[begin:stop].strip().lstrip(b",")) == orjson.loads(orjson.dumps(item))
        begin = stop


def test_the_scanner_refuses_what_it_cannot_place():
    assert member(b'{"messages": [1], "messages": [2]}', b"messages") is None  # named twice: ambiguous
    assert member(b'[1, 2]', b"messages") is None
    assert member(b'{"messages": [1, 2', b"messages") is None
    assert item_ends(b'[1, 2', 1, False) is None
    assert common_prefix(b"abcdef" * 2000, b"abcdef" * 1000 + b"x") == 6000
    assert common_prefix(b"", b"abc") == 0


CONVERSATION = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]),
                                               "content": TRICKY}), min_size=1, max_size=8)


@given(CONVERSATION, st.lists(st.tuples(st.integers(0, 3), CONVERSATION, st.booleans()), min_size=1, max_size=5),
       st.sampled_from(WRITERS))
def test_each_request_parses_as_a_whole_parse_does_and_shares_the_items_it_begins_with(
        first, changes, write):
    bodies, messages = KnownBodies(), first
    before = None
    for dropped, added, tools_after in changes:  # the last items changed (a cache marker moved), more added
        messages = messages[:max(len(messages) - dropped, 0)] + added
        document = {"model": "m", "messages": messages}
        if tools_after:
            document["tools"] = [{"name": "read", "description": '"]},{'}]
        raw = write(document)
        parsed = bodies.parse(raw, "messages", lambda: "slot")
        assert parsed.payload == orjson.loads(raw)
        assert list(parsed.payload) == list(orjson.loads(raw))  # the members in the order written
        if before is not None and parsed.previous is not None:
            shared = parsed.reused
            assert all(a is b for a, b in zip(parsed.payload["messages"][:shared], before["messages"]))
        before = parsed.payload


def test_a_broken_or_unfinished_continuation_is_refused_as_a_whole_parse_refuses_it():
    bodies = KnownBodies()
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 100}] * 3})
    bodies.parse(raw, "messages", lambda: "slot")
    for broken in (raw[:-5], raw[:-1] + b',"tools":}', raw + b"garbage", raw[:-2] + b',{"role":}]}'):
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(broken)
        with pytest.raises(orjson.JSONDecodeError):
            bodies.parse(broken, "messages", lambda: "slot")


def test_the_bodies_kept_stay_within_their_budget():
    bodies = KnownBodies(budget=30_000)
    for n in range(20):
        bodies.parse(orjson.dumps({"messages": [{"content": "y" * 1000}] * 3}), "messages", lambda: n)
    assert bodies.held == sum(body.weight for body in bodies._bodies.values()) <= 30_000
    assert [slot for slot in bodies._bodies] == list(range(20 - len(bodies._bodies), 20))  # the latest kept
    assert len(bodies._bodies) >= 2


def test_a_body_whose_members_before_the_conversation_are_huge_is_not_remembered():
    """No conversation's growth has a 10 MB `model`: parsed whole each time, it takes none of the budget."""
    bodies = KnownBodies()
    for n in range(5):
        raw = orjson.dumps({"model": f"{n}" + "m" * (known.MAX_HEAD + 1), "messages": [{"content": "y" * 1000}]})
        assert bodies.parse(raw, "messages", lambda: n).payload["messages"] == [{"content": "y" * 1000}]
    assert bodies.held == 0 and not bodies._bodies


def _tool_steps(n: int, text: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}] + [
        item for step in range(n) for item in chat_items(step, f"{text} {step}")]


# Bodies as clients send them, and as a hostile one might: what the remembered bodies hold, measured, must be
# within what their budget counts, whatever the text and however dense the JSON.
HELD_SHAPES = {
    "tool steps": lambda n: orjson.dumps({"model": "gpt", "messages": _tool_steps(40 + n, "read the file " * 8)}),
    "CJK text": lambda n: orjson.dumps({"model": "gpt", "messages": _tool_steps(30 + n, "读取文件并修复测试" * 40)}),
    "an emoji in ASCII text": lambda n: orjson.dumps({"model": "gpt", "messages": _tool_steps(
        30 + n, "x" * 2000 + "😀")}),
    "escaped characters": lambda n: json.dumps({"model": "gpt", "messages": _tool_steps(
        30 + n, "é" * 500 + "😀")}).encode(),
    "dense small parts": lambda n: orjson.dumps({"model": "gpt", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}] * (3000 + 10 * n)}] * 4}),
    "a long model name": lambda n: orjson.dumps({"model": "m" * 900_000 + str(n), "messages": _tool_steps(
        20, "read")}),
}


@pytest.mark.parametrize("shape", list(HELD_SHAPES))
def test_what_the_bodies_kept_hold_is_within_what_their_budget_counts(shape):
    make, dialect = HELD_SHAPES[shape], ChatDialect()
    bodies = KnownBodies(budget=1 << 40)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for session in range(3):
            for step in range(3):  # a conversation growing: its next bodies continue the last
                raw = bytes(memoryview(make(step)))  # its own size, as a server reads it (a writer's buffer is larger)
                parsed = bodies.parse(raw, "messages", lambda: session)
                previous = (parsed.reused, parsed.previous.reading) if parsed.previous is not None else None
                conversation = dialect.read(parsed.payload, None, None, previous)
                list(conversation.messages)  # every message read, as the inspection reads them
                parsed.known.reading = conversation.reading
                del raw, parsed, conversation, previous
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(bodies._bodies) == 3
    assert held <= bodies.held <= 6 * held, (held, bodies.held)


# -- each dialect's reading from where the previous request's ends ----------------------------------------------

def chat_items(step: int, result: str) -> list[dict]:
    return [{"role": "assistant", "content": f"step {step}", "tool_calls": [{"id": f"c{step}", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
            {"role": "tool", "tool_call_id": f"c{step}", "content": result}]


def messages_items(step: int, result: str) -> list[dict]:
    return [{"role": "assistant", "content": [{"type": "text", "text": f"step {step}"},
             {"type": "tool_use", "id": f"c{step}", "name": "read_file", "input": {"path": "a.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"c{step}", "content": result},
                                         {"type": "text", "text": "<system-reminder>go on</system-reminder>"}]}]


def responses_items(step: int, result: str) -> list[dict]:
    return [{"type": "reasoning", "summary": []}, {"type": "message", "role": "assistant", "content": f"step {step}"},
            {"type": "function_call", "call_id": f"c{step}", "name": "read_file", "arguments": '{"path": "a.py"}'},
            {"type": "function_call_output", "call_id": f"c{step}", "output": result}]


def gemini_items(step: int, result: str) -> list[dict]:
    return [{"role": "model", "parts": [{"text": f"step {step}"},
                                        {"functionCall": {"name": "read_file", "args": {"path": "a.py"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": result}}}]}]


DIALECTS = {
    "chat": (ChatDialect(), lambda items: {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                                                      {"role": "user", "content": "fix it"}, *items]},
             chat_items),
    "messages": (MessagesDialect(), lambda items: {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "fix it"}]}, *items], "system": "Be brief.",
        "max_tokens": 100}, messages_items),
    "responses": (ResponsesDialect(), lambda items: {"model": "m", "instructions": "Be brief.", "input": [
        {"type": "message", "role": "user", "content": "fix it"}, *items]}, responses_items),
    "gemini": (GeminiDialect(), lambda items: {"contents": [{"role": "user", "parts": [{"text": "fix it"}]}, *items],
                                               "systemInstruction": {"parts": [{"text": "Be brief."}]}},
               gemini_items),
}


def growing(dialect_name: str, steps: list[str]) -> list[bytes]:
    """Each request of a conversation one step longer than the one before."""
    _, body, items_of = DIALECTS[dialect_name]
    items: list[dict] = []
    bodies = []
    for number, result in enumerate(steps):
        items += items_of(number, result)
        bodies.append(orjson.dumps(body(items)))
    return bodies


@pytest.mark.parametrize("name", list(DIALECTS))
@given(st.lists(st.sampled_from(["ok", "x = 1", "Error: no such file", '"]}{[']), min_size=1, max_size=6),
       st.integers(0, 3))
def test_a_dialect_reads_a_continued_request_as_it_reads_it_whole(name, results, rewritten):
    dialect = DIALECTS[name][0]
    bodies = KnownBodies()
    for raw in growing(name, results):
        if rewritten:  # an agent that rewrites its last items (a cache marker): fewer are shared
            payload = orjson.loads(raw)
            key = dialect.items_key
            payload[key] = payload[key][:-rewritten] + [dict(i, mark=1) for i in payload[key][-rewritten:]]
            raw = orjson.dumps(payload)
        parsed = bodies.parse(raw, dialect.items_key, lambda: "slot")
        before = (parsed.reused, parsed.previous.reading) if parsed.previous is not None else None
        continued = dialect.read(parsed.payload, None, None, before)
        parsed.known.reading = continued.reading
        whole = dialect.read(orjson.loads(raw))
        assert list(continued.messages) == list(whole.messages)
        assert continued.anchors == whole.anchors and continued.own_start == whole.own_start
        assert fingerprints_of(continued.messages) == fingerprints_of(whole.messages)


# -- the verdict ------------------------------------------------------------------------------------------------

class Sink:
    def __init__(self) -> None:
        self.logged: list[tuple] = []

    def episode(self, context, episode, action, request_id, tokens_saved, served_by=None):
        self.logged.append((episode.type, action, episode.number, episode.message_index))

    def recovery(self, context, episode):
        self.logged.append(("recovered", episode.number))


def verdicts(name: str, bodies: list[bytes], shortcut: bool, slot=lambda headers, dialect, raw: "slot") -> list:
    dialect = DIALECTS[name][0]
    sink = Sink()
    inspector = Inspector(build({}, environ={}), None)
    kept = KnownBodies()
    headers = {"Authorization": "Bearer k", "anthropic-version": "2023-06-01", "x-goog-api-key": "k"}
    out = []
    for number, raw in enumerate(bodies):
        parsed = kept.parse(raw, dialect.items_key, lambda: slot(headers, dialect, raw)) if shortcut else None
        if parsed is not None and number and len(bodies[number - 1]) >= known.LONG_BODY:  # it continues one
            assert parsed.previous is not None and parsed.reused == len(orjson.loads(bodies[number - 1])[
                dialect.items_key])
        payload = parsed.payload if parsed is not None else orjson.loads(raw)
        verdict = inspector.inspect(Incoming(headers, raw, payload, dialect, parsed=parsed), sink)
        if isinstance(verdict, Stop):
            out.append(("stop", verdict.episode.type, verdict.body))
        else:
            assert isinstance(verdict, Forward)
            out.append(("forward", verdict.headers, orjson.loads(verdict.body)))
            verdict.tap.delivered(200, None)
    return out + sink.logged


@pytest.mark.parametrize("name", list(DIALECTS))
@given(st.lists(st.sampled_from(["ok", "same", "same", "Error: failed", "x"]), min_size=1, max_size=9))
def test_the_verdict_with_the_shortcut_is_the_verdict_from_reading_every_message(name, results):
    bodies = growing(name, results)
    assert verdicts(name, bodies, True) == verdicts(name, bodies, False)


@pytest.mark.real_sizes
@pytest.mark.parametrize("name", list(DIALECTS))
def test_a_loop_in_a_long_conversation_is_warned_and_stopped_with_the_shortcut(name):
    bodies = growing(name, [f"def f{n}(): pass\n" * 400 for n in range(30)] + ["same"] * 6)
    assert len(bodies[0]) < known.LONG_BODY < len(bodies[-1])  # short at first, long at the end
    seen = verdicts(name, bodies, True, lambda headers, dialect, raw: body_slot(headers, {}, dialect.name, raw))
    assert seen == verdicts(name, bodies, False)
    kinds = [entry[0] for entry in seen[:len(bodies)]]
    assert kinds[-1] == "stop" and any("X-Loopwarden-Warning" in entry[1] for entry in seen[:len(bodies)]
                                        if entry[0] == "forward")


@pytest.mark.parametrize("name", list(DIALECTS))
@given(st.lists(st.sampled_from(["ok", "x = 1", '"]}{[']), min_size=1, max_size=6), st.data(),
       st.sampled_from(WRITERS))
def test_a_warning_is_written_into_the_body_as_sent_touching_only_where_it_goes(name, results, data, write):
    dialect = DIALECTS[name][0]
    raw = write(orjson.loads(growing(name, results)[-1]))
    parsed = KnownBodies().parse(raw, dialect.items_key, lambda: "slot")
    conversation = dialect.read(parsed.payload)
    places = data.draw(st.lists(st.integers(conversation.own_start + 1, len(conversation.messages)), min_size=1,
                                max_size=2))
    changed = dialect.with_warnings(parsed.payload, conversation,
                                    [(place, "user", f"[loopwarden] warning {n}") for n, place in enumerate(places)])
    body = written(parsed.payload, changed, parsed.known)
    assert orjson.loads(body) == changed
    # The items before the first warning's are the client's bytes, as sent.
    first = min(conversation.anchor(place).item for place in places)
    if first:
        assert body[:parsed.known.ends[first - 1]] == raw[:parsed.known.ends[first - 1]]


@given(st.lists(st.booleans(), min_size=2, max_size=8))
def test_a_thinking_block_the_proxy_cut_is_left_out_wherever_it_is_in_a_continued_conversation(cut_steps):
    """An unsigned thinking block (a stream cut inside the thinking) in any assistant turn, early or new, is
    left out of every request that carries it, as from a whole parse."""
    items: list[dict] = []
    bodies = []
    for number, cut in enumerate(cut_steps):
        step = messages_items(number, "ok" if number % 2 else "same")
        if cut:
            step[0]["content"].insert(0, {"type": "thinking", "thinking": "Let me think"})
        items += step
        bodies.append(orjson.dumps(DIALECTS["messages"][1](items)))
    assert verdicts("messages", bodies, True) == verdicts("messages", bodies, False)
    sent = verdicts("messages", bodies, True)[len(bodies) - 1]
    assert sent[0] == "stop" or not any(block.get("type") == "thinking" for message in sent[2]["messages"]
                                        for block in message["content"] if isinstance(block, dict))
