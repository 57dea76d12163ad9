"""The Anthropic Messages dialect (`POST /v1/messages`): content blocks and stream events to and from the
neutral conversation.

`system` is the system prompt. An assistant message's `text` blocks are its text and its `tool_use` blocks its
tool calls; a user message's `tool_result` blocks are tool results (`is_error` marks a failure; a string and a
list of text blocks are the same result) and its `text` blocks a person's words, except the text an agent
writes itself (Claude Code's `<system-reminder>` blocks, the proxy's own warnings), which starts no task.
`thinking` blocks are the model's reasoning (watched as it streams, never part of the neutral conversation);
a `thinking` block without a signature, which only a stream the proxy cut leaves, is left out of what goes
upstream (the service refuses it). `redacted_thinking`, server-tool, image, document and unknown blocks are
forwarded untouched and ignored for detection. A warning is a `text` block placed after the `tool_result` blocks that answer the loop's
completing call. Requests go to ANTHROPIC_UPSTREAM_URL, as does every request carrying `anthropic-version`.
Pure code, no I/O.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson
from yarl import URL

from proxy.conversation import ASSISTANT, CUT_NOTICE_PREFIX, SYSTEM, TOOL, USER, Anchor, Conversation, \
    ItemReading, Message, Messages, ToolCall, arguments_text, insert_placed, resume
from proxy.wire.dialect import Credentials, DialectDefaults, JudgeCall, JudgeQuestion, RequestError, counted, join_url, \
    positive_int, sse

_REPLACED = frozenset({b"authorization", b"x-api-key"})
ANTHROPIC_VERSION = "2023-06-01"  # the API version the judge's requests name
_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})
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


def tool_call(block: dict) -> ToolCall:
    """A `tool_use` block as a neutral tool call."""
    name = block.get("name")
    arguments = block.get("input")
    return ToolCall(str(block.get("id") or ""), name if isinstance(name, str) else "",
                    arguments_text(arguments if isinstance(arguments, dict | list) else {}))


def _unsigned(block: Any) -> bool:
    """A thinking block without its signature: the proxy cut it as it streamed."""
    return isinstance(block, dict) and block.get("type") == "thinking" and not block.get("signature")


def _thinking_text(blocks: list) -> str:
    return "".join(b["thinking"] for b in blocks
                   if isinstance(b, dict) and b.get("type") == "thinking" and isinstance(b.get("thinking"), str))


def assistant_message(blocks: list) -> Message:
    text = []
    calls = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(tool_call(block))
    return Message(ASSISTANT, "".join(text), tuple(calls))


def _read_user(index: int, blocks: list, into: Messages) -> None:
    """One user message's blocks as neutral messages (tool results, agent text, a person's words), each anchored
    just past its block in the request."""
    person = False  # the last neutral message is a person's words, which further text blocks join
    for position, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        anchor = Anchor(index, position + 1)
        if kind == "tool_result":
            into.add(Message(TOOL, _text_of(block.get("content")), call_id=str(block.get("tool_use_id") or ""),
                             failed=block.get("is_error") is True), anchor)
            person = False
        elif kind == "text" and isinstance(block.get("text"), str):
            text = block["text"]
            if text.lstrip().startswith(_AGENT_TEXT):
                into.add(Message(SYSTEM, text), anchor)  # read by no rule, starts nothing
                person = False
            elif person:
                into.messages[-1] = Message(USER, into.messages[-1].text + "\n" + text)  # several blocks
                into.anchors[-1] = anchor
            else:
                into.add(Message(USER, text), anchor)
                person = True
        # images, documents, server-tool results: not part of the conversation the rules read


def anthropic_root(url: str) -> str:
    """The Anthropic base URL without a trailing `/v1`: it is given either way, as ANTHROPIC_BASE_URL is."""
    return str(URL(url)).rstrip("/").removesuffix("/v1")


class MessagesDialect(DialectDefaults):
    name = "messages"
    items_key = "messages"
    provider = "anthropic"
    base_url_fix = "set ANTHROPIC_BASE_URL={base} without /v1 (the client adds /v1/messages itself)"
    not_found_type = "not_found_error"

    @staticmethod
    def claims(headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
        return "anthropic-version" in headers

    @staticmethod
    def wrote(body: dict) -> bool:
        """A top-level `system`, or the blocks only Messages has."""
        messages = body.get("messages")
        if not isinstance(messages, list):
            return False
        return "system" in body or any(
            isinstance(block, dict) and block.get("type") in _ANTHROPIC_BLOCKS
            for message in messages if isinstance(message, dict) and isinstance(message.get("content"), list)
            for block in message["content"])

    @staticmethod
    def upstream_url(settings, raw_path: str, raw_query: str) -> URL:
        return join_url(anthropic_root(settings.anthropic_upstream_url), raw_path, raw_query)

    @staticmethod
    def upstream_key(settings) -> str | None:
        return settings.anthropic_upstream_api_key

    @staticmethod
    def judge_call(question: JudgeQuestion, key: str, attempt: int) -> JudgeCall | None:
        """The Messages API has no response format: the prompt asks for the JSON."""
        if attempt:
            return None
        headers = {"anthropic-version": ANTHROPIC_VERSION, **({"Authorization": f"Bearer {key}"} if key else {})}
        return JudgeCall("/v1/messages", headers, {"model": question.model, "max_tokens": 400,
                                                   "system": question.system,
                                                   "messages": [{"role": "user", "content": question.shown}]})

    @staticmethod
    def judge_reply(body: dict) -> tuple[str, int]:
        blocks = body.get("content")
        text = "".join(block["text"] for block in blocks if isinstance(block, dict) and block.get("type") == "text"
                       and isinstance(block.get("text"), str)) if isinstance(blocks, list) else ""
        return text, counted(body.get("usage"), "input_tokens", "output_tokens") or 0

    @staticmethod
    def credentials(settings) -> Credentials | None:
        if settings.anthropic_upstream_api_key:  # whichever auth style the client used, the key replaces it
            return _REPLACED, b"x-api-key", settings.anthropic_upstream_api_key.encode()
        return None

    @staticmethod
    def read(payload: dict, history: list[Message] | None = None, kept_call=None, before=None) -> Conversation:
        """Its system prompt, then its messages' blocks as neutral messages (from the first one `before` did
        not read: `(items reused, the reading of the request they come from)`)."""
        raw = payload.get("messages")
        if raw is None:
            raw = []
        reused, reading = before if before is not None else (0, None)
        if not (isinstance(raw, list) and all(isinstance(m, dict) for m in raw[reused:])):
            raise RequestError("'messages' must be an array of objects")
        system = payload.get("system")
        if system is not None and not isinstance(system, str | list):
            raise RequestError("'system' must be a string or an array of text blocks")
        text = _text_of(system)
        read, marks = resume(reading, reused, text)
        if not marks and text:
            read.add(Message(SYSTEM, text), Anchor(0))  # nothing is ever placed after the system prompt
        for index in range(len(marks), len(raw)):
            message = raw[index]
            role = message.get("role")
            if role == ASSISTANT:
                read.add(assistant_message(_blocks(message)), Anchor(index + 1))
            elif role == USER:
                _read_user(index, _blocks(message), read)
            else:  # Claude Code's `role: "system"` notices: agent-written, read by no rule
                read.add(Message(SYSTEM, _text_of(message.get("content"))), Anchor(index + 1))
            marks.append(len(read.messages))
        return Conversation(read.messages, 0, read.anchors, ItemReading(text, read.messages, read.anchors, marks))

    @staticmethod
    def with_warnings(payload: dict, conversation: Conversation, warnings: list[tuple[int, str, str]]) -> dict:
        """The request with text blocks inserted, each just past the blocks of the neutral message before its
        place: inside the user message that holds them, or as a user message of its own after an assistant
        turn. (Messages has no late system turn: the role is not used.)"""
        placed = [(place, {"type": "text", "text": text}) for place, _, text in warnings]
        return {**payload, "messages": insert_placed(
            payload.get("messages") or [], conversation, placed, parts_of=_blocks, parts_key="content",
            as_item=lambda block: {"role": "user", "content": [block]})}

    @staticmethod
    def answer(body: dict) -> Message | None:
        content = body.get("content")
        return assistant_message(content) if isinstance(content, list) else None

    @staticmethod
    def reasoning(body: dict) -> str:
        content = body.get("content")
        return _thinking_text(content) if isinstance(content, list) else ""

    @staticmethod
    def recorded_reasoning(item: dict) -> str:
        return _thinking_text(_blocks(item)) if item.get("role") == ASSISTANT else ""

    @staticmethod
    def forwardable(payload: dict, checked: int = 0) -> dict | None:
        """The request without the unsigned thinking blocks of its assistant messages (a stream the proxy cut
        inside the thinking left one; the service answers 400 to it). None when it has none. A message left with
        no block keeps the cut notice's words, as the proxy's, for the service refuses an empty one. (The first
        `checked` messages are known to hold none.)"""
        messages = payload.get("messages")
        if not isinstance(messages, list) or not any(
                isinstance(m, dict) and m.get("role") == ASSISTANT and isinstance(m.get("content"), list)
                and any(_unsigned(b) for b in m["content"]) for m in messages[checked:]):
            return None
        kept = []
        for message in messages:
            if isinstance(message, dict) and message.get("role") == ASSISTANT and \
                    isinstance(message.get("content"), list) and any(_unsigned(b) for b in message["content"]):
                blocks = [b for b in message["content"] if not _unsigned(b)]
                message = {**message, "content": blocks or [{"type": "text", "text": CUT_NOTICE_PREFIX.strip()}]}
            kept.append(message)
        return {**payload, "messages": kept}

    @staticmethod
    def stream() -> "MessagesStream":
        return MessagesStream()

    @staticmethod
    def error_body(message: str, type_: str, code: str | None = None) -> bytes:
        """An error in Anthropic's shape, which its SDKs raise with `type` and `message`."""
        return orjson.dumps({"type": "error", "error": {"type": type_, "message": message}})

    @classmethod
    def stream_error(cls, message: str, type_: str, code: str | None = None) -> bytes:
        """An `error` event, which the Anthropic SDKs raise as their API error."""
        return b"event: error\ndata: " + cls.error_body(message, type_, code) + b"\n\n"

    @staticmethod
    def max_output_tokens(payload: dict) -> int | None:
        return positive_int(payload.get("max_tokens"))

    @staticmethod
    def is_side_request(payload: dict) -> bool:
        """Claude Code's side requests (a title) carry no tools."""
        return not payload.get("tools")


class MessagesStream:
    """Follows `message_start`, `content_block_*` and `message_delta` events: the text as it streams, calls as
    they begin, the finished turn; and ends a stream the proxy cuts the way a finished message ends. It never
    ends one with an `error` event (Claude Code asks the model to resume after one): the stop reached
    mid-stream ends as a cut does, and the next request is refused."""

    stop_is_cut = True

    @property
    def finished(self) -> bool:
        return self._stopped

    def __init__(self) -> None:
        self._stopped = False
        self.message_start: dict = {}
        self._blocks: dict[int, dict] = {}  # index -> block so far (tool_use input as JSON text in `partial`)
        self._text: list[str] = []
        self._open: int | None = None  # the block the client has seen start and not stop
        self._unsent: int | None = None  # a tool_use block whose start the proxy holds back when it cuts there
        self.output_tokens = 0
        self._reasoning: list[str] = []
        self.last_reasoning = ""

    @property
    def response_id(self) -> str | None:
        return self.message_start.get("id")

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def reasoning_text(self) -> str:
        return "".join(self._reasoning)

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
        self.last_reasoning = ""
        if kind == "content_block_delta":
            index, delta = data.get("index"), data.get("delta") or {}
            block = self._blocks.get(index)
            if block is None:
                return "", False
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                block["text"] = block.get("text", "") + delta["text"]
                self._text.append(delta["text"])
                return delta["text"], False
            if delta.get("type") == "thinking_delta" and isinstance(delta.get("thinking"), str):
                self._reasoning.append(delta["thinking"])
                self.last_reasoning = delta["thinking"]
            elif delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
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
            thought = block.get("thinking") if block.get("type") == "thinking" else None
            if isinstance(thought, str) and thought:
                self._reasoning.append(thought)
                self.last_reasoning = thought
            text = block.get("text") if block.get("type") == "text" else None
            if isinstance(text, str) and text:
                self._text.append(text)
                return text, False
            return "", False
        if kind == "content_block_stop":
            if data.get("index") == self._open:
                self._open = None
            return "", False
        if kind == "message_stop":
            self._stopped = True
        elif kind == "message_start" and isinstance(data.get("message"), dict):
            self.message_start = data["message"]
        elif kind == "message_delta":
            usage = data.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
                self.output_tokens = usage["output_tokens"]
        return "", False

    def message(self) -> Message:
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
        """Close the open block (a thinking block cut part way is closed unsigned), add the notice as a last text
        delta (in a text block of its own after any other block), end as a finished message ends."""
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
                    "usage": {"output_tokens": max(self.output_tokens,
                                                   (len(self.text) + len(self.reasoning_text)) // 4)},
                    "loopwarden": marker}, "message_delta")
        return out + sse({"type": "message_stop"}, "message_stop")
