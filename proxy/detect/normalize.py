"""Comparing tool calls and results by meaning, not by bytes."""

from __future__ import annotations

import hashlib
import re

import orjson

# Everything that changes on every run without meaning anything. The pattern starts with the
# set of characters a masked run can start with, so the regex engine skips other text in C; each
# branch then checks, looking back, which character it started with.
_NOISE = re.compile(
    r"""
    [\x1b0-9MTWFSpP/\\]
    (?:
        (?<=\x1b)(?:\[[0-9;?]*[\x20-\x2f]*[\x40-\x7e]|\][^\x07\x1b]*(?:\x07|\x1b\\))      # ANSI / OSC sequences
      | (?<=\d)(?:
          \d{3}-\d{2}-\d{2}(?:[T\x20]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?  # ISO dates
        | \d?:\d{2}:\d{2}(?:[.,]\d+)?                                                  # clock times
        | [0-9a-fA-F]{7}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}   # UUIDs
        | x[0-9a-fA-F]{4,}                                                             # addresses
        | \d*(?:\.\d+)?\x20?(?:ns|µs|us|ms|s|sec|secs|seconds?|mins?|minutes?|h|hrs?|hours?)\b  # durations
        )
      | (?:(?<=M)on|(?<=T)(?:ue|hu)|(?<=W)ed|(?<=F)ri|(?<=S)(?:at|un)),?\x20\d{1,2}\x20            # dates
        (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\x20\d{1,4}
      | (?<=[pP])(?:id|ID)[\x20:=#]*\d+                                                 # process ids
      | (?<=/)(?:private/)?(?:tmp|var/tmp|var/folders)/[^\s'"`:,;)\]}]*                   # temporary paths
      | (?<=\\)(?:AppData\\Local\\)?Temp\\[^\s'"`:,;)\]}]*
    )
    """,
    re.VERBOSE,
)
_HEX_RUN = re.compile(r"[0-9a-f]{7,}")
_SPACE = re.compile(r"\s+")

# Judged on the start of a result only: a file whose body mentions "error" is not an error.
_ERROR_HEAD = 400
_ERROR_WORDS = ("error", "exception", "traceback", "not found", "no such file", "permission denied",
                "access denied", "failed", "failure", "fatal", "cannot", "could not", "unable to", "refused",
                "timed out", "panic")


def _hex_id(match: re.Match) -> str:
    run = match.group()
    return run if run.isdigit() or run.isalpha() else "\x00"  # an id mixes digits and letters


def mask(text: str) -> str:
    """The text with run-to-run noise replaced and white space folded."""
    return " ".join(_HEX_RUN.sub(_hex_id, _NOISE.sub("\x00", text)).split())


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
    head = text[:_ERROR_HEAD].lower()
    return any(word in head for word in _ERROR_WORDS)


def excerpt(text: str, limit: int = 120) -> str:
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
