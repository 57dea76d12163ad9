"""An incremental Server-Sent Events parser: bytes in any split, the same events out."""

from __future__ import annotations

import re
from typing import NamedTuple


class SSEEvent(NamedTuple):
    data: bytes
    event: str | None = None


class SSEParser:
    """Feed raw bytes as they arrive; get back the events they complete.

    Lines end with LF, CRLF or CR. Comments (`: keep-alive`) and fields other
    than `data` and `event` are ignored; an event without data is not emitted.
    """

    __slots__ = ("_rest", "_data", "_event", "_skip_lf")

    def __init__(self) -> None:
        self._rest = b""
        self._data: list[bytes] = []
        self._event: str | None = None
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not self._rest and not self._data and not self._skip_lf and chunk.startswith(b"data: ") \
                and chunk.endswith(b"\n\n") and b"\r" not in chunk:
            # The usual case: whole one-line `data:` events, as providers send them; most often one.
            if chunk.count(b"\n") == 2:
                return [SSEEvent(chunk[6:-2])]
            blocks = chunk[:-2].split(b"\n\n")
            if all(block.startswith(b"data: ") and b"\n" not in block for block in blocks):
                return [SSEEvent(block[6:]) for block in blocks]
        if self._skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # second half of a CRLF split across chunks
        self._skip_lf = chunk.endswith(b"\r")
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = (self._rest + chunk).split(b"\n") if self._rest else chunk.split(b"\n")
        self._rest = lines.pop()
        events: list[SSEEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(SSEEvent(b"\n".join(self._data), self._event))
                self._data = []
                self._event = None
            elif line[0] == 58:  # ":" starts a comment
                continue
            else:
                name, sep, value = line.partition(b":")
                if sep and value.startswith(b" "):
                    value = value[1:]
                if name == b"data":
                    self._data.append(value)
                elif name == b"event":
                    self._event = value.decode("utf-8", "replace")
        return events


_BLANK_LINE = re.compile(rb"(?>\r\n|\r|\n)(?>\r\n|\r|\n)")


def complete_events_end(tail: bytes, chunk: bytes) -> int:
    """How many leading bytes of `chunk` end on an event boundary (a blank line).

    `tail` is the end of the bytes before `chunk` (a few bytes suffice), so a
    blank line split across the two is found too. Used to cut a stream without
    leaving a half event in front of the proxy's own last event.
    """
    joined = tail + chunk
    end = 0
    for match in _BLANK_LINE.finditer(joined):
        end = match.end()
    return max(0, end - len(tail))
