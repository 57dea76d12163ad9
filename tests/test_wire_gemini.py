"""The Gemini dialect on its own: contents to the neutral conversation and back, side requests, streams, errors."""

from __future__ import annotations

import copy

import orjson

from proxy.conversation import Message, ToolCall
from proxy.wire.gemini import GeminiDialect, GeminiStream
from proxy.wire.sse import SSEParser

gemini = GeminiDialect()
SIGNED = {"functionCall": {"name": "read_file", "args": {"file_path": "calc.py"}}, "thoughtSignature": "c2ln"}
PAYLOAD = {
    "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
    "contents": [
        {"role": "user", "parts": [{"text": "<session_context>…</session_context>"}, {"text": "run the tests"}]},
        {"role": "model", "parts": [{"text": "thinking hard", "thought": True}, {"text": "Reading."}, SIGNED]},
        {"role": "user", "parts": [{"functionResponse": {"name": "read_file",
                                                         "response": {"output": "def add(a, b): ..."}}},
                                   {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]},
        {"role": "model", "parts": [{"functionCall": {"id": "rs_1", "name": "run_shell_command",
                                                      "args": {"command": "pytest"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"id": "rs_1", "name": "run_shell_command",
                                                         "response": {"error": "exit code 1"}}}]},
    ],
    "tools": [{"functionDeclarations": [{"name": "read_file"}]}],
}


def test_contents_read_as_neutral_messages_and_calls_pair_with_their_responses():
    read = gemini.read(PAYLOAD)
    assert read.messages == [
        Message("system", "You are Gemini CLI."), Message("user", "<session_context>…</session_context>\nrun the tests"),
        Message("assistant", "Reading.", (ToolCall("read_file#0", "read_file", '{"file_path":"calc.py"}'),)),
        Message("tool", "def add(a, b): ...", call_id="read_file#0"),
        Message("assistant", "", (ToolCall("rs_1", "run_shell_command", '{"command":"pytest"}'),)),
        Message("tool", "exit code 1", call_id="rs_1", failed=True)]


def test_a_warning_is_a_text_part_after_the_function_response_and_nothing_else_changes():
    before = copy.deepcopy(PAYLOAD)
    sent = gemini.with_warnings(PAYLOAD, gemini.read(PAYLOAD), [(4, "system", "[loopwarden] w1"),
                                                                 (6, "system", "[loopwarden] w2")])
    assert PAYLOAD == before
    assert sent["contents"][2]["parts"] == [PAYLOAD["contents"][2]["parts"][0], {"text": "[loopwarden] w1"},
                                            PAYLOAD["contents"][2]["parts"][1]]
    assert sent["contents"][4]["parts"][-1] == {"text": "[loopwarden] w2"}
    assert sent["contents"][1] == PAYLOAD["contents"][1]  # signatures and thoughts as they came
    assert sent["systemInstruction"] == PAYLOAD["systemInstruction"] and sent["tools"] == PAYLOAD["tools"]


def test_a_structured_check_without_tools_is_a_side_request():
    assert gemini.is_side_request({"contents": [], "generationConfig": {"responseMimeType": "application/json"}})
    assert not gemini.is_side_request(PAYLOAD)


def test_a_stream_reads_text_and_calls_and_a_cut_ends_with_a_stop_chunk():
    stream = GeminiStream()
    text, called = stream.add({"candidates": [{"content": {"role": "model", "parts": [
        {"text": "hmm", "thought": True}, {"text": "Again "}]}}], "responseId": "r1", "modelVersion": "g"})
    assert (text, called) == ("Again ", False)
    assert stream.add({"candidates": [{"content": {"parts": [SIGNED]}, "finishReason": "STOP"}]}) == ("", True)
    assert stream.finished and stream.message() == Message(
        "assistant", "Again ", (ToolCall("read_file#0", "read_file", '{"file_path":"calc.py"}'),))
    (event,) = SSEParser().feed(stream.cut_ending({"loop": "content", "action": "cut"}, "notice"))
    last = orjson.loads(event.data)
    assert last["candidates"][0] == {"content": {"role": "model", "parts": [{"text": "notice"}]},
                                     "finishReason": "STOP", "index": 0}
    assert last["loopwarden"]["action"] == "cut" and last["responseId"] == "r1" and stream.stop_is_cut


def test_errors_in_googles_shape_and_requests_claimed_by_their_key():
    error = orjson.loads(gemini.error_body("stop", "loop_detected", "loop_detected"))["error"]
    assert error["code"] == 400 and error["status"] == "FAILED_PRECONDITION"
    assert error["details"] == [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "LOOP_DETECTED",
                                 "domain": "loopwarden"}]
    assert gemini.claims({"x-goog-api-key": "k"}, {}) and gemini.claims({}, {"key": "k"})
    assert not gemini.claims({"Authorization": "Bearer k"}, {})

    class Settings:
        gemini_upstream_url = "https://gemini.test/v1beta"
        gemini_upstream_api_key = "server-key"
    assert str(gemini.upstream_url(Settings, "/v1beta/models/g:generateContent", "key=client&alt=sse")) == \
        "https://gemini.test/v1beta/models/g:generateContent?key=server-key&alt=sse"
    assert gemini.max_output_tokens({"generationConfig": {"maxOutputTokens": 256}}) == 256
    assert gemini.wrote(PAYLOAD) and not gemini.wrote({"messages": []})
    assert gemini.model(PAYLOAD, "/v1beta/models/gemini-2.5-pro:streamGenerateContent") == "gemini-2.5-pro"


def test_gemini_clis_own_loop_notice_starts_no_task():
    payload = {"contents": PAYLOAD["contents"] + [
        {"role": "model", "parts": [{"text": "[The previous response was interrupted before it completed.]"}]},
        {"role": "user", "parts": [{"text": "System: Potential loop detected. Details: Repeated tool call."}]}]}
    read = gemini.read(payload)
    assert read.messages[-1] == Message("system", "System: Potential loop detected. Details: Repeated tool call.")
    assert [m.role for m in read.messages].count("user") == 1


def test_a_function_return_value_wrapped_in_result_is_read_as_its_text():
    """google-genai's automatic function calling and ADK send a function's return value as `{"result": ...}`:
    a failing test run's report inside it is read as the report, so its failure form shows."""
    report = "FAILED tests/test_calc.py::test_add - assert -1 == 3\n1 failed in 0.02s"
    payload = {"contents": [
        {"role": "user", "parts": [{"text": "make the tests pass"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "run_tests", "args": {}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "run_tests", "response": {"result": report}}}]}]}
    assert gemini.read(payload).messages[-1] == Message("tool", report, call_id="run_tests#0")
    # a return value with more in it than one text is read as JSON, as before
    payload["contents"][2]["parts"][0]["functionResponse"]["response"] = {"result": report, "took": 2}
    assert gemini.read(payload).messages[-1].text == orjson.dumps({"result": report, "took": 2}).decode()


def test_the_gemini_dialect_decides_its_own_routes_request_by_request():
    from proxy.wire import GEMINI, SERVED, watched_alias

    assert GEMINI.route("POST", {"target": "gemini-2.5-pro:streamGenerateContent"}).inspect
    assert GEMINI.route("GET", {"target": "gemini-2.5-pro:generateContent"}).relay is GEMINI  # not a call
    assert GEMINI.route("POST", {"target": "gemini-2.5-pro:countTokens"}).relay is GEMINI
    assert GEMINI.route("GET", {"target": "gemini-2.5-pro"}) == (False, None, None)  # its headers choose
    assert GEMINI.route("GET", {"tail": "models"}).relay is GEMINI
    assert "letters only" in GEMINI.route("POST", {"target": "g:generateContent;x"}).refused
    assert [(r.method, r.path) for r in SERVED if r.dialect is GEMINI] == [
        ("*", "/v1beta/models/{target}"), ("*", "/v1beta/tunedModels/{target}"),
        ("*", "/v1/models/{target:[^/]*:[^/]*}"), ("*", "/v1/tunedModels/{target:[^/]*:[^/]*}"),
        ("*", "/v1beta/{tail:.*}")]
    assert watched_alias("/v1beta//models/g:generateContent") == "/v1beta/models/g:generateContent"
    assert watched_alias("/v1beta//models/g:countTokens") is None
    assert watched_alias("/v1//chat/completions") == "/v1/chat/completions"
