"""The Anthropic Messages dialect on its own: blocks to the neutral conversation and back, streams, errors."""

from __future__ import annotations

import copy

import orjson

from proxy.conversation import Message, ToolCall
from proxy.wire.messages import MessagesDialect, MessagesStream
from proxy.wire.sse import SSEParser

messages_api = MessagesDialect()
PAYLOAD = {
    "model": "claude", "max_tokens": 1024, "tools": [{"name": "Read"}],
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>files</system-reminder>"},
                                     {"type": "text", "text": "fix the bug"}, {"type": "text", "text": "in a.py"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"},
                                          {"type": "tool_use", "id": "tu1", "name": "Read",
                                           "input": {"file_path": "a.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "is_error": True,
                                      "content": [{"type": "text", "text": "File does not exist."}],
                                      "cache_control": {"type": "ephemeral"}}]},
    ],
}


def test_blocks_read_as_neutral_messages():
    read = messages_api.read(PAYLOAD)
    assert read.messages == [
        Message("system", "You are Claude Code."), Message("system", "<system-reminder>files</system-reminder>"),
        Message("user", "fix the bug\nin a.py"),
        Message("assistant", "", (ToolCall("tu1", "Read", '{"file_path":"a.py"}'),)),
        Message("tool", "File does not exist.", call_id="tu1", failed=True)]


def test_a_warning_is_a_text_block_after_the_tool_result_and_nothing_else_changes():
    before = copy.deepcopy(PAYLOAD)
    read = messages_api.read(PAYLOAD)
    sent = messages_api.with_warnings(PAYLOAD, read, [(5, "system", "[loopwarden] warned")])
    assert PAYLOAD == before
    last = sent["messages"][2]["content"]
    assert last[0] == PAYLOAD["messages"][2]["content"][0]  # cache_control and all
    assert last[1] == {"type": "text", "text": "[loopwarden] warned"}
    assert sent["system"] == PAYLOAD["system"] and sent["messages"][:2] == PAYLOAD["messages"][:2]


def test_a_warning_after_an_assistant_turn_is_a_user_message_of_its_own():
    payload = {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "working"}]}
    sent = messages_api.with_warnings(payload, messages_api.read(payload), [(2, "system", "[loopwarden] w")])
    assert sent["messages"][2] == {"role": "user", "content": [{"type": "text", "text": "[loopwarden] w"}]}


def test_a_cut_stream_closes_the_block_and_ends_the_turn_without_an_error_event():
    stream = MessagesStream()
    for event in ({"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {}}},
                  {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                  {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "la "}}):
        stream.add(event)
    events = list(SSEParser().feed(stream.cut_ending({"action": "cut"}, "notice")))
    assert [e.event for e in events] == ["content_block_delta", "content_block_stop", "message_delta",
                                         "message_stop"]
    assert orjson.loads(events[2].data)["delta"]["stop_reason"] == "end_turn"
    assert stream.stop_is_cut and not stream.finished


def test_errors_in_anthropics_shape_and_requests_claimed_by_their_version_header():
    assert orjson.loads(messages_api.error_body("no", "loop_detected")) == {
        "type": "error", "error": {"type": "loop_detected", "message": "no"}}
    event = next(iter(SSEParser().feed(messages_api.stream_error("down", "api_error"))))
    assert event.event == "error" and orjson.loads(event.data)["error"]["message"] == "down"
    assert messages_api.claims({"anthropic-version": "2023-06-01"}, {})
    assert not messages_api.claims({}, {})

    class Settings:
        anthropic_upstream_url = "https://api.anthropic.test/v1/"
    assert str(messages_api.upstream_url(Settings, "/v1/messages", "beta=true")) == \
        "https://api.anthropic.test/v1/messages?beta=true"
    assert messages_api.is_side_request({"messages": []}) and not messages_api.is_side_request(PAYLOAD)
