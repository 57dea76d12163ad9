"""The chat completions dialect on its own: requests to the neutral conversation and back, answers, streams."""

from __future__ import annotations

import copy

import orjson
import pytest

from proxy.conversation import Message, RequestError, ToolCall
from proxy.wire.chat import ChatDialect, ChatStream
from proxy.wire.sse import SSEParser
from tests.convo import conversation, step, user

chat = ChatDialect()


class Settings:
    upstream_url = "http://upstream.test/base/v1"
    upstream_api_key = None


def test_a_request_reads_as_neutral_messages():
    messages = conversation(user("fix it"), step("read_file", {"path": "a.py"}, "Error: no such file"))
    messages.insert(1, {"role": "developer", "content": [{"type": "text", "text": "be brief"}]})
    read = list(chat.read({"messages": messages}).messages)  # read lazily, as the rules look at them
    call_id = messages[3]["tool_calls"][0]["id"]
    assert read == [Message("system", "You are a coding agent."), Message("developer", "be brief"),
                    Message("user", "fix it"),
                    Message("assistant", "", (ToolCall(call_id, "read_file", '{"path":"a.py"}'),)),
                    Message("tool", "Error: no such file", call_id=call_id)]


def test_messages_that_are_not_objects_are_refused():
    with pytest.raises(RequestError, match="'messages' must be an array of objects"):
        chat.read({"messages": ["hello"]})


def test_a_warning_goes_after_the_tool_results_and_the_request_is_left_as_it_was():
    messages = conversation(user("go"), step("ls", {}, "a.py"), step("ls", {}, "a.py"))
    payload = {"model": "m", "messages": messages, "temperature": 0}
    before = copy.deepcopy(payload)
    conversation_read = chat.read(payload)
    sent = chat.with_warnings(payload, conversation_read, [(4, "system", "[loopwarden] first"),
                                                           (6, "system", "[loopwarden] second")])
    assert payload == before
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool", "system", "assistant",
                                                     "tool", "system"]
    assert sent["messages"][4] == {"role": "system", "content": "[loopwarden] first"}
    assert sent["messages"][7] == {"role": "system", "content": "[loopwarden] second"}
    assert [m for m in sent["messages"] if m["role"] != "system" or m is sent["messages"][0]] == messages
    assert sent["temperature"] == 0 and sent["model"] == "m"


def test_a_json_answer_is_choice_zeros_message():
    answer = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}}]}
    assert chat.answer(answer) == Message("assistant", "", (ToolCall("c1", "ls", "{}"),))
    assert chat.answer({"choices": []}) is None


def test_a_cut_stream_ends_with_the_notice_a_stop_and_done():
    stream = ChatStream()
    stream.add({"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "la la "}}]})
    events = list(SSEParser().feed(stream.cut_ending({"loop": "content", "action": "cut"}, "\n\nnotice")))
    assert events[-1].data == b"[DONE]"
    notice, final = (orjson.loads(e.data) for e in events[:2])
    assert notice["choices"][0]["delta"]["content"] == "\n\nnotice"
    assert final["choices"][0]["finish_reason"] == "stop" and final["loopwarden"]["action"] == "cut"
    assert final["id"] == "c1"


def test_errors_in_the_openai_shape_and_the_upstream_url_keeps_base_path_and_query():
    body = orjson.loads(chat.error_body("nope", "loop_detected", "loop_detected"))
    assert body == {"error": {"message": "nope", "type": "loop_detected", "param": None, "code": "loop_detected"}}
    assert str(chat.upstream_url(Settings, "/v1/chat/completions", "a=1")) == \
        "http://upstream.test/base/v1/chat/completions?a=1"
    assert chat.max_output_tokens({"max_completion_tokens": 100, "max_tokens": 5}) == 100
    assert chat.max_output_tokens({"max_tokens": True}) is None
    assert not chat.keeps_answer({}) and chat.chain_ids({"previous_response_id": "r"}) == (None, None)
