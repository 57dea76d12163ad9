"""The content layer's rule (chanting), in plain Python: the statement of the rule, and the matcher used
when the compiled one (`proxy/detect/_content.pyx`) is not built.

Both give the same verdict at the same `feed` call, whatever the text and however it is split
(tests/test_content.py holds them equal). The rule, in the order the text goes through it:

1. Lines. Every line is classified from its own characters, never from how deltas fell (`classify`):
   a fence (```` ``` ````, `~~~`) toggles code and is not counted; a line in code is not counted; a
   divider (a line of 3 or more `-_=*~+^` and box-drawing characters, or of one other symbol repeated, or a
   table's separator row `|---|:--:|`) restarts the tracking and is not counted; a list item, heading, quote or table row restarts the
   tracking and is counted; anything else is prose, counted. A line's kind is decided by its first
   CLASSIFY_WITHIN characters at most.
2. Counted text. White space is folded: a run of it counts once (its first character), and none counts
   after a line break, so indentation and empty lines are never chanting and no window is blank.
3. Windows. Every `chunk_size` characters of counted text, at every offset, is a window. Each window is
   linked to the latest earlier window with the same text, and counts its run: how many windows with its
   text precede it along those links, itself included.
4. Chanting. A window whose run reaches `threshold` is tested: its last `threshold` occurrences must span
   at most GAP_CHUNKS chunk sizes per gap on average, and the texts between consecutive occurrences may
   take at most `threshold // 2` distinct values (so a list whose lines share a long prefix is not
   chanting). The chant reported is the last period between occurrences (or the window itself, when the
   occurrences overlap) and the number of occurrences still kept.
5. Memory. The counted text grows to twice `keep` characters (the widest span a chant can have at
   `max_threshold`, plus a window) and then drops its oldest half: an occurrence older than what is kept
   is no longer linked to.

6. Lines. Each complete prose line, stripped of its surrounding white space, is compared with the lines
   before it (blank lines are skipped; a line of any other kind, or longer than LINE_LIMIT, matches nothing
   and so breaks what runs): the same line shorter than `chunk_size` `threshold` times back to back is
   chanting (`OK.` over and over, out of the windows' reach); so is a short unit of 2 to SHORT_UNIT_LINES lines,
   together shorter than SHORT_UNIT_CHUNKS chunk sizes, said `short_unit_copies(threshold)` times back to back
   (an intention, a tool's name and a one-word answer, over and over: too short a period for the windows to
   count ten of it in so little text, too few lines for the blocks); and so is a block of BLOCK_LINES to
   MAX_BLOCK_LINES lines repeated BLOCK_COPIES times back to back (a block too long for the windows' gap).
7. Degenerate runs. The text the windows do not count (dividers, fences, code, with their line breaks) is
   read character by character, each compared with the DEGENERATE_UNIT characters before it: a unit of 1 to
   DEGENERATE_UNIT characters, not all white space, repeated back to back over DEGENERATE_CHARS characters
   is chanting (no divider is that long). Counted text breaks the run (there the windows see a run first).

After a chant the tracking restarts and the rest of that message is not counted: a message completes at
most one chant. A tool call restarts all of it (`reset`); a structural line restarts the windows only.
"""

from __future__ import annotations

import re
from collections import namedtuple

# How far apart the occurrences may be on average, in chunk sizes, and how many characters a line may hold
# before it is classified no matter what follows.
GAP_CHUNKS = 5
CLASSIFY_WITHIN = 256
# The line rules: the longest line compared, and the blocks looked for. A longer line matches nothing.
LINE_LIMIT = 2000
BLOCK_LINES = 5
MAX_BLOCK_LINES = 40
BLOCK_COPIES = 3
SHOWN_LINE = 200  # of a line kept to show the block it is part of
# Short units: 2 to SHORT_UNIT_LINES lines (a step the model narrates: "I'll check the file.", "read_file", "OK"),
# together shorter than SHORT_UNIT_CHUNKS chunk sizes (twice 50 characters by default). Such a unit said over and
# over has a period the windows count ten times only after 11 or more copies, and too few lines for the blocks, so
# a whole answer of 400 to 600 characters that is nothing but it escaped both. `short_unit_copies` says how many
# back-to-back copies make it a chant: 8 at the default threshold of 10. What looks alike and is not a loop stays
# well under that: a refrain sung 2 or 3 times, "Done." twice, a stanza repeated 4 times; lists, tables, headings
# and code match no line at all (a list's similar items, a table's separators, a log quoted in a fence). A single
# line keeps the threshold itself (the reference's nine sentences, a marker, nine more, are no chant), and a unit
# of longer lines is the windows' or the blocks' (two lines of 90 characters nine times are neither's).
SHORT_UNIT_LINES = 4
SHORT_UNIT_CHUNKS = 2
# Degenerate runs: the longest unit, and how long its run must be.
DEGENERATE_UNIT = 8
DEGENERATE_CHARS = 2000
_NO_RUNS = [0] * DEGENERATE_UNIT

Chant = namedtuple("Chant", "repeated occurrences")
Chant.__doc__ = "The text that repeats (one period, or the chunk) and how often its window occurs in the text kept."

# The kinds of line (the compiled matcher has the same numbers, checked when it is imported).
UNKNOWN = -1  # the line's start is still ambiguous: wait for more of it
PROSE = 0
STRUCTURE = 1  # a list item, heading, quote or table row: restarts the tracking, counted
DIVIDER = 2  # restarts the tracking, not counted
FENCE = 3  # toggles code, restarts the tracking, not counted
CODE = 4  # not counted

# Divider characters may mix on one line (`╭──╮`, `~~~^^^` under a traceback); any other symbol makes a divider
# when it alone is repeated (`......`, `!!!!!!`).
_DIVIDER_CHARS = frozenset("-_=*~+^") | frozenset(chr(c) for c in range(0x2500, 0x2580))
_LIST_NUMBER = re.compile(r"\d{1,9}[.)]")
_HEADING = re.compile(r"#{1,6}(?:[ \t]|$)")
_BLANK = frozenset(" \n\t\r")  # the white space that is folded
# A markdown table's separator row (`|---|:---:|`, however wide its cells) is a divider: no text of its own.
_TABLE_RULE_CHARS = frozenset("|-:+ \t")


def classify(line: str, complete: bool, in_code: bool) -> int:
    """The kind of a line from its start; UNKNOWN while its start is still ambiguous.

    `complete` says the line has ended (a newline followed it); `in_code` that it is inside a fence."""
    if not complete and len(line) >= CLASSIFY_WITHIN:
        complete = True
    s = line.lstrip(" \t")
    if s.startswith(("```", "~~~")):
        return FENCE
    if not complete and s in ("", "`", "``", "~", "~~"):
        return UNKNOWN
    if in_code:
        return CODE
    if not s:
        return PROSE
    first = s[0]
    if first == "|" and all(c in _TABLE_RULE_CHARS for c in s):  # a table's separator row, `|---|:--:|`, so far
        if not complete:
            return UNKNOWN
        return DIVIDER if "-" in s else STRUCTURE
    if first in "|>":
        return STRUCTURE
    if first == "#":
        if _HEADING.match(s):
            return STRUCTURE
        return UNKNOWN if not complete and s == "#" * len(s) and len(s) <= 6 else PROSE
    if first in "-*+" and len(s) > 1 and s[1] in " \t":
        return STRUCTURE
    if first.isdigit():
        number = _LIST_NUMBER.match(s)
        if number and len(s) > number.end():
            return STRUCTURE if s[number.end()] in " \t" else PROSE
        if not complete and (number or s.isdigit()):
            return UNKNOWN
        return PROSE
    if first in _DIVIDER_CHARS or not (first.isalnum() or first.isspace()):
        marks = _DIVIDER_CHARS if first in _DIVIDER_CHARS else (first,)
        body = s.rstrip(" \t")
        if all(c in marks or c in " \t" for c in body):
            if not complete:
                return UNKNOWN
            return DIVIDER if len(body) - body.count(" ") - body.count("\t") >= 3 else PROSE
    return PROSE


def short_unit_copies(threshold: int) -> int:
    """Back-to-back copies of a short unit of lines that make a chant: four fifths of the threshold, rounded up
    (8 at 10; 4 at the strict preset's 5), at least 2."""
    return max(2, (4 * threshold + 4) // 5)


def kept_characters(chunk_size: int, max_threshold: int) -> int:
    """The counted text kept after a trim: enough for `max_threshold` occurrences at the widest allowed
    spacing, plus the window itself."""
    return chunk_size * GAP_CHUNKS * (max(max_threshold, 2) - 1) + chunk_size


class LineRuns:
    """The line rules' state for one task, and the rules (both matchers hold one): the last MAX_BLOCK_LINES
    lines compared (None: a line that matches nothing), what is shown of each, where each recent line was,
    and per distance b how many lines in a row equal the one b before them (only distances with a run are
    kept, so a line costs a look-up, not a pass over the window)."""

    __slots__ = ("_lines", "_shown", "_where", "_same", "_count")

    def __init__(self) -> None:
        self._lines: list[str | None] = []
        self._shown: list[str] = []
        self._where: dict[str, list[int]] = {}  # line -> its places (by count) among the last MAX_BLOCK_LINES
        self._same: dict[int, int] = {}
        self._count = 0

    @property
    def seen(self) -> bool:
        return self._count > 0

    def clone(self) -> "LineRuns":
        other = LineRuns()
        other._lines, other._shown, other._same, other._count = self._lines[:], self._shown[:], dict(self._same), \
            self._count
        other._where = {line: places[:] for line, places in self._where.items()}
        return other

    def _short_unit(self, same: dict, chunk_size: int, copies: int) -> Chant | None:
        """The shortest unit of 2 to SHORT_UNIT_LINES short lines said `copies` times back to back, ending with the
        line just completed (its lines, together, under SHORT_UNIT_CHUNKS chunk sizes)."""
        for b in range(2, SHORT_UNIT_LINES + 1):
            run = same.get(b, 0)
            if run >= (copies - 1) * b:
                unit = self._lines[-b:]
                if sum(len(each) + 1 for each in unit) - 1 < SHORT_UNIT_CHUNKS * chunk_size:
                    return Chant("\n".join(unit), run // b + 1)
        return None

    def end_line(self, kind: int, parts: list[str], too_long: bool, chunk_size: int, threshold: int) -> Chant | None:
        """The rules for the line just completed (its kind, and its pieces when it is prose): a short line said
        `threshold` times back to back, a block repeated BLOCK_COPIES times. A blank line is skipped; a line other
        than prose, or too long to compare, matches nothing."""
        line = None
        if kind == PROSE and not too_long:
            line = "".join(parts).strip(" \t\r")
            if not line:
                return None
        n = self._count
        same = {}
        if line is not None:
            places = self._where.setdefault(line, [])
            for place in places:
                same[n - place] = self._same.get(n - place, 0) + 1
            places.append(n)
        self._same = same
        self._count = n + 1
        self._lines.append(line)
        self._shown.append(line[:SHOWN_LINE] if line is not None else "")
        if len(self._lines) > MAX_BLOCK_LINES:
            gone = self._lines.pop(0)
            del self._shown[0]
            if gone is not None:
                places = self._where[gone]
                del places[0]
                if not places:
                    del self._where[gone]
        # The same short line back to back: itself and the `threshold - 1` before it.
        if line is not None and len(line) < chunk_size and same.get(1, 0) + 1 >= max(threshold, 2):
            return Chant(line, same[1] + 1)
        if line is not None and len(same) and min(same) <= SHORT_UNIT_LINES:
            found = self._short_unit(same, chunk_size, short_unit_copies(threshold))
            if found is not None:
                return found
        blocks = [b for b, run in same.items() if b >= BLOCK_LINES and run >= (BLOCK_COPIES - 1) * b]
        if blocks:
            b = min(blocks)  # the block itself, not a run of its copies
            # A block that is a shorter unit said over and over (two lines, six times) is that unit's: the windows'.
            if not any(b % d == 0 and same[d] >= BLOCK_COPIES * b - d for d in same if d < b):
                return Chant("\n".join(self._shown[-b:]), same[b] // b + 1)
        return None


class ContentTracker:
    """Chanting detector state for one task. Memory is bounded by the window kept.

    The index: the counted text kept, one character per item from absolute offset `_base` (offsets
    below it are gone); per window (indexed like the text, by its first character) the offset of the
    previous window with the same text (or -1) and its run; and per window text, the offset of its latest
    window. A character costs one dictionary look-up and update, whatever the length of the text."""

    __slots__ = ("_chunk_size", "threshold", "_max_threshold", "_keep", "_chars", "_previous", "_runs",
                 "_latest", "_window", "_base", "_line", "_kind", "_in_code", "_muted", "_last_blank",
                 "_parts", "_parts_length", "_line_runs", "_recent", "_periods")

    def __init__(self, chunk_size: int = 50, threshold: int = 10, max_threshold: int | None = None):
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        self._chunk_size = chunk_size
        self.threshold = threshold
        self._max_threshold = max(threshold, max_threshold or 0)
        self._keep = kept_characters(chunk_size, self._max_threshold)
        self._chars: list[str] = []
        self._previous: list[int] = []  # per window: the offset of the previous one with its text, or -1
        self._runs: list[int] = []  # per window: how many windows with its text are linked, itself included
        self._latest: dict[str, int] = {}  # window text -> the offset of its latest window
        self._window = ""  # the last chunk_size characters counted
        self._base = 0
        # Line state.
        self._line = ""  # the current line while its kind is unknown
        self._kind = UNKNOWN
        self._in_code = False
        self._muted = False  # the rest of a message that already chanted is not counted again
        self._last_blank = True  # the last counted character was white space: a run of it counts as one
        # Line rules: the current prose line's pieces, and the rules' state over the lines before it.
        self._parts: list[str] = []
        self._parts_length = 0
        self._line_runs = LineRuns()
        # Degenerate runs: the last DEGENERATE_UNIT characters fed, and per unit length p how many characters
        # in a row equal the one p before.
        self._recent = ""
        self._periods = [0] * (DEGENERATE_UNIT + 1)

    @property
    def chunk_size(self) -> int:
        return self._chunk_size

    def clone(self) -> ContentTracker:
        other = ContentTracker(self._chunk_size, self.threshold, self._max_threshold)
        other._line, other._kind, other._in_code, other._muted = self._line, self._kind, self._in_code, self._muted
        other._base, other._window, other._last_blank = self._base, self._window, self._last_blank
        other._chars, other._previous, other._runs = self._chars[:], self._previous[:], self._runs[:]
        other._latest = dict(self._latest)
        other._parts, other._parts_length = self._parts[:], self._parts_length
        other._line_runs = self._line_runs.clone()
        other._recent, other._periods = self._recent, self._periods[:]
        return other

    def reset(self) -> None:
        """Start all the tracking afresh (a tool call, a chant found)."""
        self._restart_windows()
        self._parts, self._parts_length = [], 0
        if self._line_runs.seen:  # most tool calls follow no line at all
            self._line_runs = LineRuns()
        self._recent, self._periods = "", [0] * (DEGENERATE_UNIT + 1)

    def _restart_windows(self) -> None:
        """Start the windows afresh (a structural line)."""
        # Offsets go on rising, so nothing indexed so far can be mistaken for new text.
        self._base += len(self._chars)
        self._chars, self._previous, self._runs, self._latest = [], [], [], {}
        self._window = ""
        self._last_blank = True

    def end_message(self) -> Chant | None:
        """A message ends its last line; the next message starts unmuted."""
        found = self.feed("\n") if (self._line or self._kind != UNKNOWN) else None
        self._muted = False
        self._line = ""
        self._kind = UNKNOWN
        return found

    def feed(self, text: str) -> Chant | None:
        """Take the next piece of streamed text; return the Chant it completes, if any.

        After a chant the tracking starts afresh and the rest of that message is
        ignored: one message completes at most one episode.
        """
        if self._muted or not text:
            return None
        if (self._kind == PROSE or self._kind == STRUCTURE) and "\n" not in text:
            found = self._count(text)  # the usual delta: more of a line already known to count
            if self._kind == PROSE:
                self._add_part(text)
        else:
            found = self._feed_lines(text)
        if found is not None:
            self.reset()
            self._muted = True
        return found

    def _feed_lines(self, text: str) -> Chant | None:
        found = None
        start, length = 0, len(text)
        while start < length and found is None:
            newline = text.find("\n", start)
            end = length if newline < 0 else newline
            found = self._feed_line_part(text[start:end], newline >= 0)
            start = end + 1
        return found

    def _feed_line_part(self, part: str, complete: bool) -> Chant | None:
        found = None
        if self._kind == UNKNOWN:
            self._line += part
            kind = classify(self._line, complete, self._in_code)
            if kind == UNKNOWN:
                return None
            self._kind = kind
            if kind == FENCE:
                self._in_code = not self._in_code
            if kind in (STRUCTURE, DIVIDER, FENCE):
                self._restart_windows()
            if kind in (PROSE, STRUCTURE):
                found = self._count(self._line)
            else:
                found = self._degenerate(self._line)
            if kind == PROSE:
                self._add_part(self._line)
            self._line = ""
        elif self._kind in (PROSE, STRUCTURE):
            found = self._count(part)
            if self._kind == PROSE:
                self._add_part(part)
        else:
            found = self._degenerate(part)
        if complete:
            if found is None:
                found = self._count("\n") if self._kind in (PROSE, STRUCTURE) else self._degenerate("\n")
            repeated = self._end_line()
            found = found or repeated
            self._kind = UNKNOWN
            self._line = ""
        return found

    def _add_part(self, part: str) -> None:
        """Keep a piece of the current prose line, up to LINE_LIMIT characters (a longer line matches nothing)."""
        self._parts_length += len(part)
        if self._parts_length <= LINE_LIMIT:
            self._parts.append(part)
        else:
            self._parts = []

    def _end_line(self) -> Chant | None:
        parts, too_long = self._parts, self._parts_length > LINE_LIMIT
        self._parts, self._parts_length = [], 0
        return self._line_runs.end_line(self._kind, parts, too_long, self._chunk_size, self.threshold)

    def _degenerate(self, text: str) -> Chant | None:
        """Read text the windows do not count for a degenerate run."""
        recent, periods, most = self._recent, self._periods, DEGENERATE_UNIT
        joined = recent + text
        for i in range(len(recent), len(joined)):
            c = joined[i]
            if c not in joined[max(0, i - most):i]:  # most characters: no unit goes on here
                periods[1:] = _NO_RUNS
                continue
            for p in range(1, min(i, most) + 1):
                if joined[i - p] != c:
                    periods[p] = 0
                    continue
                periods[p] += 1
                # Tested once, as the run reaches the length: every later unit of the same run is a rotation of this
                # one, blank if it is.
                if periods[p] + p == DEGENERATE_CHARS:
                    unit = joined[i - p + 1:i + 1]
                    if unit.strip():
                        return Chant(unit, (periods[p] + p) // p)
        self._recent = joined[-most:]
        return None

    def _count(self, text: str) -> Chant | None:
        """Append counted text, indexing and testing every window it completes."""
        if self._recent:  # counted text breaks a degenerate run
            self._recent, self._periods = "", [0] * (DEGENERATE_UNIT + 1)
        size, threshold, most = self._chunk_size, self.threshold, 2 * self._keep
        chars, previous, runs, latest = self._chars, self._previous, self._runs, self._latest
        window, blank, base = self._window, self._last_blank, self._base
        found = None
        for c in text:
            if c in _BLANK:
                if blank:
                    continue
                blank = True
            else:
                blank = False
            if len(chars) >= most:
                # Drop the oldest half: no chant can reach back into it.
                cut = len(chars) - self._keep
                del chars[:cut]
                del previous[:cut]
                del runs[:cut]
                base += cut
                self._latest = latest = {key: offset for key, offset in latest.items() if offset >= base}
            chars.append(c)
            window = (window + c)[-size:]
            w = len(chars) - size  # the window this character completes, by its first character
            if w < 0:
                continue
            same = latest.get(window, -1)
            if same >= base:
                run = min(runs[same - base], 1 << 30) + 1
            else:
                same, run = -1, 1
            latest[window] = base + w
            previous.append(same)
            runs.append(run)
            if run >= threshold:
                self._base = base
                found = self._chanting(w)
                if found is not None:
                    break
        self._window, self._last_blank, self._base = window, blank, base
        return found

    def _chanting(self, w: int) -> Chant | None:
        """The rule for window `w`, seen `threshold` times in a row: close together, few distinct gaps."""
        size, base, previous = self._chunk_size, self._base, self._previous
        t = max(self.threshold, 2)
        recent = [base + w]  # its last t occurrences, latest first
        while len(recent) < t:
            earlier = previous[recent[-1] - base]
            if earlier < base:
                return None  # the earlier occurrences are further back than any chant spans
            recent.append(earlier)
        recent.reverse()
        if recent[-1] - recent[0] > size * GAP_CHUNKS * (t - 1):
            return None
        # Texts of different lengths differ: counting the lengths first spares reading the text most of the time.
        if len({b - a for a, b in zip(recent, recent[1:])}) > t // 2:
            return None
        first = recent[0] - base
        text = "".join(self._chars[first:recent[-1] - base + size])  # from the first occurrence to the last window
        between = {text[a - recent[0]:b - recent[0]] for a, b in zip(recent, recent[1:])}
        if len(between) > t // 2:
            return None
        gap = recent[-1] - recent[-2]
        start = (recent[-2] if gap >= size else recent[-1]) - recent[0]
        repeated = text[start:start + max(gap, size)]
        occurrences, q = 0, base + w
        while q >= base:
            occurrences += 1
            q = previous[q - base]
        return Chant(repeated, occurrences)

    @property
    def state_size(self) -> int:
        """Characters plus index entries held: the memory this tracker uses grows with this."""
        length = len(self._chars)
        return length + max(0, length - self._chunk_size + 1) + len(self._line)
