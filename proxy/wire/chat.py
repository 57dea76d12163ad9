"""The Chat Completions dialect: requests, answers and stream chunks to and from the neutral conversation.

Its messages are the neutral conversation's stored form already (`role`, `content`, `tool_calls`,
`tool_call_id`), so reading a request is reading each message; a warning is one more message. Pure code,
no I/O.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from yarl import URL

from proxy.conversation import ASSISTANT, Conversation, LazyMessages, Message, ToolCall, from_record, insert_placed
from proxy.wire.dialect import Credentials, DialectDefaults, JudgeCall, JudgeQuestion, RequestError, counted, join_url, \
    positive_int, sse
from proxy.wire.errors import error_body, sse_error_event

_AUTHORIZATION = frozenset({b"authorization"})


class OpenAIDialect(DialectDefaults):
    """What the OpenAI dialects share: the upstream, its bearer key, the error shape."""

    provider = "openai"
    base_url_fix = "set the client's OpenAI base URL (OPENAI_BASE_URL, base_url) to {base}/v1, with /v1 once"
    not_found_type = "invalid_request_error"

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
    def upstream_key(settings) -> str | None:
        return settings.upstream_api_key

    @staticmethod
    def credentials(settings) -> Credentials | None:
        if settings.upstream_api_key:
            return _AUTHORIZATION, b"Authorization", f"Bearer {settings.upstream_api_key}".encode()
        return None

    error_body = staticmethod(error_body)
    stream_error = staticmethod(sse_error_event)

    @staticmethod
    def judge_call(question: JudgeQuestion, key: str, attempt: int) -> JudgeCall | None:
        """Chat Completions (the Responses API's sessions too): the verdict's schema first, then any JSON object,
        then the prompt's words alone, for backends that refuse a response format."""
        if attempt > 2:
            return None
        body = {"model": question.model, "temperature": 0,
                "messages": [{"role": "system", "content": question.system},
                             {"role": "user", "content": question.shown}]}
        if attempt == 0:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "loop_verdict", "strict": True,
                                                                              "schema": question.schema}}
        elif attempt == 1:
            body["response_format"] = {"type": "json_object"}
        return JudgeCall("/v1/chat/completions", {"Authorization": f"Bearer {key}"} if key else {}, body)

    @staticmethod
    def judge_reply(body: dict) -> tuple[str, int]:
        choices = body.get("choices")
        message = choices[0].get("message") if isinstance(choices, list) and choices and \
            isinstance(choices[0], dict) else None
        text = message.get("content") if isinstance(message, dict) else None
        return (text if isinstance(text, str) else ""), counted(body.get("usage"), "total_tokens") or 0


OPEN_THINK, CLOSE_THINK = "<think>", "</think>"
_START, _THINKING, _ANSWER = 0, 1, 2


class ThinkTags:
    """Splits `content` into the reasoning a model writes inside `<think>…</think>` at its start (servers that
    parse no reasoning pass it on so) and the answer, however the tags fall across deltas: a piece that may be
    the start of a tag is held until the next delta says."""

    __slots__ = ("_state", "_held")

    def __init__(self) -> None:
        self._state = _START
        self._held = ""

    @property
    def open(self) -> bool:
        """Inside the `<think>` part: what the client shows as reasoning."""
        return self._state == _THINKING

    def feed(self, piece: str) -> tuple[str, str]:
        """The next content delta as (reasoning, answer) text."""
        if self._state == _ANSWER:
            return "", piece
        text, self._held = self._held + piece, ""
        if self._state == _START:
            stripped = text.lstrip()
            if len(stripped) < len(OPEN_THINK) and OPEN_THINK.startswith(stripped):
                self._held = text  # white space, or the start of `<think>`: wait for more
                return "", ""
            if not stripped.startswith(OPEN_THINK):
                self._state = _ANSWER
                return "", text
            self._state = _THINKING
            text = stripped[len(OPEN_THINK):]
        end = text.find(CLOSE_THINK)
        if end >= 0:
            self._state = _ANSWER
            return text[:end], text[end + len(CLOSE_THINK):]
        for keep in range(min(len(CLOSE_THINK) - 1, len(text)), 0, -1):
            if CLOSE_THINK.startswith(text[-keep:]):
                self._held = text[-keep:]
                return text[:-keep], ""
        return text, ""


def _message_reasoning(message: dict) -> str:
    """The reasoning a chat message carries beside its content: `reasoning_content` (DeepSeek, llama.cpp,
    SGLang) or `reasoning` (vLLM, OpenRouter), one of them; `reasoning_details` repeats it and is not read."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


class ChatDialect(OpenAIDialect):
    name = "chat"
    items_key = "messages"

    @staticmethod
    def wrote(body: dict) -> bool:
        return "messages" in body

    @staticmethod
    def read(payload: dict, history: list[Message] | None = None, kept_call=None, before=None) -> Conversation:
        """The request's messages: a chat request always carries its whole conversation (`history` unused)."""
        messages = payload.get("messages")
        if messages is None:
            return Conversation([])
        reused, reading = before if before is not None else (0, None)
        if not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages[reused:])):
            raise RequestError("'messages' must be an array of objects")
        read = LazyMessages(messages, from_record, reading if isinstance(reading, LazyMessages) else None, reused)
        return Conversation(read, reading=read)

    @staticmethod
    def with_warnings(payload: dict, conversation: Conversation, warnings: list[tuple[int, str, str]]) -> dict:
        placed = [(place, {"role": role, "content": text}) for place, role, text in warnings]
        return {**payload, "messages": insert_placed(payload.get("messages") or [], conversation, placed)}

    @staticmethod
    def answer(body: dict) -> Message | None:
        """Choice 0's message of a non-streamed `chat.completion` (a `<think>` part of its content aside)."""
        message = _choice_message(body)
        if message is None:
            return None
        read = from_record({**message, "role": ASSISTANT})
        content = message.get("content")
        if isinstance(content, str) and OPEN_THINK in content:
            tags = ThinkTags()
            read = read._replace(text=tags.feed(content)[1])
        return read

    @staticmethod
    def reasoning(body: dict) -> str:
        message = _choice_message(body)
        if message is None:
            return ""
        content = message.get("content")
        think = ThinkTags().feed(content)[0] if isinstance(content, str) and OPEN_THINK in content else ""
        return _message_reasoning(message) + think

    @staticmethod
    def recorded_reasoning(item: dict) -> str:
        return _message_reasoning(item) if item.get("role") == ASSISTANT else ""

    @staticmethod
    def stream() -> "ChatStream":
        return ChatStream()

    @staticmethod
    def max_output_tokens(payload: dict) -> int | None:
        return positive_int(payload.get("max_completion_tokens")) or positive_int(payload.get("max_tokens"))

    @staticmethod
    def tokens(usage: Any) -> tuple[int | None, int | None]:
        return counted(usage, "prompt_tokens"), counted(usage, "completion_tokens")


def _choice_message(body: dict) -> dict | None:
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        return message if isinstance(message, dict) else None
    return None


class ChatStream:
    """Rebuilds choice 0's assistant message from `chat.completion.chunk` objects, and ends a stream the
    proxy cuts the way a finished one ends.

    Tool-call arguments arrive as fragments split anywhere (even mid UTF-8
    character in the JSON text); they are joined per tool-call index. The reasoning (a `reasoning_content` or
    `reasoning` delta, or the `<think>` part of the content) is followed apart from the answer.
    """

    __slots__ = ("_text", "_calls", "finish_reason", "usage", "model", "response_id", "_reasoning", "_think",
                 "last_reasoning")
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
        self._reasoning: list[str] = []
        self._think = ThinkTags()
        self.last_reasoning = ""

    def add(self, chunk: dict, event: str | None = None) -> tuple[str, bool]:
        """Take one chunk; return choice 0's new text and whether a tool call began."""
        self.last_reasoning = ""
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
            thought = _message_reasoning(delta)
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                think, piece = self._think.feed(piece)
                thought += think
            if thought:
                self._reasoning.append(thought)
                self.last_reasoning += thought
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

    @property
    def reasoning_text(self) -> str:
        return "".join(self._reasoning)

    def message(self) -> Message:
        calls = tuple(ToolCall(str(call["id"] or ""), call["function"]["name"], call["function"]["arguments"] or "")
                      for call in (self._calls[i] for i in sorted(self._calls)))
        return Message(ASSISTANT, self.text, calls)

    def cut_ending(self, marker: dict, notice: str | None) -> bytes:
        """The last chunks of a cut stream: the notice as one more text delta (the answer's, after the `<think>`
        part is closed where the content holds one), a clean stop, `[DONE]`."""
        head = {"id": self.response_id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.model}
        ending = b""
        content = (CLOSE_THINK if self._think.open else "") + (notice or "")
        if content:
            ending = sse({**head, "choices": [{"index": 0, "delta": {"content": content}, "logprobs": None,
                                               "finish_reason": None}]})
        final = {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                 "loopwarden": marker}
        return ending + sse(final) + b"data: [DONE]\n\n"

    def stop_ending(self, error: dict) -> bytes:
        """The last event of a stream ended by the stop: the error, which the SDKs raise."""
        return sse({"error": error})
