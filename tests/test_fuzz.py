"""Generated bad input on the inspected paths: whatever a client sends, the proxy answers in the OpenAI
shape or passes the upstream's answer on; never a 500 of its own, never a traceback in the log."""

from __future__ import annotations

import asyncio
import logging
import os

import aiohttp
import orjson
from hypothesis import HealthCheck, given, settings, strategies as st

from proxy.detect.engine import CUT_NOTICE_PREFIX
from tests.conftest import start_proxy
from tests.fake_upstream import FakeUpstream

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=False),
                    st.text(max_size=30), st.sampled_from(["", "\x00", "[loopwarden] Output cut: x", "Observation: x",
                                                           "```bash\nls\n```", "Action: a\nAction Input: {'x': 1}",
                                                           "[[ ## trajectory ## ]]\n[[ ## tool_name_0 ## ]]\nx"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)


def field(value_strategy):
    """A field the proxy reads: usually of a sensible type, often not."""
    return st.one_of(value_strategy, VALUES)


CALLS = st.fixed_dictionaries({}, optional={
    "id": field(st.text(max_size=6)), "type": field(st.just("function")),
    "function": field(st.fixed_dictionaries({}, optional={"name": field(st.sampled_from(["ls", "read"])),
                                                           "arguments": field(st.sampled_from(['{"a": 1}', "{", "[]"]))})),
})
MESSAGES = st.lists(st.fixed_dictionaries({}, optional={
    "role": field(st.sampled_from(["system", "user", "assistant", "tool", "developer"])),
    "content": field(st.one_of(st.text(max_size=40), st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": field(st.text(max_size=20))}), max_size=2))),
    "tool_calls": field(st.lists(CALLS, max_size=2)),
    "tool_call_id": field(st.text(max_size=6)),
    "is_error": field(st.booleans()),
}), max_size=8)
ITEMS = st.lists(st.fixed_dictionaries({}, optional={
    "type": field(st.sampled_from(["message", "function_call", "function_call_output", "custom_tool_call",
                                   "custom_tool_call_output", "local_shell_call", "local_shell_call_output",
                                   "reasoning", "item_reference"])),
    "role": field(st.sampled_from(["user", "assistant", "developer", "system"])),
    "content": field(st.text(max_size=30)), "call_id": field(st.text(max_size=5)), "id": field(st.text(max_size=5)),
    "name": field(st.text(max_size=5)), "arguments": field(st.text(max_size=10)), "input": field(st.text(max_size=10)),
    "output": field(st.text(max_size=20)), "action": field(st.dictionaries(st.text(max_size=5), VALUES, max_size=2)),
}), max_size=8)
CHAT_BODIES = st.fixed_dictionaries({"messages": field(MESSAGES)}, optional={
    "model": field(st.text(max_size=10)), "stream": field(st.booleans()), "max_tokens": field(st.integers(0, 99))})
RESPONSES_BODIES = st.fixed_dictionaries({"input": field(st.one_of(st.text(max_size=30), ITEMS))}, optional={
    "model": field(st.text(max_size=10)), "instructions": field(st.text(max_size=20)), "stream": field(st.booleans()),
    "store": field(st.booleans()), "previous_response_id": field(st.text(max_size=8)),
    "conversation": field(st.one_of(st.text(max_size=8), st.fixed_dictionaries({"id": field(st.text(max_size=8))})))})
RAW = st.one_of(st.binary(max_size=200), st.sampled_from([b"", b"{", b"[]", b"null", b'{"messages": 5}',
                                                          b'{"input": {}}', b"\xff\xfe", b'{"a": "\\ud800"}']))


# Whole HTTP requests, written to a socket as generated: odd methods, paths and encodings, Content-Types,
# framing (none, conflicting, short, broken chunks), duplicated and huge headers.
PATHS = st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/models", "/v1/embeddings", "/v1", "/",
                         "/v1/%2e%2e/%2e%2e/etc/passwd", "/v1/../admin", "/v1/models/%2F..%2Fx", "/v1//x", "/v1/%00",
                         "/v1/%ZZ", "/v1/caf%C3%A9", "/v1/" + "a" * 3000, "/loopwarden/api/stats", "/healthz",
                         "/loopwarden/api/sessions/%2e%2e", "/loopwarden/api/detections", "/metrics", "*"])
QUERIES = st.sampled_from(["", "?x=1", "?x=%2e%2e&y=a%26b", "?%ZZ", "?" + "q" * 2000, "?since=-5d", "?limit=abc",
                           "?since=1h&limit=0", "?cursor=%00"])
CONTENT_TYPES = st.sampled_from([None, "application/json", "text/plain", "application/json; charset=latin-1", "",
                                 "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", "JSON"])
HEADERS = st.lists(st.tuples(
    st.sampled_from(["X-Loopwarden-Session", "X-Loopwarden-Mode", "X-Loopwarden-Disable", "Authorization",
                     "Accept-Encoding", "Session-Id", "X-Custom", "Content-Encoding", "Expect", "Host"]),
    st.one_of(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
              st.sampled_from(["", "observe,plan", "gzip", "100-continue", "Bearer " + "k" * 5000, "a" * 9000]))),
    max_size=4)
FRAMINGS = st.sampled_from(["length", "chunked", "none", "both", "short", "duplicate", "bad chunk"])
METHODS = st.sampled_from(["POST", "POST", "GET", "PUT", "DELETE", "OPTIONS", "HEAD", "PATCH", "BREW"])
REQUESTS = st.builds(lambda *parts: parts, METHODS, PATHS, QUERIES, CONTENT_TYPES, HEADERS, FRAMINGS,
                     st.one_of(CHAT_BODIES.map(orjson.dumps), RAW))


def raw_request(method: str, path: str, query: str, content_type: str | None, headers: list, framing: str,
                body: bytes) -> bytes:
    lines = [f"{method} {path}{query} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"Content-Type: {content_type}"] if content_type is not None else []
    lines += [f"{name}: {value}" for name, value in headers]
    framed = {"length": [f"Content-Length: {len(body)}"], "short": [f"Content-Length: {len(body) + 10}"],
              "chunked": ["Transfer-Encoding: chunked"], "bad chunk": ["Transfer-Encoding: chunked"],
              "both": [f"Content-Length: {len(body)}", "Transfer-Encoding: chunked"], "none": [],
              "duplicate": [f"Content-Length: {len(body)}", f"Content-Length: {len(body) + 1}"]}[framing]
    head = "\r\n".join(lines + framed).encode("latin-1") + b"\r\n\r\n"
    if framing == "none":
        return head
    if framing in ("chunked", "both"):
        half = len(body) // 2
        return head + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:]) if part) \
            + b"0\r\n\r\n"
    if framing == "bad chunk":
        return head + b"zz\r\n" + body + b"\r\n0\r\n\r\n"
    return head + body


async def send_raw(port: int, parts: tuple) -> tuple[int | None, dict, bytes]:
    """Write the request (a short body: then no more, as a client that stops sending), read what comes back:
    (status, headers, body), or (None, {}, b"") when the connection closed without an answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw_request(*parts))
        if parts[5] == "short":
            writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    if not answer:
        return None, {}, b""
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    return int(status_line.split()[1]), headers, body


def problem(status: int | None, body: bytes, sent_upstream: bool, content_type: str = "",
            method: str = "POST") -> str | None:
    """What is wrong with an answer to generated input, if anything: an answer the proxy made itself (it sent
    nothing upstream) must be no 5xx and in the OpenAI error shape. aiohttp answers in plain text before any
    route is chosen, and that is counted as right: the parser's 400 for what is not valid HTTP, and 417 for an
    unknown `Expect` where no route of that method serves the path (the routes answer it in the OpenAI shape:
    tested below)."""
    if status is None or sent_upstream or status < 400:
        return None
    if status >= 500:
        return f"{status} for a client's mistake: {body[:200]!r}"
    if content_type.startswith("text/plain") and status in (400, 417):
        return None
    if method == "HEAD":
        return None  # no body to carry the error
    try:
        error = orjson.loads(body)["error"]
        assert isinstance(error["message"], str) and error["type"]
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"{status} outside the OpenAI shape: {body[:120]!r}"
    return None


def drawn(strategy, count: int) -> list:
    """`count` examples of a strategy, drawn up front: the requests are sent afterwards, as the server runs on
    the test's own loop."""
    found: list = []

    @settings(max_examples=count, suppress_health_check=list(HealthCheck), deadline=None, database=None)
    @given(strategy)
    def collect(example):
        found.append(example)

    collect()
    return found


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


CASES = st.one_of(CHAT_BODIES.map(lambda b: ("/chat/completions", orjson.dumps(b))),
                  RESPONSES_BODIES.map(lambda b: ("/responses", orjson.dumps(b))),
                  st.tuples(st.sampled_from(["/chat/completions", "/responses"]), RAW))


async def test_generated_bodies_never_break_the_proxy(tmp_path):
    upstream = await FakeUpstream().start()
    proxy = await start_proxy(upstream_url=upstream.url, database_url=f"sqlite+aiosqlite:///{tmp_path}/fuzz.db",
                              llm_check=False)
    errors = Errors()
    logging.getLogger().addHandler(errors)
    try:
        async with aiohttp.ClientSession() as http:
            for path, data in drawn(CASES, int(os.environ.get("LOOPWARDEN_FUZZ_CASES", "400"))):
                before = len(upstream.requests)
                async with http.post(f"{proxy.url}{path}", data=data,
                                     headers={"Content-Type": "application/json"}) as answer:
                    body = await answer.read()
                found = problem(answer.status, body, len(upstream.requests) > before)
                assert found is None, (found, path, data[:300])
        assert errors.records == [], [r.getMessage() for r in errors.records[:3]]
    finally:
        logging.getLogger().removeHandler(errors)
        await proxy.runner.cleanup()
        await upstream.close()


async def test_generated_requests_never_break_the_proxy(tmp_path):
    upstream = await FakeUpstream().start()
    proxy = await start_proxy(upstream_url=upstream.url, database_url=f"sqlite+aiosqlite:///{tmp_path}/fuzz.db",
                              llm_check=False)
    errors = Errors()
    logging.getLogger().addHandler(errors)
    try:
        for parts in drawn(REQUESTS, int(os.environ.get("LOOPWARDEN_FUZZ_CASES", "400")) // 2):
            before = len(upstream.requests)
            status, headers, body = await send_raw(proxy.port, parts)
            found = problem(status, body, len(upstream.requests) > before, headers.get("content-type", ""), parts[0])
            assert found is None, (found, raw_request(*parts)[:300])
        assert errors.records == [], [r.getMessage() for r in errors.records[:3]]
    finally:
        logging.getLogger().removeHandler(errors)
        await proxy.runner.cleanup()
        await upstream.close()


async def test_an_unknown_expectation_is_refused_in_the_openai_shape_and_100_continue_works(upstream, proxy):
    """curl sends `Expect: 100-continue` for large bodies; anything else is refused 417 on every route."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "go"}]})
    for expect, path in (("gzip", "/v1/chat/completions"), ("x", "/v1/models"), ("y", "/loopwarden/api/stats")):
        status, headers, answer = await send_raw(proxy.port, ("POST" if "chat" in path else "GET", path, "",
                                                              "application/json", [("Expect", expect)], "length", body))
        assert (status, orjson.loads(answer)["error"]["code"]) == (417, "expectation_failed")
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"content": "ok"' in answer


async def test_the_defects_generated_input_found(upstream, proxy):
    """Each of these once answered 500 or broke the connection."""
    async with aiohttp.ClientSession() as http:
        # An input item whose `type` is not a string.
        async with http.post(f"{proxy.url}/responses", json={"model": "m", "input": [{"type": ["message"]}]}) as a:
            assert a.status == 200 and (await a.json())["object"] == "response"
        # A conversation id with control characters names the session, and the response header stays valid.
        async with http.post(f"{proxy.url}/responses", json={"model": "m", "input": "hi",
                                                              "conversation": "conv\x00\r\n1"}) as a:
            assert a.status == 200 and a.headers["X-Loopwarden-Session"] == "conv???1"
        # A tool call whose `function` is not an object, and `tool_calls` that is not a list.
        messages = [{"role": "user", "content": "go"},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": 1.5}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "x"}]
        async with http.post(f"{proxy.url}/chat/completions", json={"model": "m", "messages": messages}) as a:
            assert a.status == 200
        messages[1]["tool_calls"] = True
        async with http.post(f"{proxy.url}/chat/completions", json={"model": "m", "messages": messages}) as a:
            assert a.status == 200


SSE_PIECES = st.lists(st.one_of(
    st.sampled_from([b"data: [DONE]\n\n", b": keep-alive\n\n", b"data: {\n\n", b"data: null\n\n", b"\r\n\r\n",
                     b'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\\"pa"}}]}}]}\n\n',
                     b'data: {"choices": [{"delta": {"content": 5}}]}\n\n', b'data: {"choices": "x"}\n\n',
                     b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", "delta": ["x"]}\n\n',
                     b'event: response.output_item.added\ndata: {"type": "response.output_item.added", "item": 7}\n\n',
                     b'event: response.completed\ndata: {"type": "response.completed", "response": {"output": [1]}}\n\n',
                     b'data: {"type": "response.output_item.done", "output_index": [], "item": {"id": 1}}\n\n']),
    st.binary(max_size=40),
    st.text(max_size=40).map(lambda t: b"data: " + orjson.dumps({"choices": [{"delta": {"content": t}}]}) + b"\n\n"),
), max_size=12)
STREAMS = SSE_PIECES.map(b"".join)


def passed_on(stream: bytes, got: bytes) -> bool:
    """The upstream's bytes as they came; or, where the text chanted (generated lists repeat their elements:
    twelve times the same delta is chanting), its bytes up to the delta that completed the chant, then the
    cut's notice and the stream's end."""
    if got == stream:
        return True
    notice = got.find(CUT_NOTICE_PREFIX.encode())
    if notice < 0:
        return False
    kept = got[:got.rfind(b"data: ", 0, notice)]
    return len(kept) < len(stream) and stream.startswith(kept) and got.endswith(b"data: [DONE]\n\n")


CHANTING = b"".join(b"data: " + orjson.dumps({"choices": [{"delta": {"content": "0" * 40}}]}) + b"\n\n"
                    for _ in range(12))  # a stream the generator once drew: it is cut, rightly


async def test_generated_upstream_streams_pass_through_unchanged(upstream, proxy):
    """Garbage, split events, no `[DONE]`, argument fragments that never form JSON: the client gets the
    upstream's bytes as they were (or, for a text that chants, cut), and the proxy stays well."""
    from tests.fake_upstream import Turn

    errors = Errors()
    logging.getLogger().addHandler(errors)
    try:
        async with aiohttp.ClientSession() as http:
            streams = [b"", CHANTING] + drawn(STREAMS, int(os.environ.get("LOOPWARDEN_FUZZ_CASES", "400")) // 4)
            for n, stream in enumerate(streams):
                upstream.script.append(Turn(raw_body=stream, headers={"Content-Type": "text/event-stream"}))
                path = "/chat/completions" if n % 2 else "/responses"
                body = {"model": "m", "stream": True, **({"messages": [{"role": "user", "content": "go"}]}
                                                       if n % 2 else {"input": "go"})}
                async with http.post(f"{proxy.url}{path}", json=body) as answer:
                    assert answer.status == 200
                    got = await answer.read()
                    assert passed_on(stream, got), (stream, got)
                    if stream is CHANTING:
                        assert got != stream  # the check above knows a cut when it sees one
        assert errors.records == [], [r.getMessage() for r in errors.records[:3]]
    finally:
        logging.getLogger().removeHandler(errors)


async def test_stream_events_of_a_shape_their_api_does_not_have_are_passed_on(upstream, proxy):
    """These once broke the stream tap (the stream ended in a 500's place)."""
    from tests.fake_upstream import Turn

    cases = [("/chat/completions", b'data: {"choices": "x"}\n\ndata: [DONE]\n\n'),
             ("/chat/completions", b'data: {"choices": [{"delta": {"tool_calls": [3]}}]}\n\n'),
             ("/responses", b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", '
                            b'"delta": ["x"], "item_id": []}\n\n'),
             ("/responses", b'data: {"type": "response.output_item.done", "output_index": [], "item": {}}\n\n')]
    async with aiohttp.ClientSession() as http:
        for path, stream in cases:
            upstream.script.append(Turn(raw_body=stream, headers={"Content-Type": "text/event-stream"}))
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}], "input": "go"}
            async with http.post(f"{proxy.url}{path}", json=body) as answer:
                assert answer.status == 200 and await answer.read() == stream
