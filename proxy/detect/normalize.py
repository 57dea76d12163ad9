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
      | (?<=\d)(?<!\d\d)(?:  # the first digit of a run only: a match tried at each digit would be quadratic
          \d{3}-\d{2}-\d{2}(?:[T\x20]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?  # ISO dates
            | [T_]\d{2}[_-]\d{2}(?:[_-]\d{2}(?:[._]\d+)?)?Z?)?  # in a file name: 2026-11-24T01_05_00_000Z-debug-0.log
        | \d?:\d{2}:\d{2}(?:[.,]\d+)?                                                  # clock times
        | [0-9a-fA-F]{7}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}   # UUIDs
        | x[0-9a-fA-F]{4,}                                                             # addresses
        | \d*+(?:\.\d+)?\x20?(?:ns|µs|us|ms|s|sec|secs|seconds?|mins?|minutes?|h|hrs?|hours?)\b  # durations
        | (?<=line\x20\d)\d*+(?=:)                                                        # a shell's line numbers
        )
      | (?:(?<=M)on|(?<=T)(?:ue|hu)|(?<=W)ed|(?<=F)ri|(?<=S)(?:at|un)),?\x20\d{1,2}\x20            # dates
        (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\x20\d{1,4}
      | (?<=[pP])(?:g?id|G?ID)[\x20:=#]*\d+                  # process and process group ids (Gemini CLI's PGID)
      | (?<=/)(?:private/)?(?:tmp|var/tmp|var/folders)/[^\s'"`:,;)\]}]*                   # temporary paths
      | (?<=\\)(?:AppData\\Local\\)?Temp\\[^\s'"`:,;)\]}]*
    )
    """,
    re.VERBOSE,
)
_HEX_RUN = re.compile(r"[0-9a-f]{7,}")
# An id after a label (`Chunk ID: d131b6`, `request_id=ab12`, `"call_id": "x"`), whatever its length. The
# pattern starts with its letters and looks back once, so the engine skips other text quickly.
_LABELED_ID = re.compile(r"""([Ii][Dd](?<![A-Za-z]..)"?[\x20\t]*[:=#][\x20\t]*"?)[\w.-]+""")
_SPACE = re.compile(r"\s+")

# What an error looks like, judged by its form on the start of the raw result, never by an error word
# somewhere in a successful answer. Each form is looked for only where a plain substring says it may be.
_ERROR_HEAD = 600
_LEADING_ERROR = re.compile(
    r"\W{0,3}(?:error|fatal|exception|panic|failed|failure|err)(?![a-z])"  # `Error:`, `fatal:`, `error[E0425]`
    r"|(?-i:[A-Z]\w*(?:Error|Exception))\b"  # `ValueError: ...`
    r"|invalid\x20(?:tool\x20)?(?:param|arg)",
    re.IGNORECASE,
)
_EXIT_CODE = re.compile(
    r"(?:exit(?:ed)?(?:\x20with)?[\x20_](?:code|status)|return[\x20_]?code|<returncode>)\W{0,3}-?[1-9]")
_SHELL_ERROR = re.compile(
    r"^(?:(?:/(?:usr/)?bin/)?(?:ba|z|da)?sh:\x20"  # the shell's own errors
    r"|[\w./-]+:\x20(?:[^\n]*:\x20)?(?:No\x20such\x20file\x20or\x20directory|Permission\x20denied"
    r"|command\x20not\x20found|Not\x20a\x20directory|Is\x20a\x20directory))",
    re.MULTILINE,
)
_SHELL_HINTS = ("sh: ", "No such file", "Permission denied", "not found", " a directory")
_VALIDATION = ("must not have additional properties", "must have required property", "is a required property",
               "validation error")
# The failure reports of the tools coding agents run, each anchored where its form lives: a line's start,
# a summary line. A test runner's summary and a build's verdict come last, so the tail is read as well.
_TOOL_TAIL = 1000
# A line is read up to this long: every form fits, and a pattern never backtracks over a line without end.
_TOOL_LINE = 500
_TOOL_FAILURE = re.compile(
    r"""^[\x20\t]*(?:
        FAILED\x20[^\s:]+::\S                                   # pytest: FAILED tests/test_a.py::test_x
      | =+\x20(?:FAILURES|ERRORS)\x20=+$                         # pytest's banners
      | =*\x20?(?:\d+\x20\w+,\x20)*[1-9]\d*\x20(?:failed|errors?)\b[^\n]*\bin\x20[\d.]+s\b  # pytest: 1 failed in 0.1s
      | FAILED\x20\((?:failures|errors)=\d                        # unittest
      | Tests?:?\x20+[1-9]\d*\x20failed\b                          # jest: Tests: 1 failed; vitest: Tests  1 failed
      | ---\x20FAIL:\x20 | FAIL(?:[\t\x20]+\S|$)                     # go test; jest's FAIL src/a.test.js
      | [1-9]\d*\x20fail(?:ing)?$                                  # bun test: 3 fail; mocha: 3 failing
      | [\#\u2139]\x20fail\x20[1-9]                                  # node --test: `# fail 1` (TAP), `ℹ fail 1`
      | test\x20result:\x20FAILED                                 # cargo test
      | (?:\[ERROR\]\x20)?Tests\x20run:\x20\d+,\x20Failures:\x20(?:[1-9]|0,\x20Errors:\x20[1-9])  # Surefire
      | (?:\[\w+\]\x20)?BUILD\x20FAIL(?:URE|ED)\b                  # Maven, Gradle
      | [^\s:(][^:\n(]*:\d+(?::\d+)?:\x20(?:fatal\x20)?error:      # gcc, clang, javac, swiftc: a.c:3:5: error:
      | [^\s(][^(\n]*\(\d+,\d+\):\x20error\x20TS\d                  # tsc: a.ts(3,5): error TS2322
      | \S+:\d+:\d+\x20-\x20error\x20TS\d                           # tsc --pretty: a.ts:3:5 - error TS2322
      | error\[E\d{4}\]                                         # rustc
      | [1-9]\d*\x20errors?$                                     # javac's count
      | npm\x20(?:ERR!|error\x20)                                # npm
      | ERROR:\x20                                              # pip
      | make(?:\[\d+\])?:\x20\*\*\*\x20[^\n]*\bError\x20\d           # make
      | EXECUTION\x20TIMED\x20OUT | Timed\x20out\b                  # timeouts
      | (?:The\x20)?(?:last\x20)?[Cc]ommand\b[^\n]{0,300}\btimed\x20out\b | [\w./-]+:\x20[^\n]{0,200}\btimed\x20out\b
      | \[?Your\x20proposed\x20edit\x20has\x20introduced\x20new\x20syntax\x20error   # SWE-agent's editor
    )""",
    re.MULTILINE | re.VERBOSE,
)
# Every form above holds one of these, in lower case: the pattern is tried only on the lines that do.
_TOOL_HINTS = ("fail", "rror", "err!", "timed out")


# A short answer that is nothing but a negative result: nothing found, nothing done (`No more results.`, `Could not
# find [x]. Similar: [...]`, `No files found`, `Element with index 12 not found`). The whole answer is its form, so
# it is read only on answers this short: the same words inside a longer answer say nothing of it.
_NEGATIVE_ANSWER = 500
_NEGATIVE_HEAD = re.compile(
    r"\W{0,3}(?:no\x20(?:more\x20)?(?:results?|match(?:es)?)\b|no\x20\w+(?:\x20\w+)?\x20found\b"
    r"|nothing\x20(?:found|happens|happened|to\x20\w+)\b"
    r"|(?:could\x20not|couldn't|cannot|can't|unable\x20to)\x20(?:find|locate|resolve)\b"
    r"|not\x20found\b|there\x20(?:is|are)\x20no\x20)",
    re.IGNORECASE,
)
_NEGATIVE_END = re.compile(r"(?:not\x20found|does\x20not\x20exist|doesn't\x20exist)\W{0,3}$", re.IGNORECASE)
_NEGATIVE_TAIL = 20  # the longest end form and its punctuation


def is_negative_answer(text: str) -> bool:
    """A short answer that only says nothing was found or nothing happened: an error by its form."""
    if len(text) > 4 * _NEGATIVE_ANSWER:  # not stripped whole: it may be a long answer
        return False
    text = text.strip()
    # The end's form is read on the end alone: searched over the whole answer, it costs more than every other form.
    return len(text) <= _NEGATIVE_ANSWER and bool(_NEGATIVE_HEAD.match(text)
                                                  or _NEGATIVE_END.search(text, max(0, len(text) - _NEGATIVE_TAIL)))


def argument_values(arguments: str) -> list[str]:
    """The texts a call's canonical arguments hold (its strings, or the whole of arguments that are not JSON),
    longest first: an answer that echoes them is read without them."""
    if arguments[:1] not in ("{", "["):
        return [arguments]
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return [arguments]
    found: list[str] = []
    stack = [value]
    while stack and len(found) < _ECHOED_VALUES:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return sorted(found, key=len, reverse=True)


_ECHOED_VALUES = 16
# An argument shorter than this is not looked for: `a` or `1` echoed says nothing.
_ECHO_MIN = 3


def without_echo(masked: str, arguments: str) -> str:
    """A masked answer with what the call asked for taken out (`Could not find [arun date songs]` is `Could not
    find [\x01]`): the same failure answering different arguments reads the same."""
    for value in argument_values(arguments):
        value = mask(value)
        if len(value) >= _ECHO_MIN and value in masked:
            masked = masked.replace(value, "\x01")
    return masked


_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


def first_sentence(text: str) -> str:
    """A text up to the end of its first sentence."""
    end = _SENTENCE_END.search(text)
    return text if end is None else text[:end.end()].rstrip()


def _hex_id(match: re.Match) -> str:
    run = match.group()
    return run if run.isdigit() or run.isalpha() else "\x00"  # an id mixes digits and letters


def mask(text: str) -> str:
    """The text with run-to-run noise replaced and white space folded."""
    text = _LABELED_ID.sub("\\1\x00", _NOISE.sub("\x00", text))
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
    except TypeError:  # a number past 64 bits, or nested past orjson's depth (255)
        try:
            return str(value)
        except RecursionError:  # nested past Python's own depth: compared as sent
            return arguments.strip() if isinstance(arguments, str) else "<arguments nested too deep to compare>"


def is_unchanged_read(text: str) -> bool:
    """An agent's own answer to a re-read, saying the file is as the earlier read showed it (Qwen Code's `[File
    a.txt unchanged since last read in this session. …]`, Claude Code's `File unchanged since last read. …`):
    it stands for that read's result."""
    head = text[:200].lstrip("[ ")
    return head.startswith("File") and "unchanged since last read" in head


def _failed_object(value: object) -> bool:
    """A JSON object that says it failed: `"success": false`, a non-empty `error`, a non-zero exit code
    (`"exit": 1`, `"exit_code": 2`, `"returncode": 1`, as shell tools answer), or `"status": "error"`."""
    if not isinstance(value, dict):
        return False
    if value.get("success") is False or value.get("error"):
        return True
    if any(isinstance(code := value.get(key), int) and not isinstance(code, bool) and code != 0
           for key in _EXIT_KEYS):
        return True
    status = value.get("status")
    return isinstance(status, str) and status.lower() == "error"


_EXIT_KEYS = ("exit", "exit_code", "exitCode", "returncode", "return_code")


def _usage(head: str, text: str) -> bool:
    """A usage message answering a malformed call (`Usage: edit <start_line>:<end_line>`): short, and not a
    help page asked for (`--help`, a list of options)."""
    if head[:6].lower() != "usage:" or text.count("\n") > 12:
        return False
    lowered = text.lower()
    return "--help" not in lowered and not any(section in lowered for section in _HELP_SECTIONS)


_HELP_SECTIONS = ("\noptions:", "\noptional arguments:", "\npositional arguments:", "\ncommands:")


def is_error_form(text: str) -> bool:
    """A tool result that reports a failure by its form: a leading `Error:`, a traceback, a non-zero exit
    code, a JSON answer that says it failed, a usage message, a shell or validation error, a tool's failure
    report (SPEC §5), a short answer that only says nothing was found."""
    head = text[:_ERROR_HEAD].lstrip()
    if head[:1] in ("{", "["):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
        else:
            # A JSON answer is an error when it says so: an object with `"success": false` or an `error`, or a
            # list of such objects (Cline's `[{"query": ..., "error": "Error reading file: ...", "success": false}]`).
            if isinstance(value, list):
                return bool(value) and all(_failed_object(item) for item in value)
            return _failed_object(value)
    if _usage(head, text):
        return True
    if _LEADING_ERROR.match(head) or "Traceback (most recent call last)" in head \
            or head.startswith("Exception in thread "):
        return True
    lowered = head.lower()
    if ("exit" in lowered or "code" in lowered) and _EXIT_CODE.search(lowered):
        return True
    if any(hint in head for hint in _SHELL_HINTS) and _SHELL_ERROR.search(head):
        return True
    if any(form in lowered for form in _VALIDATION):
        return True
    if _tool_failure(head, lowered):
        return True
    if is_negative_answer(text):
        return True
    if len(text) <= _ERROR_HEAD:
        return False
    # The rest, up to its last _TOOL_TAIL characters: a test run's summary and a build's verdict come last.
    begin = max(_ERROR_HEAD, len(text) - _TOOL_TAIL)
    tail = text[max(text.rfind("\n", 0, begin) + 1, begin - _TOOL_LINE):]
    return _tool_failure(tail, tail.lower())


def _tool_failure(text: str, lowered: str) -> bool:
    """A test runner's, compiler's, build tool's or editor's failure report, or a timeout, on a line of `text`
    (`lowered` is the same text in lower case)."""
    for hint in _TOOL_HINTS:
        at = lowered.find(hint)
        while at >= 0:
            start = text.rfind("\n", 0, at) + 1
            if _TOOL_FAILURE.match(text, start, start + _TOOL_LINE):
                return True
            end = text.find("\n", at)
            at = lowered.find(hint, end) if end >= 0 else -1
    return False


def excerpt(text: str, limit: int = 120) -> str:
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
