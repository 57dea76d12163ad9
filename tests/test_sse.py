"""The SSE parser and the stream assembler: pure code, any split gives the same result."""

from __future__ import annotations

import orjson
from hypothesis import given, settings, strategies as st

from proxy.conversation import Message, ToolCall
from proxy.wire.chat import ChatStream
from proxy.wire.sse import MAX_EVENT_BYTES, SSEEvent, SSEParser, WholeEvents

STREAM = (
    b": keep-alive\n\n"
    b"data: {\"a\": 1}\n\n"
    b"event: response.output_text.delta\r\ndata: {\"b\": \"caf\xc3\xa9\"}\r\n\r\n"
    b"data: line one\ndata: line two\n\n"
    b"id: 7\nretry: 10\ndata:no-space\r\r"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent(b'{"a": 1}'),
    SSEEvent(b'{"b": "caf\xc3\xa9"}', "response.output_text.delta"),
    SSEEvent(b"line one\nline two"),
    SSEEvent(b"no-space"),
    SSEEvent(b"[DONE]"),
]


def parse_in_pieces(data: bytes, cuts: list[int]) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    start = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        events += [event._replace(end=0) for event in parser.feed(data[start:cut])]
        start = cut
    return events


def test_whole_stream_parses_to_expected_events():
    assert [event._replace(end=0) for event in SSEParser().feed(STREAM)] == EXPECTED


def test_byte_by_byte_gives_same_events():
    assert parse_in_pieces(STREAM, list(range(len(STREAM)))) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=30))
@settings(max_examples=300)
def test_any_split_gives_same_events(cuts):
    assert parse_in_pieces(STREAM, cuts) == EXPECTED


@given(
    st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40), max_size=8),
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=20),
)
@settings(max_examples=200)
def test_generated_streams_any_line_ending_any_split(payloads, newline, cuts):
    raw = b"".join(
        b"data: " + orjson.dumps({"t": text}) + newline + (b": ping" + newline if i % 2 else b"") + newline
        for i, text in enumerate(payloads)
    )
    events = parse_in_pieces(raw, [c for c in cuts if c <= len(raw)])
    assert [orjson.loads(e.data)["t"] for e in events] == payloads


def test_incomplete_event_is_not_emitted():
    parser = SSEParser()
    assert parser.feed(b"data: {\"x\": 1}\n") == []
    assert parser.feed(b"\n") == [SSEEvent(b'{"x": 1}', None, 1)]


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_assembler_joins_split_tool_call_arguments_and_text():
    assembler = ChatStream()
    texts = []
    starts = 0
    for chunk in [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Let me "}),
        _chunk({"content": "look."}),
        _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                "function": {"name": "read_file", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"pa"}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "th\": \"a.py\"}"}}]}),
        _chunk({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                                "function": {"name": "ls", "arguments": "{}"}}]}),
        _chunk({}, "tool_calls"),
        {"id": "c1", "model": "m", "choices": [], "usage": {"total_tokens": 9}},
    ]:
        text, started = assembler.add(chunk)
        texts.append(text)
        starts += started
    assert "".join(texts) == "Let me look."
    assert starts == 2
    assert assembler.finish_reason == "tool_calls"
    assert assembler.usage == {"total_tokens": 9}
    assert assembler.message() == Message("assistant", "Let me look.", (
        ToolCall("call_1", "read_file", "{\"path\": \"a.py\"}"), ToolCall("call_2", "ls", "{}")))


def absolute_ends(data: bytes, cuts: list[int]) -> list[int]:
    """Where each event ends in the whole stream, read back from the chunk-relative ends."""
    parser = SSEParser()
    ends: list[int] = []
    start = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        ends += [start + event.end for event in parser.feed(data[start:cut])]
        start = cut
    return ends


def test_event_ends_point_just_past_each_blank_line():
    ends = absolute_ends(STREAM, [])
    assert ends[-1] == len(STREAM)
    for end in ends:
        assert STREAM[:end].endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))
    assert STREAM[:ends[0]] == b': keep-alive\n\ndata: {"a": 1}\n\n'


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=30))
@settings(max_examples=300)
def test_event_ends_do_not_depend_on_the_split(cuts):
    # A CRLF split by the read ends the event at its CR: the LF then belongs to no event.
    for got, whole in zip(absolute_ends(STREAM, cuts), absolute_ends(STREAM, []), strict=True):
        assert got == whole or (got == whole - 1 and got in cuts and STREAM[got - 1:got + 1] == b"\r\n")


def test_fast_path_ends_and_boundary():
    parser = SSEParser()
    events = parser.feed(b"data: a\n\ndata: bb\n\n")
    assert [e.end for e in events] == [9, 19] and parser.at_boundary
    assert parser.feed(b"data: c") == [] and not parser.at_boundary
    assert [e.end for e in parser.feed(b"\n\n")] == [2]


@given(st.lists(st.tuples(st.sampled_from([None, "response.output_text.delta", "response.completed"]),
                          st.text(max_size=30)), min_size=1, max_size=8),
       st.lists(st.integers(min_value=0, max_value=3000), max_size=10))
@settings(max_examples=200)
def test_named_events_read_whole_or_split_alike(events, cuts):
    raw = b"".join((f"event: {name}\n".encode() if name else b"") + b"data: " + orjson.dumps({"t": text}) + b"\n\n"
                   for name, text in events)
    whole = SSEParser().feed(raw)
    assert [(e.event, orjson.loads(e.data)["t"]) for e in whole] == events
    assert whole[-1].end == len(raw)
    assert parse_in_pieces(raw, [c for c in cuts if c <= len(raw)]) == [e._replace(end=0) for e in whole]


def test_an_event_past_the_size_limit_is_skipped_and_the_next_one_read():


    parser = SSEParser()
    endless = b"data: " + b"x" * (MAX_EVENT_BYTES + 10)  # one line with no end, in reads of 64 KiB
    events = []
    for start in range(0, len(endless), 65536):
        events += parser.feed(endless[start:start + 65536])
    assert events == [] and parser._pieces == [] and parser._rest == b""  # nothing of it is kept past the cap
    tail = b"\n\ndata: {\"after\": 1}\n\n"
    (event,) = parser.feed(tail)
    assert event.data == b'{"after": 1}' and event.end == len(tail)
    many_lines = b"".join(b"data: " + b"y" * 1000 + b"\n" for _ in range(MAX_EVENT_BYTES // 1000 + 2))
    assert parser.feed(many_lines + b"\n") == []  # an event of many lines, too large in all
    assert [e.data for e in parser.feed(b"data: ok\n\n")] == [b"ok"]


ERROR_EVENT = b'data: {"error": {"message": "upstream failed"}}\n\n'


@given(
    st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40), min_size=1, max_size=8),
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=20),
    st.integers(min_value=0, max_value=2000),
)
@settings(max_examples=300)
def test_a_stream_broken_off_anywhere_gives_the_client_whole_events_then_the_error(payloads, newline, cuts, stop):
    raw = b"".join(b"event: delta" + newline + b"data: " + orjson.dumps({"t": text}) + newline
                   + (b": ping" + newline if i % 2 else b"") + newline for i, text in enumerate(payloads))
    whole_ends = {event.end for event in SSEParser().feed(raw)} | {0}
    stop = min(stop, len(raw))
    gate = WholeEvents()
    sent, start = b"", 0
    for cut in sorted({c for c in cuts if c < stop}) + [stop]:
        sent += gate.release(raw[start:cut])
        start = cut
    assert raw.startswith(sent) and len(sent) in whole_ends | {len(raw)}  # whole events only
    *relayed, last = SSEParser().feed(sent + gate.broken(ERROR_EVENT))
    assert last.data == ERROR_EVENT[6:-2] and last.event is None  # the error stands as an event of its own
    assert [orjson.loads(e.data)["t"] for e in relayed] == payloads[:len(relayed)]


def test_a_stream_that_ends_without_a_blank_line_is_relayed_whole():
    gate = WholeEvents()
    assert gate.release(b"data: {}\n\nevent: x\ndata: [DO") == b"data: {}\n\n"
    assert gate.release(b"NE]\n") == b""
    assert gate.ended() == b"event: x\ndata: [DONE]\n"
    assert gate.release(b"data: 1\n") == b""
    assert gate.release(b"\ndata: 2") == b"data: 1\n\n"  # the blank line came in the next read


def test_an_oversized_event_is_passed_on_as_it_comes():
    gate = WholeEvents()
    piece = b"x" * 65536
    reads = MAX_EVENT_BYTES // 65536 + 2
    out = [gate.release(b"data: " + piece)] + [gate.release(piece) for _ in range(reads)]
    assert sum(map(len, out)) == 6 + len(piece) * (reads + 1)  # nothing held back past the cap
    assert gate.broken(b"") == b"\n\n"  # the broken event ends, and the error is an event of its own
