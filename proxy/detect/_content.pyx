# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, always_allow_keywords=False
"""The content layer's matcher, compiled: the rule of `proxy/detect/content_rule.py`, at a few nanoseconds
per character.

The rule (line classification, counted text, windows, the chanting test, trimming) is stated there; its
constants, `Chant` and the classification's character sets are imported from there, and its classification is
repeated here compiled (`_classify`, held equal to the rule's by a test). The index is in C arrays.

A stream arrives a token at a time, so a character has to cost little: each window gets a rolling hash, and
is linked to the previous window with the same text through a hash bucket (compared in full, so the verdict
is exact whatever the hash does). A window's run of identical predecessors is counted as it is indexed, so
the chanting test is only evaluated for a window already seen `threshold` times. tests/test_content.py holds
this matcher and the plain one to the same verdicts.
"""

import os

from proxy.detect import content_rule as rule
from proxy.detect.content_rule import (_DIVIDER_CHARS, _HEADING, _LIST_NUMBER, _TABLE_RULE_CHARS, CLASSIFY_WITHIN,
                                       DEGENERATE_CHARS, GAP_CHUNKS, LINE_LIMIT, Chant)

from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.unicode cimport PyUnicode_4BYTE_KIND, PyUnicode_FromKindAndData
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memcmp, memcpy, memmove

cdef extern from *:
    """
    /* Multiplication modulo the Mersenne prime 2^61 - 1. */
    static inline unsigned long long lw_mulmod(unsigned long long a, unsigned long long b) {
        unsigned __int128 x = (unsigned __int128)a * b;
        unsigned long long r = (unsigned long long)(x & 0x1FFFFFFFFFFFFFFFULL) + (unsigned long long)(x >> 61);
        return r >= 0x1FFFFFFFFFFFFFFFULL ? r - 0x1FFFFFFFFFFFFFFFULL : r;
    }
    """
    uint64_t lw_mulmod(uint64_t a, uint64_t b) noexcept nogil

# The kinds of line, as numbers the C code compares; the same as content_rule's (checked below).
cdef enum:
    UNKNOWN = -1
    PROSE = 0
    STRUCTURE = 1
    DIVIDER = 2
    FENCE = 3
    CODE = 4

if (UNKNOWN, PROSE, STRUCTURE, DIVIDER, FENCE, CODE) != (rule.UNKNOWN, rule.PROSE, rule.STRUCTURE, rule.DIVIDER,
                                                        rule.FENCE, rule.CODE):
    raise ImportError("the compiled content matcher numbers the kinds of line unlike proxy.detect.content_rule")

cdef uint64_t MODULUS = (1ULL << 61) - 1
# A base drawn per process: the verdict never depends on it (windows are compared in
# full), but text crafted to collide cannot slow the index down.
cdef uint64_t BASE = (1ULL << 20) + int.from_bytes(os.urandom(8), "little") % (MODULUS - (1ULL << 21))
cdef Py_ssize_t INITIAL_CAPACITY = 64  # most text before a tool call is short
# The degenerate runs' longest unit, as a C constant (the rule's, checked below).
cdef enum:
    UNIT = 8
if UNIT != rule.DEGENERATE_UNIT:
    raise ImportError("the compiled content matcher's degenerate unit differs from proxy.detect.content_rule's")
cdef Py_ssize_t RUN_CHARS = DEGENERATE_CHARS


def classify(str line, bint complete, bint in_code):
    """The compiled classification, for the test that holds it equal to `content_rule.classify`."""
    return _classify(line, complete, in_code)


cdef int _classify(str line, bint complete, bint in_code) except -2:
    """`content_rule.classify`, compiled: a line is classified at each delta until its kind is known, and a call
    to the Python function would cost a tenth of this matcher's time on a token stream."""
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


cdef inline bint _has_newline(str text):
    # A plain loop: for a token-sized delta it costs a tenth of str.find.
    cdef Py_UCS4 c
    for c in text:
        if c == u"\n":
            return True
    return False


cdef void *_resized(void *block, size_t size) except NULL:
    """The block grown or shrunk to `size` bytes; on failure it is left as it was."""
    cdef void *resized = PyMem_Realloc(block, size)
    if resized == NULL:
        raise MemoryError()
    return resized


ctypedef struct Window:
    uint64_t hash
    int64_t bucket_prev  # the previous window in the same hash bucket
    int64_t same_prev  # the previous window with the same text
    int32_t run  # identical windows in a row, this one included


cdef class ContentTracker:
    """Chanting detector state for one task. Memory is bounded by the window kept."""

    cdef readonly int chunk_size
    cdef public int threshold
    cdef int max_threshold
    cdef Py_ssize_t keep  # characters kept after a trim: the widest allowed span of occurrences
    cdef uint64_t base_power  # BASE ** chunk_size, to drop a character from the rolling hash
    # The counted text kept, from absolute offset `base`, and a record per window, indexed
    # like `chars` by the window's first character. Absolute offsets below `base` are gone.
    # (Cython starts C attributes at zero: no arrays until text arrives.)
    cdef Py_UCS4 *chars
    cdef Window *windows
    cdef Py_ssize_t length, capacity
    cdef int64_t base
    cdef uint64_t rolling  # hash of the last chunk_size characters
    cdef int64_t *heads  # hash bucket -> its latest window
    cdef Py_ssize_t head_mask
    # Line state.
    cdef str line  # the current line while its kind is unknown
    cdef int kind
    cdef bint in_code
    cdef bint muted  # the rest of a message that already chanted is not counted again
    cdef bint last_blank  # the last counted character was white space: a run of it counts as one
    # Line rules (as the rule keeps them).
    cdef list parts
    cdef Py_ssize_t parts_length
    cdef object line_runs
    # Degenerate runs: the last UNIT characters read (`recent_count` of them) and the runs per unit length.
    cdef Py_UCS4 recent[UNIT]
    cdef Py_ssize_t recent_count
    cdef Py_ssize_t periods[UNIT + 1]

    def __init__(self, int chunk_size=50, int threshold=10, max_threshold=None):
        cdef int i
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        self.chunk_size = chunk_size
        self.threshold = threshold
        self.max_threshold = max(threshold, max_threshold or 0)
        # Enough text to hold the last `threshold` occurrences at the widest allowed spacing.
        self.keep = rule.kept_characters(chunk_size, self.max_threshold)
        self.base_power = 1
        for i in range(chunk_size):
            self.base_power = lw_mulmod(self.base_power, BASE)
        self.line = ""
        self.kind = UNKNOWN
        self.last_blank = True
        self.parts, self.parts_length = [], 0
        self.line_runs = rule.LineRuns()

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        PyMem_Free(self.chars)
        PyMem_Free(self.windows)
        PyMem_Free(self.heads)
        self.chars = NULL
        self.windows = NULL
        self.heads = NULL
        self.capacity = 0
        self.head_mask = 0

    def clone(self):
        cdef ContentTracker other = ContentTracker(self.chunk_size, self.threshold, self.max_threshold)
        other.line, other.kind, other.in_code, other.muted = self.line, self.kind, self.in_code, self.muted
        other.base, other.rolling, other.last_blank = self.base, self.rolling, self.last_blank
        if self.length:
            other._allocate(self.capacity)
            memcpy(other.chars, self.chars, self.length * sizeof(Py_UCS4))
            memcpy(other.windows, self.windows, self.length * sizeof(Window))
            memcpy(other.heads, self.heads, (self.head_mask + 1) * sizeof(int64_t))
            other.length = self.length
        other.parts, other.parts_length = self.parts[:], self.parts_length
        other.line_runs = self.line_runs.clone()
        other.recent, other.recent_count, other.periods = self.recent, self.recent_count, self.periods
        return other

    def reset(self):
        """Start all the tracking afresh (a tool call, a chant found)."""
        self._restart_windows()
        self.parts, self.parts_length = [], 0
        if self.line_runs.seen:  # most tool calls follow no line at all
            self.line_runs = rule.LineRuns()
        self._break_run()

    cdef inline void _break_run(self) noexcept:
        cdef Py_ssize_t p
        self.recent_count = 0
        for p in range(UNIT + 1):
            self.periods[p] = 0

    cdef void _restart_windows(self) noexcept:
        """Start the windows afresh (a structural line)."""
        # Offsets go on rising, so nothing indexed so far can be mistaken for new text; the
        # arrays are given back (a session idle after a tool call holds none).
        self.base += self.length
        self.length = 0
        self.rolling = 0
        self.last_blank = True
        self._release()

    def end_message(self):
        """A message ends its last line; the next message starts unmuted."""
        found = self.feed("\n") if (self.line or self.kind != UNKNOWN) else None
        self.muted = False
        self.line = ""
        self.kind = UNKNOWN
        return found

    def feed(self, str text):
        """Take the next piece of streamed text; return the Chant it completes, if any.

        After a chant the tracking starts afresh and the rest of that message is
        ignored: one message completes at most one episode.
        """
        if self.muted or not text:
            return None
        if PROSE <= self.kind <= STRUCTURE and not _has_newline(text):
            found = self._count(text)  # the usual delta: more of a line already known to count
            if self.kind == PROSE:
                self._add_part(text)
        else:
            found = self._feed_lines(text)
        if found is not None:
            self.reset()
            self.muted = True
        return found

    cdef object _feed_lines(self, str text):
        found = None
        cdef Py_ssize_t start = 0, end, newline, length = len(text)
        while start < length and found is None:
            newline = text.find("\n", start)
            end = length if newline < 0 else newline
            found = self._feed_line_part(text[start:end], newline >= 0)
            start = end + 1
        return found

    cdef object _feed_line_part(self, str part, bint complete):
        found = None
        if self.kind == UNKNOWN:
            self.line += part
            kind = _classify(self.line, complete, self.in_code)
            if kind == UNKNOWN:
                return None
            self.kind = kind
            if kind == FENCE:
                self.in_code = not self.in_code
            if kind in (STRUCTURE, DIVIDER, FENCE):
                self._restart_windows()
            if kind in (PROSE, STRUCTURE):
                found = self._count(self.line)
            else:
                found = self._degenerate(self.line)
            if kind == PROSE:
                self._add_part(self.line)
            self.line = ""
        elif self.kind in (PROSE, STRUCTURE):
            found = self._count(part)
            if self.kind == PROSE:
                self._add_part(part)
        else:
            found = self._degenerate(part)
        if complete:
            if found is None:
                found = self._count("\n") if self.kind in (PROSE, STRUCTURE) else self._degenerate("\n")
            repeated = self._end_line()
            found = found or repeated
            self.kind = UNKNOWN
            self.line = ""
        return found

    cdef void _add_part(self, str part):
        self.parts_length += len(part)
        if self.parts_length <= LINE_LIMIT:
            self.parts.append(part)
        else:
            self.parts = []

    cdef object _end_line(self):
        """A line is complete: the line rules, as `content_rule.LineRuns` states them."""
        parts, too_long = self.parts, self.parts_length > LINE_LIMIT
        self.parts, self.parts_length = [], 0
        return self.line_runs.end_line(self.kind, parts, too_long, self.chunk_size, self.threshold)

    cdef object _degenerate(self, str text):
        """Read text the windows do not count for a degenerate run."""
        cdef Py_UCS4 c
        cdef Py_ssize_t p, seen, last, i
        cdef bint near
        for c in text:
            seen = self.recent_count
            last = seen if seen < UNIT else UNIT
            near = False
            for p in range(1, last + 1):
                if self.recent[(seen - p) % UNIT] == c:
                    near = True
                    break
            if not near:
                for p in range(1, UNIT + 1):
                    self.periods[p] = 0
            else:
                for p in range(1, last + 1):
                    if self.recent[(seen - p) % UNIT] != c:
                        self.periods[p] = 0
                        continue
                    self.periods[p] += 1
                    if self.periods[p] + p >= RUN_CHARS:
                        unit = "".join([chr(self.recent[(seen - p + 1 + i) % UNIT]) for i in range(p - 1)]) + chr(c)
                        if unit.strip():
                            return Chant(unit, (self.periods[p] + p) // p)
            self.recent[seen % UNIT] = c
            self.recent_count = seen + 1
        return None

    cdef object _count(self, str text):
        """Append counted text, indexing and checking every window it completes.

        White space is folded: a run of it counts as one space, and none is counted after a line
        break, so indentation and empty lines are never chanting, and no window is blank."""
        cdef Py_UCS4 c
        cdef Py_ssize_t window
        if self.recent_count:  # counted text breaks a degenerate run
            self._break_run()
        for c in text:
            if c == u" " or c == u"\n" or c == u"\t" or c == u"\r":
                if self.last_blank:
                    continue
                self.last_blank = True
            else:
                self.last_blank = False
            window = self._append(c)
            if window >= 0:
                found = self._chanting(window)
                if found is not None:
                    return found
        return None

    cdef inline Py_ssize_t _append(self, Py_UCS4 c) except -2:
        """Add one character; the index of the window it completes if that window has been
        seen `threshold` times in a row, else -1."""
        cdef Py_ssize_t size = self.chunk_size, w, i
        cdef uint64_t h, leaving
        cdef int64_t position, q, same
        cdef Py_ssize_t bucket
        if self.length == self.capacity:
            self._make_room()
        self.chars[self.length] = c
        self.length += 1
        leaving = <uint64_t>self.chars[self.length - 1 - size] if self.length > size else 0
        h = lw_mulmod(self.rolling, BASE) + <uint64_t>c + (MODULUS - lw_mulmod(leaving, self.base_power))
        while h >= MODULUS:
            h -= MODULUS
        self.rolling = h
        w = self.length - size
        if w < 0:
            return -1
        position = self.base + w
        bucket = h & self.head_mask
        same = -1
        q = self.heads[bucket]
        while q >= self.base:
            i = q - self.base
            if self.windows[i].hash == h and memcmp(self.chars + i, self.chars + w, size * sizeof(Py_UCS4)) == 0:
                same = q
                break
            q = self.windows[i].bucket_prev
        self.windows[w].hash = h
        self.windows[w].bucket_prev = self.heads[bucket]
        self.heads[bucket] = position
        self.windows[w].same_prev = same
        self.windows[w].run = 1 if same < 0 else min(self.windows[same - self.base].run, 1 << 30) + 1
        return w if self.windows[w].run >= self.threshold else -1

    cdef int _make_room(self) except -1:
        """Grow the arrays up to twice the text kept; after that, drop the oldest text."""
        cdef Py_ssize_t cut, most = 2 * self.keep
        if self.capacity < most:
            self._allocate(min(max(INITIAL_CAPACITY, 2 * self.capacity), most))
            return 0
        cut = self.length - self.keep
        memmove(self.chars, self.chars + cut, self.keep * sizeof(Py_UCS4))
        memmove(self.windows, self.windows + cut, self.keep * sizeof(Window))
        self.base += cut
        self.length = self.keep
        return 0

    cdef int _allocate(self, Py_ssize_t capacity) except -1:
        """Resize the arrays to `capacity` and the hash buckets to match (rebuilt if resized)."""
        cdef Py_ssize_t buckets = 1, w, bucket
        self.chars = <Py_UCS4 *>_resized(self.chars, capacity * sizeof(Py_UCS4))
        self.windows = <Window *>_resized(self.windows, capacity * sizeof(Window))
        self.capacity = capacity
        while buckets < capacity:
            buckets *= 2
        if buckets == self.head_mask + 1 and self.heads != NULL:
            return 0
        self.heads = <int64_t *>_resized(self.heads, buckets * sizeof(int64_t))
        self.head_mask = buckets - 1
        for bucket in range(buckets):
            self.heads[bucket] = -1
        for w in range(self.length - self.chunk_size + 1):
            bucket = self.windows[w].hash & self.head_mask
            self.windows[w].bucket_prev = self.heads[bucket]
            self.heads[bucket] = self.base + w
        return 0

    cdef object _chanting(self, Py_ssize_t w):
        """The rule for window `w`, seen `threshold` times in a row: close together, few distinct gaps."""
        cdef Py_ssize_t t = max(self.threshold, 2), k, j, distinct, gap, start
        cdef int64_t *recent = <int64_t *>_resized(NULL, t * sizeof(int64_t))
        cdef int64_t q
        try:
            recent[t - 1] = self.base + w
            for k in range(t - 2, -1, -1):
                recent[k] = self.windows[recent[k + 1] - self.base].same_prev
                if recent[k] < self.base:
                    return None  # the earlier occurrences are further back than any chant spans
            if recent[t - 1] - recent[0] > self.chunk_size * GAP_CHUNKS * (t - 1):
                return None
            distinct = 0
            for k in range(t - 1):
                gap = recent[k + 1] - recent[k]
                for j in range(k):
                    if recent[j + 1] - recent[j] == gap and memcmp(
                            self.chars + (recent[j] - self.base), self.chars + (recent[k] - self.base),
                            gap * sizeof(Py_UCS4)) == 0:
                        break
                else:
                    distinct += 1
            if distinct > t // 2:
                return None
            gap = recent[t - 1] - recent[t - 2]
            start = (recent[t - 2] if gap >= self.chunk_size else recent[t - 1]) - self.base
            repeated = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, self.chars + start,
                                                 gap if gap >= self.chunk_size else self.chunk_size)
            occurrences = 0
            q = self.base + w
            while q >= self.base:
                occurrences += 1
                q = self.windows[q - self.base].same_prev
            return Chant(repeated, occurrences)
        finally:
            PyMem_Free(recent)

    @property
    def state_size(self):
        """Characters plus index entries held: the memory this tracker uses grows with this."""
        return self.length + max(0, self.length - self.chunk_size + 1) + len(self.line)
