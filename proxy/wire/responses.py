"""The Responses dialect (`POST /v1/responses`): input items, output items and `response.*` stream events
to and from the neutral conversation.

`instructions` is the system prompt. A `message` item is a message; `function_call`, `custom_tool_call`
and `local_shell_call` items are the assistant's tool calls (consecutive ones make one turn), answered
by their `*_output` items, which become tool results. `reasoning`, `item_reference` and every other item
type are forwarded untouched and ignored for detection. Pure code, no I/O.
"""

from __future__ import annotations

import time
from typing import Any

from proxy.wire.chat import Conversation, RequestError, message_text, sse
from proxy.wire.errors import error_body

CALL_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output", "local_shell_call_output"})


def _call_id(item: dict) -> str:
    return str(item.get("call_id") or item.get("id") or "")


def tool_call(item: dict) -> dict:
    """A call item as a neutral tool call."""
    kind = item.get("type")
    if kind == "custom_tool_call":
        name, arguments = item.get("name"), item.get("input")
    elif kind == "local_shell_call":
        name, arguments = "local_shell", item.get("action")
    else:
        name, arguments = item.get("name"), item.get("arguments")
    if not isinstance(arguments, str):
        arguments = arguments if isinstance(arguments, dict | list) else ""
    return {"id": _call_id(item), "type": "function",
            "function": {"name": name if isinstance(name, str) else "", "arguments": arguments}}


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(p.get("text", "") for p in output if isinstance(p, dict) and isinstance(p.get("text"), str))
    if isinstance(output, dict) and isinstance(output.get("output"), str):
        return output["output"]
    return ""


def items_to_messages(items: list, first_index: int = 0) -> tuple[list[dict], list[int]]:
    """Input or output items as neutral messages, and per message the item index just past it."""
    messages: list[dict] = []
    ends: list[int] = []
    turn_open = False  # the last message is an assistant turn that further call items join
    for index, item in enumerate(items, start=first_index):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message" if "role" in item else None)
        if not isinstance(kind, str):
            continue  # not an item the service would take; forwarded, and its answer says so
        if kind == "message":
            role = item.get("role")
            message = {"role": role if isinstance(role, str) else "user", "content": message_text(item)}
            messages.append(message)
            ends.append(index + 1)
            turn_open = message["role"] == "assistant"
        elif kind in CALL_TYPES:
            if turn_open:
                messages[-1].setdefault("tool_calls", []).append(tool_call(item))
                ends[-1] = index + 1
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [tool_call(item)]})
                ends.append(index + 1)
                turn_open = True
        elif kind in OUTPUT_TYPES:
            messages.append({"role": "tool", "tool_call_id": _call_id(item), "content": _output_text(item.get("output"))})
            ends.append(index + 1)
            turn_open = False
        # reasoning, item_reference and the rest: not part of the conversation the rules read
    return messages, ends


def conversation_of(payload: dict, history: list[dict] | None = None) -> Conversation:
    """The request's conversation: its instructions (the system prompt), what the chain before it held
    (`history`), then its own input items. Only the input items are the request's own: they are what a
    warning can be inserted among, and what the service will keep."""
    instructions = payload.get("instructions")
    raw_input = payload.get("input")
    messages: list[dict] = []
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    messages += history or []
    own_start = len(messages)
    if isinstance(raw_input, str):
        messages.append({"role": "user", "content": raw_input})
        ends = [1]
    elif isinstance(raw_input, list):
        own, ends = items_to_messages(raw_input)
        messages += own
    elif raw_input is None:
        ends = []
    else:
        raise RequestError("'input' must be a string or an array of items")
    return Conversation(messages, own_start, ends)


class ResponsesDialect:
    name = "responses"
    path = "/responses"

    @staticmethod
    def read(payload: dict, history: list[dict] | None = None) -> Conversation:
        return conversation_of(payload, history)

    @staticmethod
    def with_messages(payload: dict, conversation: Conversation, inserted: list[tuple[int, dict]]) -> dict:
        """The request with message items inserted, each after the items of the message before its place."""
        raw_input = payload.get("input")
        items = [{"type": "message", "role": "user", "content": raw_input}] if isinstance(raw_input, str) \
            else list(raw_input or ())
        # From the last place back, so earlier places stay put; at one place, in the order given.
        for place, message in reversed(sorted(inserted, key=lambda item: item[0])):
            items.insert(conversation.insert_index(place), message)
        return {**payload, "input": items}

    @staticmethod
    def warning_message(role: str, text: str) -> dict:
        return {"type": "message", "role": role, "content": text}

    @staticmethod
    def answer(body: dict) -> dict | None:
        """The assistant's turn in a JSON `response`: its output items as one neutral message."""
        output = body.get("output")
        if not isinstance(output, list):
            return None
        return assistant_message(output)

    @staticmethod
    def stream() -> "ResponsesStream":
        return ResponsesStream()

    error_body = staticmethod(error_body)  # the OpenAI shape


def assistant_message(output: list) -> dict:
    text = []
    calls = []
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            text.append(message_text(item))
        elif item.get("type") in CALL_TYPES:
            calls.append(tool_call(item))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    return message


class ResponsesStream:
    """Follows `response.*` events: the text as it streams, calls as they begin, the finished turn; and
    ends a stream the proxy cuts the way a finished response ends."""

    stop_is_cut = False  # the stop reached mid-stream ends with an error event

    def __init__(self) -> None:
        self.response: dict = {}
        self._text: list[str] = []
        self._done_items: dict[int, dict] = {}  # output index -> finished item
        self._open: dict | None = None  # the message item being written: id, output_index, content_index
        self._item_text: list[str] = []
        self._sequence = -1
        self._final: list | None = None
        self.finished = False  # the response's last event has been seen

    @property
    def response_id(self) -> str | None:
        return self.response.get("id")

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def model(self) -> str | None:
        return self.response.get("model")

    @property
    def usage(self) -> dict | None:
        return self.response.get("usage")

    def add(self, data: dict, event: str | None = None) -> tuple[str, bool]:
        """Take one event; return the new output text and whether a tool call began."""
        kind = data.get("type") or event
        sequence = data.get("sequence_number")
        if isinstance(sequence, int) and sequence > self._sequence:
            self._sequence = sequence
        if kind == "response.output_text.delta":
            delta = data.get("delta")
            if isinstance(delta, str) and delta:
                self._text.append(delta)
                self._item_text.append(delta)
                if self._open is None or self._open.get("id") != data.get("item_id"):
                    self._open = {"id": data.get("item_id"), "output_index": data.get("output_index", 0),
                                  "content_index": data.get("content_index", 0)}
                    self._item_text = [delta]
                return delta, False
            return "", False
        if kind == "response.output_item.added":
            item = data.get("item") or {}
            if item.get("type") == "message":
                self._open = {"id": item.get("id"), "output_index": data.get("output_index", 0), "content_index": 0}
                self._item_text = []
            return "", item.get("type") in CALL_TYPES
        if kind == "response.output_item.done":
            item = data.get("item")
            if isinstance(item, dict):
                self._done_items[data.get("output_index", len(self._done_items))] = item
                if self._open is not None and item.get("id") == self._open.get("id"):
                    self._open = None
            return "", False
        if kind == "response.created" or kind == "response.in_progress":
            if isinstance(data.get("response"), dict):
                self.response = data["response"]
            return "", False
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self.finished = True
            response = data.get("response")
            if isinstance(response, dict):
                self.response = response
                if isinstance(response.get("output"), list):
                    self._final = response["output"]
        return "", False

    def message(self) -> dict:
        output = self._final if self._final is not None else [self._done_items[i] for i in sorted(self._done_items)]
        return assistant_message(output)

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence

    def cut_ending(self, marker: dict, notice: str | None) -> bytes:
        """End as a finished response ends: the notice, the open item's done events, `response.completed`."""
        out = b""
        output = [self._done_items[i] for i in sorted(self._done_items)]
        if self._open is not None:
            item_id, index, part_index = self._open["id"], self._open["output_index"], self._open["content_index"]
            if notice:
                out += sse({"type": "response.output_text.delta", "item_id": item_id, "output_index": index,
                            "content_index": part_index, "delta": notice, "logprobs": [],
                            "sequence_number": self._next()}, "response.output_text.delta")
                self._item_text.append(notice)
            text = "".join(self._item_text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item = {"id": item_id, "type": "message", "status": "completed", "role": "assistant", "content": [part]}
            out += sse({"type": "response.output_text.done", "item_id": item_id, "output_index": index,
                        "content_index": part_index, "text": text, "logprobs": [], "sequence_number": self._next()},
                       "response.output_text.done")
            out += sse({"type": "response.content_part.done", "item_id": item_id, "output_index": index,
                        "content_index": part_index, "part": part, "sequence_number": self._next()},
                       "response.content_part.done")
            out += sse({"type": "response.output_item.done", "output_index": index, "item": item,
                        "sequence_number": self._next()}, "response.output_item.done")
            output.append(item)
        response = {**self._response_base(), "status": "completed", "output": output}
        return out + sse({"type": "response.completed", "response": response, "sequence_number": self._next(),
                          "loopwarden": marker}, "response.completed")

    def stop_ending(self, error: dict) -> bytes:
        """The stop reached mid-stream: an `error` event (which openai-python raises as APIError carrying
        `loop_detected`), then `response.failed` (which ends the turn for clients that read that)."""
        out = sse({"type": "error", "code": error.get("code"), "message": error.get("message"), "param": None,
                   "error": error, "sequence_number": self._next()}, "error")
        response = {**self._response_base(), "status": "failed", "output": [],
                    "error": {"code": error.get("code"), "message": error.get("message")}}
        return out + sse({"type": "response.failed", "response": response, "sequence_number": self._next()},
                         "response.failed")

    def _response_base(self) -> dict:
        base = dict(self.response)
        base.setdefault("id", f"resp_cut_{int(time.time() * 1000)}")
        base.setdefault("object", "response")
        base.setdefault("created_at", int(time.time()))
        return base
