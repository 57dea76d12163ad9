"""The Responses dialect (`POST /v1/responses`): input items, output items and `response.*` stream events
to and from the neutral conversation.

`instructions` is the system prompt. A `message` item is a message; `function_call`, `custom_tool_call`
and `local_shell_call` items are the assistant's tool calls (consecutive ones make one turn), answered
by their `*_output` items, which become tool results. `reasoning`, `item_reference` and every other item
type are forwarded untouched and ignored for detection. A conversation continued with
`previous_response_id` or a `conversation` id is one the service keeps. Pure code, no I/O.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from proxy.conversation import ASSISTANT, TOOL, USER, Anchor, Conversation, ItemReading, Message, Messages, \
    ToolCall, arguments_text, insert_placed, resume, text_of
from proxy.wire.chat import OpenAIDialect
from proxy.wire.dialect import RequestError, positive_int, sse
from proxy.wire.errors import error_object

CALL_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output", "local_shell_call_output"})


def _call_id(item: dict) -> str:
    return str(item.get("call_id") or item.get("id") or "")


def tool_call(item: dict) -> ToolCall:
    """A call item as a neutral tool call."""
    kind = item.get("type")
    if kind == "custom_tool_call":
        name, arguments = item.get("name"), item.get("input")
    elif kind == "local_shell_call":
        name, arguments = "local_shell", item.get("action")
    else:
        name, arguments = item.get("name"), item.get("arguments")
    if not isinstance(arguments, str):
        arguments = arguments_text(arguments) if isinstance(arguments, dict | list) else ""
    return ToolCall(_call_id(item), name if isinstance(name, str) else "", arguments)


def _output_text(output: Any) -> str:
    if isinstance(output, dict) and isinstance(output.get("output"), str):
        return output["output"]
    return text_of(output)


def read_items(items: list, into: Messages, kept_call: Callable[[str], ToolCall | None] | None = None,
               marks: list[int] | None = None) -> None:
    """Input items as neutral messages, each anchored just past its last item. A result whose call the input
    only names (an `item_reference`, as the AI SDK sends a kept response's call) gets that call, when
    `kept_call` knows it, as the assistant's turn before it. `marks`: an `ItemReading`'s, of the items read into
    `into` already (reading goes on after them); each item's is added (-1 after an assistant turn that a next
    call item would join)."""
    marks = [] if marks is None else marks
    turn_open = False  # the last message is an assistant turn that further call items join
    called = {call.id for message in into.messages for call in message.calls} if kept_call is not None else ()
    for index in range(len(marks), len(items)):
        item = items[index]
        kind = item.get("type", "message" if "role" in item else None) if isinstance(item, dict) else None
        if kind == "message":
            role = item.get("role")
            message = Message(role if isinstance(role, str) else USER, text_of(item.get("content")))
            into.add(message, Anchor(index + 1))
            turn_open = message.role == ASSISTANT
        elif not isinstance(kind, str):
            pass  # not an item the service would take; forwarded, and its answer says so
        elif kind in CALL_TYPES:
            if kept_call is not None:
                called.add(_call_id(item))
            if turn_open:
                last = into.messages[-1]
                into.messages[-1] = Message(ASSISTANT, last.text, last.calls + (tool_call(item),))
                into.anchors[-1] = Anchor(index + 1)
            else:
                into.add(Message(ASSISTANT, calls=(tool_call(item),)), Anchor(index + 1))
                turn_open = True
        elif kind in OUTPUT_TYPES:
            call_id = _call_id(item)
            if kept_call is not None and call_id not in called and (call := kept_call(call_id)) is not None:
                into.add(Message(ASSISTANT, calls=(call,)), Anchor(index))  # the call it named, just before
                called.add(call_id)
            into.add(Message(TOOL, _output_text(item.get("output")), call_id=call_id), Anchor(index + 1))
            turn_open = False
        # reasoning, item_reference and the rest: not part of the conversation the rules read
        marks.append(-1 if turn_open else len(into.messages))


def _id(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) and value else None


class ResponsesDialect(OpenAIDialect):
    name = "responses"
    items_key = "input"

    @staticmethod
    def wrote(body: dict) -> bool:
        return "input" in body and "messages" not in body

    @staticmethod
    def read(payload: dict, history: list[Message] | None = None, kept_call=None, before=None) -> Conversation:
        """Its instructions (the system prompt), what the chain before it held (`history`), then its own input
        items (from the first one `before` did not read: `(items reused, the reading of the request they come
        from)`). Only the input items are the request's own: they are what a warning can be inserted among, and
        what the service will keep."""
        instructions = payload.get("instructions")
        raw_input = payload.get("input")
        system = instructions if isinstance(instructions, str) and instructions else ""
        reused, reading = before if before is not None and not history else (0, None)
        own, marks = resume(reading, reused, system)
        if not marks:
            if system:
                own.messages.append(Message("system", system))
            own.messages += history or []
        own_start = len(own.messages) - len(own.anchors) if marks else len(own.messages)
        if isinstance(raw_input, str):
            own.add(Message(USER, raw_input), Anchor(1))
        elif isinstance(raw_input, list):
            read_items(raw_input, own, kept_call, marks)
            return Conversation(own.messages, own_start, own.anchors,
                                ItemReading(system, own.messages, own.anchors, marks) if not history else None)
        elif raw_input is not None:
            raise RequestError("'input' must be a string or an array of items")
        return Conversation(own.messages, own_start, own.anchors)

    @staticmethod
    def with_warnings(payload: dict, conversation: Conversation, warnings: list[tuple[int, str, str]]) -> dict:
        """The request with message items inserted, each after the items of the message before its place."""
        raw_input = payload.get("input")
        items = [{"type": "message", "role": "user", "content": raw_input}] if isinstance(raw_input, str) \
            else raw_input or []
        placed = [(place, {"type": "message", "role": role, "content": text}) for place, role, text in warnings]
        return {**payload, "input": insert_placed(items, conversation, placed)}

    @staticmethod
    def answer(body: dict) -> Message | None:
        """The assistant's turn in a JSON `response`: its output items as one neutral message."""
        output = body.get("output")
        return assistant_message(output) if isinstance(output, list) else None

    @staticmethod
    def reasoning(body: dict) -> str:
        """The text of the answer's reasoning items: their summaries and their `reasoning_text` parts."""
        output = body.get("output")
        return "".join(reasoning_of(item) for item in output if isinstance(item, dict)
                       and item.get("type") == "reasoning") if isinstance(output, list) else ""

    @staticmethod
    def recorded_reasoning(item: dict) -> str:
        return reasoning_of(item) if item.get("type") == "reasoning" else ""

    @staticmethod
    def stream() -> "ResponsesStream":
        return ResponsesStream()

    @staticmethod
    def stream_error(message: str, type_: str, code: str | None = None) -> bytes:
        """The upstream failed mid-stream (the events it sent are not known here: not numbered)."""
        return failure_events(error_object(message, type_, code), {})

    @staticmethod
    def max_output_tokens(payload: dict) -> int | None:
        return positive_int(payload.get("max_output_tokens"))

    @staticmethod
    def chain_ids(payload: dict) -> tuple[str | None, str | None]:
        return _id(payload.get("previous_response_id")), _id(payload.get("conversation"))

    @staticmethod
    def keeps_answer(payload: dict) -> bool:
        return payload.get("store") is not False


def assistant_message(output: list) -> Message:
    text = []
    calls = []
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            text.append(text_of(item.get("content")))
        elif item.get("type") in CALL_TYPES:
            calls.append(tool_call(item))
    return Message(ASSISTANT, "".join(text), tuple(calls))


def reasoning_of(item: dict) -> str:
    parts = [p for key in ("summary", "content") if isinstance(item.get(key), list) for p in item[key]]
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


_REASONING_DELTAS = {"response.reasoning_summary_text.delta": ("summary", "summary_index"),
                     "response.reasoning_text.delta": ("content", "content_index")}
# The events that close a reasoning item's part: (where, index key, what the event closes).
_REASONING_DONE = {"response.reasoning_summary_text.done": ("summary", "summary_index", "text"),
                   "response.reasoning_summary_part.done": ("summary", "summary_index", "part"),
                   "response.reasoning_text.done": ("content", "content_index", "text"),
                   "response.content_part.done": ("content", "content_index", "part")}


class ResponsesStream:
    """Follows `response.*` events: the text as it streams (the reasoning apart), calls as they begin, the
    finished turn; and ends a stream the proxy cuts the way a finished response ends."""

    stop_is_cut = False  # the stop reached mid-stream ends with an error event

    def __init__(self) -> None:
        self.response: dict = {}
        self.last_reasoning = ""
        self._reasoning: list[str] = []
        # The reasoning item being written: its added item, output index, and its parts' texts and done events
        # sent, per (summary|content, index).
        self._thinking: dict | None = None
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
    def reasoning_text(self) -> str:
        return "".join(self._reasoning)

    @property
    def model(self) -> str | None:
        return self.response.get("model")

    @property
    def usage(self) -> dict | None:
        return self.response.get("usage")

    def add(self, data: dict, event: str | None = None) -> tuple[str, bool]:
        """Take one event; return the new output text and whether a tool call began."""
        kind = data.get("type") or event
        self.last_reasoning = ""
        sequence = data.get("sequence_number")
        if isinstance(sequence, int) and sequence > self._sequence:
            self._sequence = sequence
        if kind in _REASONING_DELTAS:
            self._reasoning_delta(kind, data)
            return "", False
        if kind in _REASONING_DONE:
            self._reasoning_done(kind, data)
            if kind != "response.content_part.done":
                return "", False
        if kind == "response.output_text.delta":
            return self._text_delta(data), False
        if kind == "response.output_item.added":
            item = data.get("item") or {}
            if item.get("type") == "message":
                self._open = {"id": item.get("id"), "output_index": data.get("output_index", 0), "content_index": 0}
                self._item_text = []
            elif item.get("type") == "reasoning":
                self._thinking = {"id": item.get("id"), "output_index": data.get("output_index", 0), "item": item,
                                  "parts": {}}
            return "", item.get("type") in CALL_TYPES
        if kind == "response.output_item.done":
            self._item_done(data)
        elif kind == "response.created" or kind == "response.in_progress":
            if isinstance(data.get("response"), dict):
                self.response = data["response"]
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self.finished = True
            response = data.get("response")
            if isinstance(response, dict):
                self.response = response
                if isinstance(response.get("output"), list):
                    self._final = response["output"]
        return "", False

    def _reasoning_delta(self, kind: str, data: dict) -> None:
        delta = data.get("delta")
        thinking = self._thinking
        if isinstance(delta, str) and delta:
            self._reasoning.append(delta)
            self.last_reasoning = delta
            if thinking is not None and thinking["id"] == data.get("item_id"):
                where, index_key = _REASONING_DELTAS[kind]
                index = data.get(index_key, 0)
                part = thinking["parts"].setdefault((where, index), {"text": [], "done": set()})
                part["text"].append(delta)

    def _reasoning_done(self, kind: str, data: dict) -> None:
        thinking = self._thinking
        where, index_key, closes = _REASONING_DONE[kind]
        if thinking is not None and thinking["id"] == data.get("item_id"):
            part = thinking["parts"].get((where, data.get(index_key, 0)))
            if part is not None:
                part["done"].add(closes)

    def _text_delta(self, data: dict) -> str:
        delta = data.get("delta")
        if not (isinstance(delta, str) and delta):
            return ""
        self._text.append(delta)
        self._item_text.append(delta)
        if self._open is None or self._open.get("id") != data.get("item_id"):
            self._open = {"id": data.get("item_id"), "output_index": data.get("output_index", 0),
                          "content_index": data.get("content_index", 0)}
            self._item_text = [delta]
        return delta

    def _item_done(self, data: dict) -> None:
        item = data.get("item")
        if isinstance(item, dict):
            self._done_items[data.get("output_index", len(self._done_items))] = item
            if self._open is not None and item.get("id") == self._open.get("id"):
                self._open = None
            if self._thinking is not None and item.get("id") == self._thinking["id"]:
                self._thinking = None

    def message(self) -> Message:
        output = self._final if self._final is not None else [self._done_items[i] for i in sorted(self._done_items)]
        return assistant_message(output)

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence

    def cut_ending(self, marker: dict, notice: str | None) -> bytes:
        """End as a finished response ends: the open reasoning item's done events (its text so far, no
        `encrypted_content`), the notice as the answer's last text (in the open message item, or in one of its
        own), the open item's done events, `response.completed`."""
        out = b""
        output = dict(self._done_items)
        if self._thinking is not None:
            item, out = self._close_reasoning(self._thinking)
            output[self._thinking["output_index"]] = item
            self._thinking = None
        if self._open is None and notice:
            index = max(list(output) + [self._open_index()], default=-1) + 1
            item_id = f"msg_cut_{self.response_id or int(time.time() * 1000)}"
            out += sse({"type": "response.output_item.added", "output_index": index,
                        "item": {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant",
                                 "content": []}, "sequence_number": self._next()}, "response.output_item.added")
            out += sse({"type": "response.content_part.added", "item_id": item_id, "output_index": index,
                        "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [],
                                                     "logprobs": []},
                        "sequence_number": self._next()}, "response.content_part.added")
            self._open = {"id": item_id, "output_index": index, "content_index": 0}
            self._item_text = []
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
            output[index] = item
        response = {**self._response_base(), "status": "completed", "output": [output[i] for i in sorted(output)]}
        return out + sse({"type": "response.completed", "response": response, "sequence_number": self._next(),
                          "loopwarden": marker}, "response.completed")

    def _open_index(self) -> int:
        return self._open["output_index"] if self._open is not None else -1

    def _close_reasoning(self, thinking: dict) -> tuple[dict, bytes]:
        """The done events of a reasoning item cut part way: each part's text as it stands."""
        out = b""
        item_id, index = thinking["id"], thinking["output_index"]
        texts = {key: "".join(part["text"]) for key, part in thinking["parts"].items()}
        for (where, number), part in sorted(thinking["parts"].items()):
            text = texts[where, number]
            if where == "summary":
                names = ("response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
                         "summary_index", "summary_text")
            else:
                names = ("response.reasoning_text.done", "response.content_part.done", "content_index",
                         "reasoning_text")
            text_done, part_done, index_key, part_type = names
            if "text" not in part["done"]:
                out += sse({"type": text_done, "item_id": item_id, "output_index": index, index_key: number,
                            "text": text, "sequence_number": self._next()}, text_done)
            if "part" not in part["done"]:
                out += sse({"type": part_done, "item_id": item_id, "output_index": index, index_key: number,
                            "part": {"type": part_type, "text": text}, "sequence_number": self._next()}, part_done)
        item = {key: value for key, value in thinking["item"].items() if key != "encrypted_content"}
        item["summary"] = [{"type": "summary_text", "text": texts[key]} for key in sorted(texts) if key[0] == "summary"]
        content = [{"type": "reasoning_text", "text": texts[key]} for key in sorted(texts) if key[0] == "content"]
        if content:
            item["content"] = content
        if "status" in item:
            item["status"] = "completed"
        out += sse({"type": "response.output_item.done", "output_index": index, "item": item,
                    "sequence_number": self._next()}, "response.output_item.done")
        return item, out

    def stop_ending(self, error: dict) -> bytes:
        """The stop reached mid-stream."""
        return failure_events(error, self.response, self._next(), self._next())

    def _response_base(self) -> dict:
        return response_base(self.response)


def response_base(response: dict) -> dict:
    """The response a stream announced (or one named here when it announced none)."""
    base = dict(response)
    base.setdefault("id", f"resp_cut_{int(time.time() * 1000)}")
    base.setdefault("object", "response")
    base.setdefault("created_at", int(time.time()))
    return base


def failure_events(error: dict, response: dict, sequence: int | None = None,
                   next_sequence: int | None = None) -> bytes:
    """A stream ended on an error: an `error` event (which openai-python raises as APIError, carrying the
    error's code), then `response.failed` (which ends the turn for clients that read that). Numbered when the
    stream's numbering is known."""
    numbered = sequence is not None
    out = sse({"type": "error", "code": error.get("code"), "message": error.get("message"), "param": None,
               "error": error, **({"sequence_number": sequence} if numbered else {})}, "error")
    failed = {**response_base(response), "status": "failed", "output": [],
              "error": {"code": error.get("code"), "message": error.get("message")}}
    return out + sse({"type": "response.failed", "response": failed,
                      **({"sequence_number": next_sequence} if numbered else {})}, "response.failed")
