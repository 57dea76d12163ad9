"""An incremental Server-Sent Events parser: bytes in any split, the same events out."""

from __future__ import annotations

import re
from typing import NamedTuple

_LINE_END = re.compile(rb"\r\n|\r|\n")
# The most of one event that is read: an event larger than this (an upstream gone wrong, or hostile) is skipped
# unread, and the time spent on it stays linear in its size.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class SSEEvent(NamedTuple):
    data: bytes
    event: str | None = None
    end: int = 0  # where, in the chunk that completed it, the event's closing blank line ends


class SSEParser:
    """Feed raw bytes as they arrive; get back the events they complete.

    Lines end with LF, CRLF or CR. Comments (`: keep-alive`) and fields other
    than `data` and `event` are ignored; an event without data is not emitted.
    Each event says where it ended in the chunk, so a stream can be cut right
    after any event, whatever the network reads held. An event over MAX_EVENT_BYTES is skipped.
    """

    __slots__ = ("_rest", "_pieces", "_held", "_data", "_data_size", "_event", "_skip_lf", "_oversize")

    def __init__(self) -> None:
        self._rest = b""
        self._pieces: list[bytes] = []  # reads with no line end yet, joined once a line ends
        self._held = 0  # bytes of an unfinished line: _rest and _pieces
        self._data: list[bytes] = []
        self._data_size = 0
        self._event: str | None = None
        self._skip_lf = False
        self._oversize = False  # the current event grew past the limit: skipped to its end

    @property
    def at_boundary(self) -> bool:
        """Nothing of a next event has been read yet: the next chunk starts a new event."""
        return not self._held and not self._data and self._event is None and not self._skip_lf \
            and not self._oversize

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._held > 0 and b"\n" not in chunk and b"\r" not in chunk:
            # A line still going on: kept aside, not copied again with every read.
            self._pieces.append(chunk)
            self._held += len(chunk)
            if self._held > MAX_EVENT_BYTES:
                self._drop_event()
                self._pieces, self._rest = [], b""
                self._held = -1  # a line being skipped: the count no longer matters, only its end
            return []
        if self._held < 0:  # skipping the rest of an oversized line
            at = _LINE_END.search(chunk)
            if at is None:
                return []
            self._held = 0
            self._pieces = []
            self._rest = b""
            events = self.feed(chunk[at.end():])
            skipped = at.end()
            return [event._replace(end=event.end + skipped) for event in events]
        if self._pieces:
            self._rest = self._rest + b"".join(self._pieces)
            self._pieces = []
        return self._feed(chunk)

    def _drop_event(self) -> None:
        self._data = []
        self._data_size = 0
        self._oversize = True

    def _feed(self, chunk: bytes) -> list[SSEEvent]:
        if self.at_boundary and chunk.endswith(b"\n\n") and chunk.startswith((b"data: ", b"event: ")) \
                and b"\r" not in chunk:
            whole = self._whole_events(chunk)
            if whole is not None:
                return whole
        offset = len(self._rest)  # where `chunk` starts in the buffer
        buffer = self._rest + chunk if self._rest else chunk
        position = 0
        if self._skip_lf and chunk.startswith(b"\n"):
            position = offset + 1  # second half of a CRLF split across chunks
        self._skip_lf = False
        events: list[SSEEvent] = []
        for match in _LINE_END.finditer(buffer, position):
            line = buffer[position:match.start()]
            position = match.end()
            if not line:
                if self._data:
                    events.append(SSEEvent(b"\n".join(self._data), self._event, position - offset))
                self._data = []
                self._data_size = 0
                self._event = None
                self._oversize = False
            elif line[0] == 58:  # ":" starts a comment
                continue
            else:
                name, sep, value = line.partition(b":")
                if sep and value.startswith(b" "):
                    value = value[1:]
                if name == b"data":
                    if self._oversize:
                        continue
                    self._data.append(value)
                    self._data_size += len(value)
                    if self._data_size > MAX_EVENT_BYTES:
                        self._drop_event()
                elif name == b"event":
                    self._event = value.decode("utf-8", "replace")
        self._skip_lf = buffer.endswith(b"\r") and position == len(buffer)
        self._rest = buffer[position:]
        self._held = len(self._rest)
        if self._held > MAX_EVENT_BYTES:
            self._rest = b""
            self._drop_event()
            self._held = -1
        return events

    @staticmethod
    def _whole_events(chunk: bytes) -> list[SSEEvent] | None:
        """The usual case, read without the line machinery: whole events of one `data:` line, each
        perhaps named by one `event:` line before it, as providers send them; most often one. None when
        the chunk holds anything else."""
        if chunk.startswith(b"data: ") and chunk.count(b"\n") == 2:
            return [SSEEvent(chunk[6:-2], None, len(chunk))]
        events = []
        end = 0
        for block in chunk[:-2].split(b"\n\n"):
            end += len(block) + 2
            name = None
            if block.startswith(b"event: "):
                head, _, block = block.partition(b"\n")
                name = head[7:].decode("utf-8", "replace")
            if not block.startswith(b"data: ") or b"\n" in block:
                return None
            events.append(SSEEvent(block[6:], name, end))
        return events


_EVENT_ENDS = (b"\n\n", b"\r\r", b"\r\n\r\n")


def _last_event_end(data: bytes) -> int:
    """Where the last whole event in `data` ends (0: none does)."""
    end = 0
    for blank in _EVENT_ENDS:
        at = data.rfind(blank)
        if at >= 0:
            end = max(end, at + len(blank))
    return end


class Passing(NamedTuple):
    """What one read of an upstream stream comes to: the bytes that go to the client now; whether the stream
    ends with them (cut: read no more of it); whether an answer the service keeps was kept with this read, to be
    written before these bytes go out (a chained request may follow the moment the client has them)."""

    data: bytes
    last: bool = False
    kept: bool = False


class WholeEvents:
    """What of a relayed stream goes to the client now: every whole event that has arrived. The rest of an
    event is held until its blank line comes (a client acts on nothing before it anyway), so a stream that
    breaks off has given the client whole events only, and an error event written after them stands on its
    own (some clients even turn a lone `event:` line into an event with no data, and fail on it). An event
    larger than MAX_EVENT_BYTES is passed on as it comes."""

    __slots__ = ("_held", "_held_size", "_passing")

    def __init__(self) -> None:
        self._held: list[bytes] = []
        self._held_size = 0
        self._passing = False  # an oversized event is going out as it comes

    def pass_on(self, chunk: bytes) -> Passing:
        """A read of the stream, relayed unread."""
        return Passing(self.release(chunk))

    def release(self, chunk: bytes) -> bytes:
        """The part of what has arrived that may go out now."""
        if not self._held and chunk.endswith(_EVENT_ENDS):  # the usual read: whole events
            self._passing = False
            return chunk
        end = _last_event_end(chunk)
        if self._held and end < len(chunk) and chunk.startswith((b"\n", b"\r")):  # a blank line split apart
            end = max(end, _last_event_end(self._held[-1][-3:] + chunk) - min(3, len(self._held[-1])))
        if end == 0:
            if self._passing:
                return chunk
            self._held.append(chunk)
            self._held_size += len(chunk)
            if self._held_size > MAX_EVENT_BYTES:  # no event this long is read either: let it through
                self._passing = True
                return self.ended()
            return b""
        self._passing = False
        released = b"".join(self._held) + chunk[:end] if self._held else chunk[:end]
        self._held = [chunk[end:]] if end < len(chunk) else []
        self._held_size = len(chunk) - end
        return released

    def ended(self) -> bytes:
        """What is held, released whole: the stream ended as the upstream sent it (a last event without a blank
        line), or is cut here."""
        held = b"".join(self._held)
        self._held, self._held_size = [], 0
        return held

    def broken(self, error_event: bytes) -> bytes:
        """The upstream broke off: the dialect's error event, after what ends an oversized event that went out in
        part (what is held never goes out)."""
        self._held, self._held_size = [], 0
        return (b"\n\n" if self._passing else b"") + error_event
