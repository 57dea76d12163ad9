"""The content layer: chanting, judged line by line so the verdict never depends on delta splits.

Every line is classified from its own characters (never from how a delta
happened to start): a fence toggles code and is not counted, code is not
counted, a divider resets and is not counted, a list item, heading, quote or
table row resets and is counted, prose is counted. Counted text is indexed at
every offset in CONTENT_CHUNK_SIZE windows; a window that recurs
CONTENT_LOOP_THRESHOLD times close together with few distinct gaps is chanting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# How far apart the occurrences may be on average, in chunk sizes, and how many
# characters a line may hold before it is classified no matter what follows.
GAP_CHUNKS = 5
CLASSIFY_WITHIN = 256

_PROSE, _STRUCTURE, _DIVIDER, _FENCE, _CODE = range(5)
_DIVIDER_CHARS = frozenset("-_=*~+") | frozenset(chr(c) for c in range(0x2500, 0x2580))
_LIST_NUMBER = re.compile(r"\d{1,9}[.)]")
_HEADING = re.compile(r"#{1,6}(?:[ \t]|$)")


@dataclass(frozen=True)
class Chant:
    repeated: str  # the text that repeats (one period, or the chunk)
    occurrences: int


def _classify(line: str, complete: bool, in_code: bool) -> int | None:
    """The kind of a line from its start; None while its start is still ambiguous."""
    if not complete and len(line) >= CLASSIFY_WITHIN:
        complete = True
    s = line.lstrip(" \t")
    if s.startswith(("```", "~~~")):
        return _FENCE
    if not complete and s in ("", "`", "``", "~", "~~"):
        return None
    if in_code:
        return _CODE
    if not s:
        return _PROSE
    first = s[0]
    if first in "|>":
        return _STRUCTURE
    if first == "#":
        if _HEADING.match(s):
            return _STRUCTURE
        return None if not complete and s == "#" * len(s) and len(s) <= 6 else _PROSE
    if first in "-*+" and len(s) > 1 and s[1] in " \t":
        return _STRUCTURE
    if first.isdigit():
        number = _LIST_NUMBER.match(s)
        if number and len(s) > number.end():
            return _STRUCTURE if s[number.end()] in " \t" else _PROSE
        if not complete and (number or s.isdigit()):
            return None
        return _PROSE
    if first in _DIVIDER_CHARS:
        body = s.rstrip(" \t")
        if all(c in _DIVIDER_CHARS or c in " \t" for c in body):
            if not complete:
                return None
            return _DIVIDER if sum(c in _DIVIDER_CHARS for c in body) >= 3 else _PROSE
    return _PROSE


class ContentTracker:
    """Chanting detector state for one task. Memory is bounded by the window kept."""

    __slots__ = ("chunk_size", "threshold", "_keep", "_text", "_base", "_next", "_index", "_line", "_kind",
                 "_in_code", "_muted", "_gram", "_grams", "_anchors", "_scan")

    def __init__(self, chunk_size: int = 50, threshold: int = 10, max_threshold: int | None = None) -> None:
        self.chunk_size = chunk_size
        self.threshold = threshold
        # Enough text to hold the last `threshold` occurrences at the widest allowed spacing.
        self._keep = chunk_size * GAP_CHUNKS * (max(threshold, max_threshold or 0) - 1) + chunk_size
        self._text = ""
        self._base = 0  # offset of _text[0] in the counted text
        self._next = 0  # offset of the next window to index
        self._index: dict[str, list[int]] = {}  # windows with no anchor: every offset
        self._gram = max(2, min(16, chunk_size // 2))
        self._grams: dict[str, list[int]] = {}  # anchor text -> anchor offsets
        self._anchors: list[tuple[int, str]] = []  # anchors found but not yet indexed, with their text
        self._scan = 1  # where the search for anchors goes on
        self._line = ""  # the current line while its kind is unknown
        self._kind: int | None = None
        self._in_code = False
        self._muted = False  # the rest of a message that already chanted is not counted again

    def clone(self) -> "ContentTracker":
        other = ContentTracker.__new__(ContentTracker)
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        other._index = {chunk: positions[:] for chunk, positions in self._index.items()}
        other._grams = {gram: positions[:] for gram, positions in self._grams.items()}
        other._anchors = list(self._anchors)
        return other

    def reset(self) -> None:
        """Start the tracking afresh (a structural line or a tool call)."""
        self._text = ""
        self._base = self._next = 0
        self._index = {}
        self._grams = {}
        self._anchors = []
        self._scan = 1

    def end_message(self) -> Chant | None:
        """A message ends its last line; the next message starts unmuted."""
        found = self.feed("\n") if (self._line or self._kind is not None) else None
        self._muted = False
        self._line = ""
        self._kind = None
        return found

    def feed(self, text: str) -> Chant | None:
        """Take the next piece of streamed text; return the chant it completes, if any.

        After a chant the tracking starts afresh and the rest of that message is
        ignored: one message completes at most one episode.
        """
        if self._muted:
            return None
        if self._kind is not None and self._kind <= _STRUCTURE and "\n" not in text:
            found = self._count(text)  # the usual delta: more of a line already known to count
        else:
            found = self._feed_lines(text)
        if found is not None:
            self.reset()
            self._muted = True
        return found

    def _feed_lines(self, text: str) -> Chant | None:
        found = None
        start = 0
        length = len(text)
        while start < length and found is None:
            newline = text.find("\n", start)
            end = length if newline < 0 else newline
            found = self._feed_line_part(text[start:end], complete=newline >= 0)
            start = end + 1
        return found

    def _feed_line_part(self, part: str, complete: bool) -> Chant | None:
        found = None
        if self._kind is None:
            self._line += part
            kind = _classify(self._line, complete, self._in_code)
            if kind is None:
                return None
            self._kind = kind
            if kind == _FENCE:
                self._in_code = not self._in_code
            if kind in (_STRUCTURE, _DIVIDER, _FENCE):
                self.reset()
            if kind in (_PROSE, _STRUCTURE):
                found = self._count(self._line)
            self._line = ""
        elif self._kind in (_PROSE, _STRUCTURE):
            found = self._count(part)
        if complete:
            if found is None and self._kind in (_PROSE, _STRUCTURE):
                found = self._count("\n")
            self._kind = None
            self._line = ""
        return found

    def _count(self, text: str) -> Chant | None:
        """Append counted text and check every window it completes.

        Exact, but sparse: a window can only repeat if the first word start inside it
        (an anchor: a position after a space) begins the same `_gram`-character text at
        the same place in every occurrence. So anchors are indexed by that text, and the
        windows before an anchor are looked at one by one only when the anchor's text has
        been seen `threshold` times. Windows with no anchor within reach (long runs
        without spaces) are indexed one by one.
        """
        if not text:
            return None
        body = self._text
        self._text = ""  # so `body` holds the only reference and += can grow it in place
        body += text
        self._text = body
        size, gram, base = self.chunk_size, self._gram, self._base
        last = base + len(body) - size  # the last window complete now
        if last < self._next:
            return None
        # New anchors (with their text), up to the last one a complete window can reach.
        reach = last + size - gram
        scan = self._scan
        anchors = self._anchors
        find = body.find
        while True:
            space = find(" ", scan - 1 - base, reach - base)
            if space < 0:
                break
            anchors.append((base + space + 1, body[space + 1 : space + 1 + gram]))
            scan = base + space + 2
        self._scan = max(scan, reach + 1)

        grams, threshold = self._grams, self.threshold
        reachable = size - gram
        found = None
        position = self._next
        taken = 0  # anchors indexed in this call
        pending = len(anchors)
        while position <= last:
            while taken < pending and anchors[taken][0] <= position:
                anchor, text_at = anchors[taken]
                seen = grams.get(text_at)
                if seen is None:
                    grams[text_at] = [anchor]
                else:
                    seen.append(anchor)
                taken += 1
            if taken < pending and anchors[taken][0] <= position + reachable:
                anchor, text_at = anchors[taken]
                end = anchor - 1 if anchor - 1 < last else last
                seen = grams.get(text_at)
                if seen is not None and len(seen) + 1 >= threshold:
                    found = self._windows_before(anchor, seen, position, end)
                    if found is not None:
                        break
                position = end + 1
            else:
                found = self._window_without_anchor(position)
                position += 1
                if found is not None:
                    break
        del anchors[:taken]
        self._next = position
        if len(self._text) > 2 * self._keep:
            self._trim()
        return found

    def _windows_before(self, anchor: int, earlier: list[int], first: int, last: int) -> Chant | None:
        """Windows first..last, whose first anchor is `anchor`; `earlier` anchors share its text."""
        body, base, size = self._text, self._base, self.chunk_size
        for position in range(first, last + 1):
            shift = anchor - position
            window = body[position - base : position - base + size]
            occurrences = [q - shift for q in earlier
                           if q - shift >= base and body[q - shift - base : q - shift - base + size] == window]
            if len(occurrences) + 1 >= self.threshold:
                occurrences.append(position)
                found = self._chanting(occurrences)
                if found is not None:
                    return found
        return None

    def _window_without_anchor(self, position: int) -> Chant | None:
        window = self._text[position - self._base : position - self._base + self.chunk_size]
        positions = self._index.get(window)
        if positions is None:
            self._index[window] = [position]
            return None
        positions.append(position)
        return self._chanting(positions) if len(positions) >= self.threshold else None

    def _chanting(self, positions: list[int]) -> Chant | None:
        recent = positions[-self.threshold :]
        if recent[-1] - recent[0] > self.chunk_size * GAP_CHUNKS * (self.threshold - 1):
            return None
        body, base = self._text, self._base
        gaps = {body[a - base : b - base] for a, b in zip(recent, recent[1:])}
        if len(gaps) > self.threshold // 2:
            return None
        last_gap = body[recent[-2] - base : recent[-1] - base]
        repeated = last_gap if len(last_gap) >= self.chunk_size else body[recent[-1] - base : recent[-1] - base
                                                                          + self.chunk_size]
        return Chant(repeated=repeated, occurrences=len(positions))

    def _trim(self) -> None:
        cut = len(self._text) - self._keep
        self._text = self._text[cut:]
        self._base += cut
        # Positions before the window are harmless (their span is always too wide to chant), so the
        # index is rebuilt only now and then, to bound its memory.
        floor = self._base
        if len(self._index) > 4 * self._keep:
            self._index = {
                chunk: kept for chunk, positions in self._index.items() if (kept := [p for p in positions if p >= floor])
            }
        if len(self._grams) > 4 * self._keep:
            self._grams = {
                gram: kept for gram, positions in self._grams.items() if (kept := [p for p in positions if p >= floor])
            }

    @property
    def state_size(self) -> int:
        """Characters plus index entries held: the memory this tracker uses grows with this."""
        return (len(self._text) + sum(len(p) for p in self._index.values())
                + sum(len(p) for p in self._grams.values()) + len(self._line))
