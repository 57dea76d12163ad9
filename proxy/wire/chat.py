"""The Chat Completions dialect: requests, answers and stream chunks to and from the neutral conversation.

The neutral conversation is chat-shaped: a list of `{"role", "content", "tool_calls"}` messages with
`role: "tool"` results. Chat Completions speaks it already, so reading a request is taking its
`messages`; the other dialects translate into it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.wire.errors import error_body


@dataclass
class Conversation:
    """A request's conversation in neutral messages, and where a message inserted at a place goes.

    `messages` may begin with history the request itself does not carry (a chained Responses request
    continues what the service keeps): those first `own_start` messages can no longer be changed.
    """

    messages: list[dict]
    own_start: int = 0
    item_ends: list[int] = field(default_factory=list)  # per own message: the dialect's index just past it

    def insert_index(self, place: int) -> int:
        """Where, in the dialect's own list, something placed before neutral message `place` goes."""
        own = place - self.own_start
        if not self.item_ends:
            return own
        return self.item_ends[own - 1] if own > 0 else 0


class RequestError(ValueError):
    """A request body the dialect cannot read; the message says which field and why."""


def message_text(message: dict) -> str:
    """The plain text of a message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def tool_calls(message: dict) -> list[dict]:
    """A message's native tool calls (whatever else a client put in the field is not one)."""
    calls = message.get("tool_calls")
    return [call for call in calls if isinstance(call, dict)] if isinstance(calls, list) else []


def sse(data: dict, event: str | None = None) -> bytes:
    """One server-sent event."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


class ChatDialect:
    name = "chat"
    path = "/chat/completions"

    @staticmethod
    def read(payload: dict, history: list[dict] | None = None) -> Conversation:
        """The request's messages: a chat request always carries its whole conversation (`history` unused)."""
        messages = payload.get("messages")
        if messages is None:
            return Conversation([])
        if not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)):
            raise RequestError("'messages' must be an array of objects")
        return Conversation(messages)

    @staticmethod
    def with_messages(payload: dict, conversation: Conversation, inserted: list[tuple[int, dict]]) -> dict:
        """The request with neutral messages inserted, each before the message at its place."""
        messages = list(payload.get("messages") or ())
        # From the last place back, so earlier places stay put; at one place, in the order given.
        for place, message in reversed(sorted(inserted, key=lambda item: item[0])):
            messages.insert(conversation.insert_index(place), message)
        return {**payload, "messages": messages}

    @staticmethod
    def warning_message(role: str, text: str) -> dict:
        return {"role": role, "content": text}

    @staticmethod
    def answer(body: dict) -> dict | None:
        """Choice 0's message of a non-streamed `chat.completion`."""
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            return message if isinstance(message, dict) else None
        return None

    @staticmethod
    def stream() -> "ChatStream":
        return ChatStream()

    error_body = staticmethod(error_body)  # the OpenAI shape


class ChatStream:
    """Rebuilds choice 0's assistant message from `chat.completion.chunk` objects, and ends a stream the
    proxy cuts the way a finished one ends.

    Tool-call arguments arrive as fragments split anywhere (even mid UTF-8
    character in the JSON text); they are joined per tool-call index.
    """

    __slots__ = ("_text", "_calls", "finish_reason", "usage", "model", "response_id")
    stop_is_cut = False  # the stop reached mid-stream ends with an error event

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.model: str | None = None
        self.response_id: str | None = None

    def add(self, chunk: dict, event: str | None = None) -> tuple[str, bool]:
        """Take one chunk; return choice 0's new text and whether a tool call began."""
        if self.model is None:
            self.model = chunk.get("model")
            self.response_id = chunk.get("id")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        text = ""
        call_started = False
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                self._text.append(piece)
                text += piece
            for fragment in delta.get("tool_calls") or ():
                index = fragment.get("index", len(self._calls))
                call = self._calls.get(index)
                if call is None:
                    call = self._calls[index] = {
                        "id": fragment.get("id"),
                        "type": "function",
                        "function": {"name": "", "arguments": ""},
                    }
                    call_started = True
                elif fragment.get("id") and not call["id"]:
                    call["id"] = fragment["id"]
                function = fragment.get("function") or {}
                if function.get("name"):
                    call["function"]["name"] += function["name"]
                if function.get("arguments"):
                    call["function"]["arguments"] += function["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return text, call_started

    @property
    def text(self) -> str:
        return "".join(self._text)

    def message(self) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self._calls:
            message["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        return message

    def cut_ending(self, marker: dict, notice: str | None) -> bytes:
        """The last chunks of a cut stream: the notice as one more text delta, a clean stop, `[DONE]`."""
        head = {"id": self.response_id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.model}
        ending = b""
        if notice:
            ending = sse({**head, "choices": [{"index": 0, "delta": {"content": notice}, "logprobs": None,
                                               "finish_reason": None}]})
        final = {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                 "loopwarden": marker}
        return ending + sse(final) + b"data: [DONE]\n\n"

    def stop_ending(self, error: dict) -> bytes:
        """The last event of a stream ended by the stop: the error, which the SDKs raise."""
        return sse({"error": error})
