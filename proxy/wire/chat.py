"""Chat Completions stream assembly: chunk deltas in, whole assistant messages out."""

from __future__ import annotations

from typing import Any


class ChatStreamAssembler:
    """Rebuilds choice 0's assistant message from `chat.completion.chunk` objects.

    Tool-call arguments arrive as fragments split anywhere (even mid UTF-8
    character in the JSON text); they are joined per tool-call index.
    """

    __slots__ = ("_text", "_calls", "finish_reason", "usage", "model", "response_id")

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.model: str | None = None
        self.response_id: str | None = None

    def add(self, chunk: dict) -> tuple[str, bool]:
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


def response_message(body: dict) -> dict | None:
    """Choice 0's message of a non-streamed `chat.completion`."""
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        return message if isinstance(message, dict) else None
    return None


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
