"""The neutral conversation: what every dialect's request becomes, and what the rules, the judge and the store read.

Each dialect (`proxy/wire/`) writes it: its messages, tool calls and tool results, and per message where, in
the dialect's own list of items, something placed after it goes. Nobody but the dialects reads a dialect's
shapes, and nobody but the rules, the judge and the store reads these. Pure code, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import orjson

INJECTED_PREFIX = "[loopwarden] "
# Where the proxy cut a chanting stream, it added a last text delta starting with this: not the model's text.
CUT_NOTICE_PREFIX = INJECTED_PREFIX + "Output cut:"

SYSTEM, USER, ASSISTANT, TOOL = "system", "user", "assistant", "tool"


# Tuples, not dataclasses: a long conversation is read anew on every request, and a tuple of strings is
# built and hashed (the fold cache's fingerprint of a message) at C speed.

class ToolCall(NamedTuple):
    id: str
    name: str
    arguments: str  # JSON text (as the model wrote it, or as a dialect wrote the object it holds)


class Message(NamedTuple):
    """One message. `role` is system (also text an agent wrote itself, read by no rule), user, assistant or
    tool (a result, answering the call `call_id`; `failed` when the client marked it an error). `name` is the
    chat message's own `name`: in a group of agents, the one that spoke."""

    role: str
    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    call_id: str = ""
    failed: bool = False
    name: str = ""

    @property
    def injected(self) -> bool:
        """A warning the proxy wrote: never the model's output, never a user's new task."""
        return self.role != ASSISTANT and self.text.startswith(INJECTED_PREFIX)


def model_text(message: Message) -> tuple[str, bool]:
    """An assistant message's own text, without a cut notice the proxy added; and whether it had one."""
    text = message.text
    at = text.rfind(CUT_NOTICE_PREFIX) if INJECTED_PREFIX in text else -1
    if at < 0:
        return text, False
    return text[:at].rstrip("\n"), True


@dataclass(frozen=True, slots=True)
class Anchor:
    """Where, in a dialect's own list of items, something placed just after a neutral message goes: a new item
    at index `item`, or (`part` ≥ 0) a part inserted at `part` among the parts of item `item`."""

    item: int
    part: int = -1


class LazyMessages(Sequence):
    """A dialect's messages read as neutral ones only when looked at. A long conversation is sent again with
    every request, and the rules look at the messages since the previous request (the fold cache holds the
    rest): their fingerprints come from the dialect's own items, cheaper than reading every one. Where the
    request's first `reused` items are those of `before` (the conversation's previous request, `KnownBodies`),
    what was read of them and their fingerprints are taken from it."""

    __slots__ = ("_raw", "_read", "_read_ones", "_fingerprints")

    def __init__(self, raw: list, read: Callable[[Any], Message], before: "LazyMessages | None" = None,
                 reused: int = 0) -> None:
        self._raw = raw
        self._read = read
        self._fingerprints: list[int] | None = None
        if before is not None and reused and before._read is read:
            self._read_ones: list[Message | None] = before._read_ones[:reused] + [None] * (len(raw) - reused)
            if before._fingerprints is not None:
                self._fingerprints = before._fingerprints[:reused]
        else:
            self._read_ones = [None] * len(raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._raw)))]
        message = self._read_ones[index]
        if message is None:
            message = self._read_ones[index] = self._read(self._raw[index])
        return message

    def __iter__(self):
        return (self[i] for i in range(len(self._raw)))

    def role(self, index: int) -> str:
        """A message's role, without reading the rest of it."""
        message = self._read_ones[index]
        if message is not None:
            return message.role
        role = self._raw[index].get("role")
        return role if role.__class__ is str else ""

    def fingerprints(self) -> list[int]:
        """A fingerprint per message, from its item as the client sent it."""
        known = self._fingerprints or []
        if len(known) == len(self._raw):
            return known
        dumps = orjson.dumps
        try:
            fingerprints = known + [hash(dumps(item)) for item in self._raw[len(known):]]
        except orjson.JSONEncodeError:  # an item nested past what orjson writes: those are read instead
            fingerprints = list(known)
            for index in range(len(known), len(self._raw)):
                try:
                    fingerprints.append(hash(dumps(self._raw[index])))
                except orjson.JSONEncodeError:
                    fingerprints.append(hash(self[index]))
        self._fingerprints = fingerprints
        return fingerprints


def role_at(messages: Sequence[Message], index: int) -> str:
    """The role of a message, read alone where the messages are read lazily."""
    role = getattr(messages, "role", None)
    return role(index) if role is not None else messages[index].role


@dataclass
class Conversation:
    """A request's conversation. `messages` may begin with history the request does not carry (a chained
    request continues what the service keeps): those first `own_start` messages can no longer be changed.
    `anchors`, per own message, say where something placed after it goes; None when the dialect's items are
    the messages themselves, one for one."""

    messages: Sequence[Message]
    own_start: int = 0
    anchors: list[Anchor] | None = None
    reading: Any = None  # what the dialect keeps of this reading, to read the conversation's next request from

    def anchor(self, place: int) -> Anchor:
        """Where something placed before neutral message `place` goes."""
        own = place - self.own_start
        if self.anchors is None:
            return Anchor(max(own, 0))
        return self.anchors[own - 1] if own > 0 else Anchor(0)


def insert_placed(items: list, conversation: Conversation, placed: list[tuple[int, Any]],
                  parts_of: Callable[[dict], list] | None = None, parts_key: str = "",
                  as_item: Callable[[Any], Any] | None = None) -> list:
    """A copy of a dialect's `items` with each placed thing inserted before the neutral message at its place:
    among the parts of the item its anchor names (read with `parts_of`, written back under `parts_key`), or,
    for an anchor with no part, as an item of its own (`as_item` wraps a part into one). The items given are
    left as they were."""
    result = list(items)
    copied: set[int] = set()
    # From the last place back, so earlier anchors stay put; at one place, in the order given.
    for place, thing in reversed(sorted(placed, key=lambda entry: entry[0])):
        anchor = conversation.anchor(place)
        if anchor.part < 0:
            result.insert(anchor.item, as_item(thing) if as_item is not None else thing)
            continue
        if anchor.item not in copied:
            result[anchor.item] = {**result[anchor.item], parts_key: list(parts_of(result[anchor.item]))}
            copied.add(anchor.item)
        result[anchor.item][parts_key].insert(anchor.part, thing)
    return result


@dataclass(frozen=True)
class Chain:
    """What a request continuing a conversation the service keeps (`previous_response_id`, a conversation id)
    continues: the conversation so far, as the proxy saw it sent."""

    messages: list[Message]
    last_id: str | None  # the response the request continues
    session_id: str | None
    conversation_id: str | None


# -- the stored form ----------------------------------------------------------------------------------------
# Kept responses hold their messages as JSON objects (role, content, tool_calls, tool_call_id, is_error, name), so a
# record written by any version of the proxy reads back the same.

def to_record(message: Message, max_text: int) -> dict:
    """A message as stored, texts and JSON-text arguments cut to `max_text` characters."""
    record: dict[str, Any] = {"role": message.role, "content": message.text[:max_text] or None}
    if message.call_id:
        record["tool_call_id"] = message.call_id
    if message.failed:
        record["is_error"] = True
    if message.name:
        record["name"] = message.name
    if message.calls:
        record["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments[:max_text]}}
            for call in message.calls]
    return record


def from_record(record: dict) -> Message:
    """A stored message (or any message of that shape: a chat message) as a neutral one. Written for speed: a
    chat request's every message is read on every request."""
    get = record.get
    role = get("role")
    content = get("content")
    calls = get("tool_calls")
    call_id = get("tool_call_id")
    name = get("name")
    return Message(role if role.__class__ is str else "",
                   content if content.__class__ is str else text_of(content),
                   tuple(call_of(raw) for raw in calls if isinstance(raw, dict)) if calls.__class__ is list else (),
                   call_id if call_id.__class__ is str else "" if call_id is None else str(call_id),
                   get("is_error") is True, name if name.__class__ is str else "")


def text_of(content: Any) -> str:
    """The plain text of a content that is a string or a list of parts with `text`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def call_of(raw: dict) -> ToolCall:
    """A `{"id", "function": {"name", "arguments"}}` call as a neutral one."""
    function = raw.get("function")
    if function.__class__ is not dict:
        function = {}
    name = function.get("name")
    arguments = function.get("arguments")
    call_id = raw.get("id")
    return ToolCall(call_id if call_id.__class__ is str else "" if call_id is None else str(call_id),
                    name if name.__class__ is str else "",
                    arguments if arguments.__class__ is str else arguments_text(arguments))


class RequestError(ValueError):
    """A request body a dialect cannot read as a conversation; the message says which field and why."""


def arguments_text(arguments: Any) -> str:
    """Arguments as JSON text: text as it came, an object a dialect holds parsed written out."""
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return ""
    try:
        return orjson.dumps(arguments).decode()
    except orjson.JSONEncodeError as exc:
        raise RequestError(f"tool call arguments cannot be read: {exc}") from None


class KnownMessages(list):
    """Neutral messages that keep their fingerprints once taken: where the next request's reading begins with
    the first of them (`resume`), their fingerprints are not taken again (a long conversation's messages are
    spread over memory; hashing them all again costs more than the rest of the verdict)."""

    __slots__ = ("known_fingerprints",)

    def __init__(self, messages=(), fingerprints: list[int] | None = None) -> None:
        super().__init__(messages)
        self.known_fingerprints = fingerprints or []

    def fingerprints(self) -> list[int]:
        """A fingerprint per message."""
        known = self.known_fingerprints
        if len(known) != len(self):
            known = self.known_fingerprints = known + [hash(message) for message in self[len(known):]]
        return known


@dataclass
class Messages:
    """A growing list of neutral messages with their anchors, as a dialect reads a request."""

    messages: list[Message] = field(default_factory=KnownMessages)
    anchors: list[Anchor] = field(default_factory=list)

    def add(self, message: Message, anchor: Anchor) -> None:
        self.messages.append(message)
        self.anchors.append(anchor)


@dataclass(slots=True)
class ItemReading:
    """What a dialect read from a request's items, kept so that the conversation's next request, which begins
    with the same items (`KnownBodies`), is read from the first item that differs."""

    head: Any  # what was read before the items (the system prompt): the next reading must begin the same
    messages: list[Message]
    anchors: list[Anchor]
    marks: list[int]  # per item, the messages read up to its end; -1 where reading cannot resume after it


def resume(reading: Any, reused: int, head: Any) -> tuple[Messages, list[int]]:
    """Where a reading of items resumes: the messages read from the first `reused` items (as far back as a
    reading may resume) and their marks; nothing when `reading` is not an earlier reading of these items."""
    if isinstance(reading, ItemReading) and reading.head == head:
        for end in range(min(reused, len(reading.marks)), 0, -1):
            count = reading.marks[end - 1]
            if count >= 0:  # the messages before the items have no anchors
                unanchored = len(reading.messages) - len(reading.anchors)
                known = getattr(reading.messages, "known_fingerprints", None)
                messages = KnownMessages(reading.messages[:count], known[:count] if known else None)
                return Messages(messages, reading.anchors[:count - unanchored]), reading.marks[:end]
    return Messages(), []
