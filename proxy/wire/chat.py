"""The Chat Completions dialect: requests, answers and stream chunks to and from the neutral conversation.

Its messages are the neutral conversation's stored form already (`role`, `content`, `tool_calls`,
`tool_call_id`), so reading a request is reading each message; a warning is one more message. Pure code,
no I/O.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from multidict import CIMultiDict
from yarl import URL

from proxy.conversation import ASSISTANT, Conversation, Message, ToolCall, from_record, insert_placed
from proxy.wire.dialect import RequestError, join_url, positive_int, sse
from proxy.wire.errors import error_body, sse_error_event


class OpenAIDialect:
    """What the OpenAI dialects share: the upstream, its bearer key, the error shape."""

    provider = "openai"

    @staticmethod
    def claims(headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
        return False  # the default upstream: it takes what no other dialect claims

    @staticmethod
    def wrote(body: dict) -> bool:
        return False

    @staticmethod
    def upstream_url(settings, raw_path: str, raw_query: str) -> URL:
        """UPSTREAM_URL is the base of the `/v1` paths (its own path ends where `/v1` does)."""
        return join_url(settings.upstream_url, raw_path.removeprefix("/v1"), raw_query)

    @staticmethod
    def authorize(headers: CIMultiDict[str], settings) -> None:
        if settings.upstream_api_key:
            headers["Authorization"] = f"Bearer {settings.upstream_api_key}"

    error_body = staticmethod(error_body)
    stream_error = staticmethod(sse_error_event)

    @staticmethod
    def model(payload: dict, raw_path: str) -> str | None:
        model = payload.get("model")
        return model if isinstance(model, str) else None

    @staticmethod
    def chain_ids(payload: dict) -> tuple[str | None, str | None]:
        return None, None

    @staticmethod
    def keeps_answer(payload: dict) -> bool:
        return False

    @staticmethod
    def is_side_request(payload: dict) -> bool:
        return False


class ChatDialect(OpenAIDialect):
    name = "chat"

    @staticmethod
    def wrote(body: dict) -> bool:
        return "messages" in body

    @staticmethod
    def read(payload: dict, history: list[Message] | None = None) -> Conversation:
        """The request's messages: a chat request always carries its whole conversation (`history` unused)."""
        messages = payload.get("messages")
        if messages is None:
            return Conversation([])
        if not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)):
            raise RequestError("'messages' must be an array of objects")
        return Conversation([from_record(m) for m in messages])

    @staticmethod
    def with_warnings(payload: dict, conversation: Conversation, warnings: list[tuple[int, str, str]]) -> dict:
        placed = [(place, {"role": role, "content": text}) for place, role, text in warnings]
        return {**payload, "messages": insert_placed(payload.get("messages") or [], conversation, placed)}

    @staticmethod
    def answer(body: dict) -> Message | None:
        """Choice 0's message of a non-streamed `chat.completion`."""
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            return from_record({**message, "role": ASSISTANT}) if isinstance(message, dict) else None
        return None

    @staticmethod
    def stream() -> "ChatStream":
        return ChatStream()

    @staticmethod
    def max_output_tokens(payload: dict) -> int | None:
        return positive_int(payload.get("max_completion_tokens")) or positive_int(payload.get("max_tokens"))


class ChatStream:
    """Rebuilds choice 0's assistant message from `chat.completion.chunk` objects, and ends a stream the
    proxy cuts the way a finished one ends.

    Tool-call arguments arrive as fragments split anywhere (even mid UTF-8
    character in the JSON text); they are joined per tool-call index.
    """

    __slots__ = ("_text", "_calls", "finish_reason", "usage", "model", "response_id")
    stop_is_cut = False  # the stop reached mid-stream ends with an error event

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

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

    def message(self) -> Message:
        calls = tuple(ToolCall(str(call["id"] or ""), call["function"]["name"], call["function"]["arguments"] or "")
                      for call in (self._calls[i] for i in sorted(self._calls)))
        return Message(ASSISTANT, self.text, calls)

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
