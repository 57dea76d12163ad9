"""Comparing tool calls and results by meaning, not by bytes."""

from __future__ import annotations

import hashlib
import re

import orjson

# Everything that changes on every run without meaning anything, in one pass.
_NOISE = re.compile(
    r"""
      \x1b\[[0-9;?]*[\x20-\x2f]*[\x40-\x7e]                          # ANSI colour / cursor codes
    | \x1b\][^\x07\x1b]*(?:\x07|\x1b\\)                              # OSC sequences
    | \d{4}-\d{2}-\d{2}(?:[T\x20]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?  # ISO dates/times
    | \b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b                            # clock times
    | \b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun),?\x20\d{1,2}?\x20?(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\x20\d{1,4}
    | \b\d+(?:\.\d+)?\x20?(?:ns|µs|us|ms|s|sec|secs|seconds?|mins?|minutes?|h|hrs?|hours?)\b   # durations
    | \b(?:pid|PID|Pid)[\x20:=#]*\d+                                  # process ids
    | \b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b  # UUIDs
    | \b0x[0-9a-fA-F]{4,}\b                                          # addresses
    | \b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b               # hex ids, hashes
    | (?:/private)?/(?:tmp|var/tmp|var/folders)/[^\s'"`:,;)\]}]*    # temporary paths
    | [A-Za-z]:\\(?:Users\\[^\\\s]+\\AppData\\Local\\)?Te?mp\\[^\s'"`:,;)\]}]*
    """,
    re.VERBOSE,
)
_SPACE = re.compile(r"\s+")

# Judged on the start of a result only: a file whose body mentions "error" is not an error.
_ERROR_HEAD = 400
_ERROR_WORDS = re.compile(
    r"(?i)\b(?:error|errors|exception|traceback|not\x20found|no\x20such\x20file|permission\x20denied|"
    r"access\x20denied|failed|failure|fatal|cannot|could\x20not|unable\x20to|refused|timed\x20out|panic)\b"
)


def mask(text: str) -> str:
    """The text with run-to-run noise replaced and white space folded."""
    return _SPACE.sub(" ", _NOISE.sub("\x00", text)).strip()


def digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def canonical_arguments(arguments: object) -> str:
    """Arguments compared by value: key order and white space do not matter."""
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments.strip()
    else:
        value = arguments
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return str(value)


def reads_as_error(text: str) -> bool:
    return _ERROR_WORDS.search(text, 0, _ERROR_HEAD) is not None


def excerpt(text: str, limit: int = 120) -> str:
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
