"""A long conversation's next request, parsed from where it differs from the one before.

An agent resends its whole conversation with every request, a few messages longer each time. The body of a
session's last long request is remembered with where each item of its conversation list ends (as bytes); the
next body is compared with it at memory speed, and only what follows the last item the two share is parsed.
The payload handed on is the one a whole parse gives (the shared items are the very objects parsed before), and
`reused` says how many leading items those are, so a dialect reads only the items after them.

Pure code, no I/O. The scanner that finds the items is compiled (`proxy/wire/_items.pyx`); where it is not built
(or `LOOPWARDEN_NO_EXTENSIONS=1`), every body is parsed whole, with the same result.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import orjson

try:
    if os.environ.get("LOOPWARDEN_NO_EXTENSIONS", "") == "1":
        raise ImportError("plain Python asked for")
    from proxy.wire._items import common_prefix, item_ends, member
except ImportError:  # not built: bodies are parsed whole
    member = None

# Below this a body is parsed whole: cheaper than remembering it.
LONG_BODY = 64 * 1024
# What the remembered bodies may hold, all sessions together: each body's bytes, what parsing and reading it
# built, and its slot, as `KnownBody.weight` counts them (at most); the least recently used go first, and their
# sessions' next requests are parsed whole.
KNOWN_BYTES = 256 * 1024 * 1024
# What a dialect's reading of one item holds (a message read lazily, its calls' places), at most, beside the text
# the item's own strings hold (counted with the item's text), and what one remembered body's slot and entry hold.
READ_BYTES = 640
ENTRY_BYTES = 512
# Members before the conversation's list (the model, the system prompt, the tools) past this many bytes: no
# conversation's growth, and not remembered (a client's 10 MB `model` would otherwise fill the budget).
MAX_HEAD = 1024 * 1024


@dataclass(slots=True, eq=False)
class KnownBody:
    """A session's last long body: where its list's items end, and what they were parsed to."""

    raw: bytes
    key: str  # the top-level member holding the conversation's items
    list_start: int  # the offset just inside the list's `[`
    head: dict  # the top-level members before the list
    items: list  # the list's items, parsed
    ends: list[int]  # the offset just past each item
    close: int  # the offset of the list's closing `]`
    head_weight: int  # what the parsed head holds, in bytes (at most)
    items_weight: int  # what the parsed items and their reading hold, in bytes (at most)
    reading: Any = None  # what the dialect read from the items, for it to reuse (`Dialect.read`)
    forwardable: bool = False  # it went upstream as it came (`Dialect.forwardable`): its items hold nothing to cut

    @property
    def weight(self) -> int:
        """What remembering it holds, in bytes (at most): its text, its parse and reading, its slot."""
        return len(self.raw) + self.head_weight + self.items_weight + ENTRY_BYTES


@dataclass(slots=True)
class Parsed:
    raw: bytes
    payload: Any
    reused: int = 0  # leading items that are the previous body's (the same objects)
    previous: KnownBody | None = None  # the body they come from
    known: KnownBody | None = None  # this body, remembered for the next (its `reading` is set by the reader)


class KnownBodies:
    """The last long body of each session, within a byte budget."""

    def __init__(self, budget: int = KNOWN_BYTES) -> None:
        self.budget = budget
        self.held = 0  # bytes, as the bodies' weights count them
        self._bodies: OrderedDict[Hashable, KnownBody] = OrderedDict()

    def parse(self, raw: bytes, key: str | None, slot_of: Callable[[], Hashable]) -> Parsed:
        """`raw` parsed as `orjson.loads` parses it (raising what it raises), reusing the items of the body last
        parsed in its slot (`slot_of()`: whose conversation it is likely to be) that it begins with. `key`: the
        top-level member whose list holds the conversation."""
        if member is None or key is None or len(raw) < LONG_BODY:
            return Parsed(raw, orjson.loads(raw))
        slot = slot_of()
        previous = self._bodies.pop(slot, None)
        if previous is not None:
            self.held -= previous.weight
            parsed = _continued(previous, raw, key) if previous.key == key else None
            if parsed is not None:
                self._remember(slot, parsed.known)
                return parsed
        payload = orjson.loads(raw)
        known = _first(raw, key, payload)
        if known is not None:
            self._remember(slot, known)
        return Parsed(raw, payload, known=known)

    def _remember(self, slot: Hashable, known: KnownBody) -> None:
        self._bodies[slot] = known
        self.held += known.weight
        while self.held > self.budget and self._bodies:
            self.held -= self._bodies.popitem(last=False)[1].weight


def _first(raw: bytes, key: str, payload: Any) -> KnownBody | None:
    """A body parsed whole, with where its list's items end; None when its list cannot be found as bytes."""
    if not isinstance(payload, dict) or not isinstance(items := payload.get(key), list):
        return None
    span = member(raw, key.encode())
    if span is None or raw[span[0]] != 0x5B:  # `[`
        return None
    start, _, head_built = span
    if start > MAX_HEAD:
        return None
    found = item_ends(raw, start + 1, False)
    if found is None or len(found[0]) != len(items):
        return None
    ends, close, items_built = found
    head = orjson.loads(raw[:start] + b"0}")
    del head[key]
    return KnownBody(raw, key, start + 1, head, items, ends, close,
                     _text_weight(raw, 0, start) + head_built + _CONTAINER,
                     _text_weight(raw, start + 1, close) + items_built + READ_BYTES * len(items))


def _continued(previous: KnownBody, raw: bytes, key: str) -> Parsed | None:
    """`raw` read from the last item it shares with `previous`; None when it shares none (or the rest is not a
    continuation of the list, or not JSON: the whole parse then says what it says)."""
    shared = common_prefix(previous.raw, raw)
    if shared < previous.list_start:
        return None
    reused = bisect_right(previous.ends, shared)
    start = previous.ends[reused - 1] if reused else previous.list_start
    found = item_ends(raw, start, reused > 0)
    if found is None:
        return None
    ends, close, built = found
    # The rest as a document of its own: the list (behind a placeholder item where it continues) and the
    # members after it.
    opening = b'{"' + key.encode() + (b'":[0' if reused else b'":[')
    try:
        rest = orjson.loads(opening + raw[start:])
    except orjson.JSONDecodeError:
        return None
    new = rest.get(key)
    if not isinstance(new, list) or len(new) != len(ends) + (1 if reused else 0):
        return None
    items = previous.items[:reused] + (new[1:] if reused else new)
    rest[key] = items
    payload = {**previous.head, **rest}
    # The items kept hold what they held in the previous body (a share of it, by their bytes, when some were left)
    shared_weight = previous.items_weight if reused == len(previous.items) else \
        previous.items_weight * (start - previous.list_start) // max(1, previous.close - previous.list_start)
    known = KnownBody(raw, key, previous.list_start, previous.head, items, previous.ends[:reused] + ends, close,
                      previous.head_weight,
                      shared_weight + _text_weight(raw, start, close) + built + READ_BYTES * len(ends),
                      previous.reading)
    return Parsed(raw, payload, reused, previous, known)


_CONTAINER = 232  # a parsed dict's own bytes, at most (as the scanner counts one)


def _text_weight(raw: bytes, start: int, end: int) -> int:
    """What the strings parsed from `raw[start:end]` hold of its text, at most: a byte a character where the text is
    ASCII with no escaped character, else up to four (one wide character widens its whole string)."""
    text = raw[start:end]
    return len(text) if text.isascii() and b"\\u" not in text else 4 * len(text)


_BEFORE_ITEM = re.compile(rb"[ \t\r\n]*,?[ \t\r\n]*")  # what separates an item from the one before


def written(original: dict, changed: dict, known: KnownBody | None) -> bytes:
    """`changed` as JSON, where it is `original` (the body `known` was parsed from) with items inserted into or
    replaced in its list: the unchanged items are the client's bytes as sent, only the others are written.
    (Elsewhere: written whole.)"""
    items = changed.get(known.key) if known is not None else None
    if items is None or not isinstance(items, list) or list(changed) != list(original) or any(
            changed[name] is not original[name] for name in original if name != known.key):
        return orjson.dumps(changed)
    raw, ends, place = known.raw, known.ends, {id(item): n for n, item in enumerate(known.items)}
    pieces: list[bytes] = []
    run: list[int] = []  # the first and last of consecutive known items

    def flush() -> None:
        if run:
            begin = _BEFORE_ITEM.match(raw, ends[run[0] - 1]).end() if run[0] else known.list_start
            pieces.append(raw[begin:ends[run[1]]])
            run.clear()

    for item in items:
        n = place.get(id(item))
        if n is not None and known.items[n] is item:
            if run and n == run[1] + 1:
                run[1] = n
                continue
            flush()
            run.extend((n, n))
        else:
            flush()
            pieces.append(orjson.dumps(item))
    flush()
    return raw[:known.list_start] + b",".join(pieces) + raw[known.close:]
