"""The Anthropic Messages dialect (`POST /v1/messages`): content blocks and stream events to and from the
neutral conversation.

`system` is the system prompt. An assistant message's `text` blocks are its text and its `tool_use` blocks its
tool calls; a user message's `tool_result` blocks are tool results (`is_error` marks a failure; a string and a
list of text blocks are the same result) and its `text` blocks a person's words, except the text an agent
writes itself (Claude Code's `<system-reminder>` blocks, the proxy's own warnings), which starts no task.
`thinking`, `redacted_thinking`, server-tool, image, document and unknown blocks are forwarded untouched and
ignored for detection. A warning is a `text` block placed after the `tool_result` blocks that answer the loop's
completing call. Pure code, no I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.wire.chat import Conversation, RequestError, sse

# Text a user message carries that an agent wrote, not a person: it never starts a task.
_AGENT_TEXT = ("<system-reminder>", "[loopwarden] ")


def _text_of(content: Any) -> str:
    """A block list's (or a string's) text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))
    return ""


def _blocks(message: dict) -> list:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def tool_call(block: dict) -> dict:
    """A `tool_use` block as a neutral tool call."""
    name = block.get("name")
    arguments = block.get("input")
    return {"id": str(block.get("id") or ""), "type": "function",
            "function": {"name": name if isinstance(name, str) else "",
                         "arguments": arguments if isinstance(arguments, dict | list) else {}}}


def assistant_message(blocks: list) -> dict:
    text = []
    calls = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(tool_call(block))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user_messages(index: int, blocks: list) -> tuple[list[dict], list[tuple[int, int]]]:
    """One user message's blocks as neutral messages (tool results, agent text, a person's words), and per
    neutral message where, in the request, something placed after it goes: (message, block) just past it."""
    messages: list[dict] = []
    ends: list[tuple[int, int]] = []
    for position, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "tool_result":
            messages.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                             "content": _text_of(block.get("content")), "is_error": block.get("is_error") is True})
        elif kind == "text" and isinstance(block.get("text"), str):
            text = block["text"]
            if text.lstrip().startswith(_AGENT_TEXT):
                messages.append({"role": "system", "content": text})  # read by no rule, starts nothing
            elif messages and messages[-1]["role"] == "user":
                messages[-1]["content"] += "\n" + text  # one person's words, in several blocks
                ends[-1] = (index, position + 1)
                continue
            else:
                messages.append({"role": "user", "content": text})
        else:
            continue  # images, documents, server-tool results: not part of the conversation the rules read
        ends.append((index, position + 1))
    return messages, ends


def conversation_of(payload: dict) -> Conversation:
    """The request's conversation: its system prompt, then its messages' blocks as neutral messages."""
    raw = payload.get("messages")
    if raw is None:
        raw = []
    if not (isinstance(raw, list) and all(isinstance(m, dict) for m in raw)):
        raise RequestError("'messages' must be an array of objects")
    system = payload.get("system")
    if system is not None and not isinstance(system, str | list):
        raise RequestError("'system' must be a string or an array of text blocks")
    messages: list[dict] = []
    ends: list[tuple[int, int]] = []
    text = _text_of(system)
    if text:
        messages.append({"role": "system", "content": text})
        ends.append((0, -1))  # nothing is ever placed after the system prompt
    for index, message in enumerate(raw):
        role = message.get("role")
        if role == "assistant":
            messages.append(assistant_message(_blocks(message)))
            ends.append((index + 1, -1))
        elif role == "user":
            own, own_ends = _user_messages(index, _blocks(message))
            messages += own
            ends += own_ends
        else:  # Claude Code's `role: "system"` notices: agent-written, read by no rule
            messages.append({"role": "system", "content": _text_of(message.get("content"))})
            ends.append((index + 1, -1))
    return Conversation(messages, 0, ends)  # type: ignore[arg-type]


class MessagesDialect:
    name = "messages"
    path = "/messages"

    @staticmethod
    def read(payload: dict, history: list[dict] | None = None) -> Conversation:
        return conversation_of(payload)

    @staticmethod
    def with_messages(payload: dict, conversation: Conversation, inserted: list[tuple[int, dict]]) -> dict:
        """The request with blocks inserted, each just past the blocks of the neutral message before its place:
        inside the user message that holds them, or as a user message of its own after an assistant turn."""
        messages = list(payload.get("messages") or ())
        copied: set[int] = set()
        # From the last place back, so earlier places stay put; at one place, in the order given.
        for place, block in reversed(sorted(inserted, key=lambda item: item[0])):
            index, position = conversation.item_ends[place - 1]
            if position < 0:
                messages.insert(index, {"role": "user", "content": [block]})
                continue
            if index not in copied:
                messages[index] = {**messages[index], "content": list(_blocks(messages[index]))}
                copied.add(index)
            messages[index]["content"].insert(position, block)
        return {**payload, "messages": messages}

    @staticmethod
    def warning_message(role: str, text: str) -> dict:
        return {"type": "text", "text": text}  # a block in the user message: Messages has no late system turn

    @staticmethod
    def answer(body: dict) -> dict | None:
        content = body.get("content")
        return assistant_message(content) if isinstance(content, list) else None

    @staticmethod
    def stream() -> "MessagesStream":
        return MessagesStream()

    @staticmethod
    def error_body(message: str, type_: str, code: str | None = None) -> bytes:
        """An error in Anthropic's shape, which its SDKs raise with `type` and `message`."""
        return orjson.dumps({"type": "error", "error": {"type": type_, "message": message}})


class MessagesStream:
    """Follows `message_start`, `content_block_*` and `message_delta` events: the text as it streams, calls as
    they begin, the finished turn; and ends a stream the proxy cuts the way a finished message ends. It never
    ends one with an `error` event (Claude Code asks the model to resume after one): the stop reached
    mid-stream ends as a cut does, and the next request is refused."""

    stop_is_cut = True

    def __init__(self) -> None:
        self.message_start: dict = {}
        self._blocks: dict[int, dict] = {}  # index -> block so far (tool_use input as JSON text in `partial`)
        self._text: list[str] = []
        self._open: int | None = None  # the block the client has seen start and not stop
        self._unsent: int | None = None  # a tool_use block whose start the proxy holds back when it cuts there
        self.output_tokens = 0

    @property
    def response_id(self) -> str | None:
        return self.message_start.get("id")

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def model(self) -> str | None:
        return self.message_start.get("model")

    @property
    def usage(self) -> dict:
        started = self.message_start.get("usage")
        given = started.get("input_tokens") if isinstance(started, dict) else None
        return {"input_tokens": given, "output_tokens": self.output_tokens}

    def add(self, data: dict, event: str | None = None) -> tuple[str, bool]:
        """Take one event; return the new text and whether a tool call began."""
        kind = data.get("type") or event
        self._unsent = None
        if kind == "content_block_delta":
            index, delta = data.get("index"), data.get("delta") or {}
            block = self._blocks.get(index)
            if block is None:
                return "", False
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                block["text"] = block.get("text", "") + delta["text"]
                self._text.append(delta["text"])
                return delta["text"], False
            if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                block["partial"] = block.get("partial", "") + delta["partial_json"]
            return "", False
        if kind == "content_block_start":
            index, block = data.get("index"), data.get("content_block")
            if not isinstance(index, int) or not isinstance(block, dict):
                return "", False
            self._blocks[index] = dict(block)
            self._open = index
            if block.get("type") == "tool_use":
                self._unsent = index
                return "", True
            text = block.get("text") if block.get("type") == "text" else None
            if isinstance(text, str) and text:
                self._text.append(text)
                return text, False
            return "", False
        if kind == "content_block_stop":
            if data.get("index") == self._open:
                self._open = None
            return "", False
        if kind == "message_start" and isinstance(data.get("message"), dict):
            self.message_start = data["message"]
        elif kind == "message_delta":
            usage = data.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
                self.output_tokens = usage["output_tokens"]
        return "", False

    def message(self) -> dict:
        blocks = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.get("type") == "tool_use" and "partial" in block:
                try:
                    block = {**block, "input": orjson.loads(block["partial"] or "{}")}
                except orjson.JSONDecodeError:
                    block = {**block, "input": {}}
            blocks.append(block)
        return assistant_message(blocks)

    def cut_ending(self, marker: dict, notice: str | None) -> bytes:
        """Close the open block, add the notice as a last text delta, end as a finished message ends."""
        out = b""
        open_index = None if self._open == self._unsent else self._open
        if notice:
            if open_index is None or self._blocks[open_index].get("type") != "text":
                if open_index is not None:
                    out += sse({"type": "content_block_stop", "index": open_index}, "content_block_stop")
                sent = [i for i in self._blocks if i != self._unsent]
                open_index = max(sent, default=-1) + 1
                out += sse({"type": "content_block_start", "index": open_index,
                            "content_block": {"type": "text", "text": ""}}, "content_block_start")
            out += sse({"type": "content_block_delta", "index": open_index,
                        "delta": {"type": "text_delta", "text": notice}}, "content_block_delta")
        if open_index is not None:
            out += sse({"type": "content_block_stop", "index": open_index}, "content_block_stop")
        out += sse({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": max(self.output_tokens, len(self.text) // 4)},
                    "loopwarden": marker}, "message_delta")
        return out + sse({"type": "message_stop"}, "message_stop")
