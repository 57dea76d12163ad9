# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Where a JSON document's list items are, as byte offsets, without building them: the span of a top-level
member's value, and the end of each item of a list. Used on bodies a JSON parser has accepted (or will check):
on such text it is exact, on other text it says where it lost its way (-1).

Pure code, no I/O, compiled only: where it is not built, a request body is parsed whole (`proxy/wire/known.py`).
"""

from libc.string cimport memchr, memcmp


cdef inline Py_ssize_t _space(const unsigned char *d, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    while i < n and (d[i] == 32 or d[i] == 10 or d[i] == 13 or d[i] == 9):
        i += 1
    return i


cdef Py_ssize_t _string_end(const unsigned char *d, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """Past the closing quote of the string whose opening quote is at `i`; -1 when it has none."""
    cdef const unsigned char *found
    cdef Py_ssize_t q, back
    i += 1
    while i < n:
        found = <const unsigned char *> memchr(d + i, 34, n - i)
        if found == NULL:
            return -1
        q = found - d
        back = q - 1
        while back >= i and d[back] == 92:  # an odd run of backslashes escapes the quote
            back -= 1
        if (q - 1 - back) % 2 == 0:
            return q + 1
        i = q + 1
    return -1


# What a parser builds for each JSON value beyond its text, in bytes, at most (CPython 3.11, 64-bit): a dict or
# list with its table, a str's header, a number or a container's slot for one more value.
cdef Py_ssize_t CONTAINER_BYTES = 232, STRING_BYTES = 56, VALUE_BYTES = 40


cdef Py_ssize_t _value_end(const unsigned char *d, Py_ssize_t i, Py_ssize_t n, Py_ssize_t *built) noexcept nogil:
    """Past the JSON value that begins at `i`; -1 when the text ends first. Adds to `built` what parsing it
    builds beyond its text (`CONTAINER_BYTES` a container, `STRING_BYTES` a string, `VALUE_BYTES` a value after a
    comma)."""
    cdef Py_ssize_t depth = 0
    cdef unsigned char c
    if i >= n:
        return -1
    c = d[i]
    if c == 34:
        built[0] += STRING_BYTES
        return _string_end(d, i, n)
    if c != 123 and c != 91:  # a number, true, false or null: up to the next delimiter
        built[0] += VALUE_BYTES
        while i < n and d[i] != 44 and d[i] != 93 and d[i] != 125 and d[i] != 32 and d[i] != 10 \
                and d[i] != 13 and d[i] != 9:
            i += 1
        return i
    while i < n:
        c = d[i]
        if c == 34:
            built[0] += STRING_BYTES
            i = _string_end(d, i, n)
            if i < 0:
                return -1
            continue
        if c == 123 or c == 91:
            depth += 1
            built[0] += CONTAINER_BYTES
        elif c == 44:
            built[0] += VALUE_BYTES
        elif c == 125 or c == 93:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def member(const unsigned char[::1] data, bytes key):
    """The (start, end) of the value of the top-level member `key` of the object `data` holds, and the bytes
    parsing the members before it builds beyond their text (at most); None when it has no such member, names it
    twice or more, or is not an object. (A key is matched as written, escapes and all.)"""
    cdef Py_ssize_t n = data.shape[0]
    if n == 0:
        return None
    cdef const unsigned char *d = &data[0]
    cdef Py_ssize_t i = _space(d, 0, n), key_end, start, end, built = 0, before = 0
    cdef Py_ssize_t k = len(key)
    cdef const unsigned char *wanted = key
    found = None
    if i >= n or d[i] != 123:
        return None
    i = _space(d, i + 1, n)
    if i < n and d[i] == 125:
        return None
    while i < n:
        if d[i] != 34:
            return None
        key_end = _string_end(d, i, n)
        if key_end < 0:
            return None
        start = _space(d, key_end, n)
        if start >= n or d[start] != 58:
            return None
        start = _space(d, start + 1, n)
        if found is None:
            before = built
        built += STRING_BYTES  # the member's name
        end = _value_end(d, start, n, &built)
        if end < 0:
            return None
        if key_end - i - 2 == k and memcmp(d + i + 1, wanted, k) == 0:
            if found is not None:
                return None
            found = (start, end, before)
        i = _space(d, end, n)
        if i < n and d[i] == 125:
            return found
        if i >= n or d[i] != 44:
            return None
        i = _space(d, i + 1, n)
    return None


def item_ends(const unsigned char[::1] data, Py_ssize_t start, bint after_item):
    """From `start`, just inside a list's `[` or (`after_item`) just past one of its items: the offset just past
    each further item, the offset of the list's closing `]`, and the bytes parsing those items builds beyond
    their text (at most). None when the text is not such a list."""
    cdef Py_ssize_t n = data.shape[0]
    if n == 0:
        return None
    cdef const unsigned char *d = &data[0]
    cdef Py_ssize_t i = _space(d, start, n), end, built = 0
    ends = []
    while i < n:
        if d[i] == 93:
            return ends, i, built
        if after_item:
            if d[i] != 44:
                return None
            i = _space(d, i + 1, n)
        end = _value_end(d, i, n, &built)
        if end < 0:
            return None
        ends.append(end)
        after_item = True
        i = _space(d, end, n)
    return None


def common_prefix(const unsigned char[::1] a, const unsigned char[::1] b):
    """How many leading bytes `a` and `b` share."""
    cdef Py_ssize_t n = min(a.shape[0], b.shape[0]), i = 0
    if n == 0:
        return 0
    cdef const unsigned char *x = &a[0]
    cdef const unsigned char *y = &b[0]
    # A page at a time to the first page that differs, then byte by byte.
    while i + 4096 <= n and memcmp(x + i, y + i, 4096) == 0:
        i += 4096
    while i < n and x[i] == y[i]:
        i += 1
    return i
