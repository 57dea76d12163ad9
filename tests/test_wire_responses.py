"""The Responses dialect on its own: input items to the neutral conversation and back, chains, streams."""

from __future__ import annotations

import copy

import orjson
import pytest

from proxy.conversation import Message, RequestError, ToolCall
from proxy.wire.responses import ResponsesDialect, ResponsesStream
from proxy.wire.sse import SSEParser

responses = ResponsesDialect()
ITEMS = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the tests"}]},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd": ["pytest"]}'},
    {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "function_call_output", "call_id": "c1", "output": "1 failed"},
    {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
]


def test_input_items_read_as_one_assistant_turn_and_its_results():
    read = responses.read({"instructions": "You are Codex.", "input": ITEMS})
    assert read.messages == [
        Message("system", "You are Codex."), Message("user", "fix the tests"),
        Message("assistant", "", (ToolCall("c1", "shell", '{"cmd": ["pytest"]}'),
                                  ToolCall("c2", "apply_patch", "*** Begin Patch"))),
        Message("tool", "1 failed", call_id="c1"), Message("tool", "Done!", call_id="c2")]
    assert read.own_start == 1  # the instructions are not an input item: nothing goes before them


def test_a_chained_request_carries_its_history_and_only_its_own_items_take_warnings():
    history = [Message("user", "earlier"), Message("assistant", "ok")]
    read = responses.read({"input": ITEMS[4:], "previous_response_id": "resp_1"}, history)
    assert read.messages[:2] == history and read.own_start == 2
    payload = {"input": ITEMS[4:], "previous_response_id": "resp_1", "store": True}
    before = copy.deepcopy(payload)
    sent = responses.with_warnings(payload, read, [(4, "developer", "[loopwarden] stop it")])
    assert payload == before
    assert sent["input"] == ITEMS[4:] + [{"type": "message", "role": "developer", "content": "[loopwarden] stop it"}]
    assert responses.chain_ids(payload) == ("resp_1", None) and responses.keeps_answer(payload)
    assert responses.chain_ids({"conversation": {"id": "conv_9"}}) == (None, "conv_9")
    assert not responses.keeps_answer({"store": False})


def test_a_string_input_becomes_a_message_item_when_a_warning_joins_it():
    payload = {"input": "hello"}
    sent = responses.with_warnings(payload, responses.read(payload), [(1, "user", "[loopwarden] w")])
    assert sent["input"] == [{"type": "message", "role": "user", "content": "hello"},
                             {"type": "message", "role": "user", "content": "[loopwarden] w"}]


def test_an_input_that_is_neither_text_nor_items_is_refused():
    with pytest.raises(RequestError, match="'input'"):
        responses.read({"input": 5})


def test_a_cut_stream_closes_the_open_message_and_completes_the_response():
    stream = ResponsesStream()
    stream.add({"type": "response.created", "response": {"id": "resp_2", "model": "m"}, "sequence_number": 0})
    stream.add({"type": "response.output_item.added", "output_index": 0,
                "item": {"type": "message", "id": "msg_1"}, "sequence_number": 1})
    stream.add({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
                "delta": "again ", "sequence_number": 2})
    events = [orjson.loads(e.data) for e in SSEParser().feed(stream.cut_ending({"action": "cut"}, " [cut]"))]
    assert [e["type"] for e in events] == ["response.output_text.delta", "response.output_text.done",
                                           "response.content_part.done", "response.output_item.done",
                                           "response.completed"]
    assert [e["sequence_number"] for e in events] == [3, 4, 5, 6, 7]
    completed = events[-1]["response"]
    assert completed["id"] == "resp_2" and completed["status"] == "completed"
    assert completed["output"][0]["content"][0]["text"] == "again  [cut]"
    assert stream.message() == Message("assistant", "")  # nothing finished came from upstream


def test_a_json_answer_is_its_output_items():
    answer = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi"}]},
                         {"type": "local_shell_call", "call_id": "c3", "action": {"command": ["ls"]}}]}
    assert responses.answer(answer) == Message("assistant", "Hi", (
        ToolCall("c3", "local_shell", '{"command":["ls"]}'),))
    assert responses.max_output_tokens({"max_output_tokens": 64}) == 64


def test_a_result_whose_call_is_only_named_gets_the_kept_call_before_it():
    from proxy.conversation import Message, ToolCall
    from proxy.wire.responses import ResponsesDialect

    kept = {"call_1": ToolCall("call_1", "read_file", '{"path":"a.py"}')}
    payload = {"input": [{"role": "user", "content": "go"}, {"type": "item_reference", "id": "fc_1"},
                         {"type": "function_call_output", "call_id": "call_1", "output": "x = 1"},
                         {"type": "item_reference", "id": "fc_2"},
                         {"type": "function_call_output", "call_id": "call_2", "output": "unknown"}]}
    read = ResponsesDialect.read(payload, None, kept.get)
    assert read.messages == [Message("user", "go"), Message("assistant", calls=(kept["call_1"],)),
                             Message("tool", "x = 1", call_id="call_1"), Message("tool", "unknown", call_id="call_2")]
    # a warning after the named call's result goes after that result's item
    assert [anchor.item for anchor in read.anchors] == [1, 2, 3, 5]
    assert ResponsesDialect.read(payload).messages[1] == Message("tool", "x = 1", call_id="call_1")  # as before
