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
        | (?<=line\x20\d)\d*(?=:)                                                        # a shell's line numbers
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
# An id after a label (`Chunk ID: d131b6`, `request_id=ab12`, `"call_id": "x"`), whatever its length.
_LABELED_ID = re.compile(r"""(?<![A-Za-z])([Ii][Dd]"?[\x20\t]*[:=#][\x20\t]*"?)[\w.-]+""")
_SPACE = re.compile(r"\s+")

# What an error looks like, judged by its form, never by an error word somewhere in a successful answer.
_ERROR_HEAD = 600
_ERROR_FORMS = re.compile(
    r"""
      \A\W{0,3}(?:error|fatal|exception|panic|failed|failure|err)(?![a-z])             # a leading `Error:`, `fatal:`
    | \A[A-Z]\w*(?:Error|Exception)\b                                                  # `ValueError: ...`
    | Traceback\x20\(most\x20recent\x20call\x20last\) | ^Exception\x20in\x20thread\x20   # tracebacks
    | (?:exit(?:ed)?(?:\x20with)?[\x20_](?:code|status)|return[\x20_]?code)\W{0,3}-?[1-9]   # a non-zero exit code
    | <returncode>\s*-?[1-9]
    | ^(?:/(?:usr/)?bin/)?(?:ba|z|da)?sh:\x20                                          # the shell's own errors
    | ^[\w./-]+:\x20(?:[^\n]*:\x20)?(?:No\x20such\x20file\x20or\x20directory|Permission\x20denied
        |command\x20not\x20found|Not\x20a\x20directory|Is\x20a\x20directory)
    | must\x20NOT\x20have\x20additional\x20properties | must\x20have\x20required\x20property  # validation
    | is\x20a\x20required\x20property | validation\x20errors?\x20for | \A\W{0,3}invalid\x20(?:tool\x20)?(?:param|arg)
    """,
    re.VERBOSE | re.IGNORECASE | re.MULTILINE,
)


def _hex_id(match: re.Match) -> str:
    run = match.group()
    return run if run.isdigit() or run.isalpha() else "\x00"  # an id mixes digits and letters


def mask(text: str) -> str:
    """The text with run-to-run noise replaced and white space folded."""
    text = _NOISE.sub("\x00", text)
    if "d" in text or "D" in text:
        text = _LABELED_ID.sub("\\1\x00", text)
    return " ".join(_HEX_RUN.sub(_hex_id, text).split())


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


def is_error_form(text: str) -> bool:
    """A tool result that reports a failure by its form: a leading `Error:`, a traceback, a non-zero exit
    code, an `{"error": ...}` object, a shell or validation error. Judged on the raw text's start."""
    head = text[:_ERROR_HEAD].lstrip()
    if head.startswith("{"):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
        else:  # a JSON answer is an error when it says so in an `error` field
            return isinstance(value, dict) and bool(value.get("error"))
    return _ERROR_FORMS.search(head) is not None


def excerpt(text: str, limit: int = 120) -> str:
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
