"""The tool-call layer: the same call again and again, cycles of calls, the same error again and again."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

import orjson

from proxy.detect.normalize import argument_values, digest, mask

MAX_CYCLE = 8
# Cycles longer than this need one round fewer: 4 rounds of a 6-call cycle are 24 calls of the same thing.
LONG_CYCLE = 6
ERROR_REPEATS = 3
# Different calls meeting one error are weaker evidence than one call failing alike (a variant tried, then another,
# is how a cause is found), and so is a short answer that only says nothing was found or a harness's nudge to go on
# (searching again with new terms and finding nothing is the search at work; a model answering in text again may be
# done): they need one more. Different calls meeting an error, one of them made again at once, unchanged (a blind
# retry), need no more than the same call would.
WEAKER_EXTRA = 1
# An error text this long or shorter is the whole (masked) answer; a longer one is its start and end.
WHOLE_ERROR = 500
# Past this many times the threshold, identical calls in a row, or rounds of the same calls in the same order,
# are a loop whatever their results (an edit is one at the threshold: applying it again changes the file
# every time, and is never progress).
BLIND_REPEATS = 3


# A tool is an edit when a word of its name says so (`str_replace_based_edit_tool`, `apply_patch`, `write_file`,
# `MultiEdit`, a text agent's `edit` command), or a policy marks it `edit = true`.
_NAME_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
_EDIT_STEMS = ("edit", "write", "rewrit", "replac", "patch", "insert")


@functools.lru_cache(maxsize=4096)
def is_edit(name: str) -> bool:
    """Whether a tool's name says it edits: applying the same edit again changes the file every time."""
    for word in _NAME_WORD.findall(name):
        word = word.lower()
        if word.startswith(_EDIT_STEMS) or word in ("apply", "applies"):
            return True
    return False


# A call changes a file when its arguments name one and carry what goes into it, or carry a patch. A word in the
# tool's name is not enough: Codex CLI polls a running process with `write_stdin` and empty `chars`.
_FILE_KEYS = frozenset({"path", "file_path", "filePath", "filename", "file", "target_file", "targetFile",
                        "absolute_path", "notebook_path", "TargetFile"})
_CONTENT_KEYS = frozenset({"content", "contents", "new_str", "new_string", "newString", "old_str", "old_string",
                           "oldString", "file_text", "edits", "text", "code", "code_edit", "replace", "search",
                           "replacement", "new_source", "diff", "patch", "insert_line", "lines", "ReplacementContent",
                           "CodeContent", "CodeEdit"})
_PATCH_MARKS = ("*** Begin Patch", "\\n@@ ", "\\n+++ ")  # a newline inside JSON text is written `\\n`


def changes_a_file(arguments: str) -> bool:
    """Whether a call's canonical arguments change a file: a path and new content, or a patch. Arguments that
    are not JSON are a text agent's command or a patch written out (SWE-agent's `edit 12:14 ...`, aider's
    blocks): an edit whenever they say anything."""
    if arguments[:1] != "{":
        return bool(arguments) and arguments[:1] != "["
    if any(mark in arguments for mark in _PATCH_MARKS):
        return True
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return True
    if not isinstance(value, dict):
        return False
    keys = value.keys()
    return not _FILE_KEYS.isdisjoint(keys) and not _CONTENT_KEYS.isdisjoint(keys)


# -- what a call runs -------------------------------------------------------------------------------------------
# For a shell tool "the call" is what the command runs (the program and its script or target, after any
# `cd DIR &&`), never the tool's name nor the command's first word alone: `python solve.py` and
# `cd /app && timeout 60 python solve.py < big.in` run the same thing, `python solve.py` and `python solve2.py`
# do not.
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "fish", "/bin/bash", "/bin/sh", "/bin/zsh", "/usr/bin/bash"})
_SHELL_FLAGS = frozenset({"-c", "-lc", "-ic", "-cl", "-lic"})
_WRAPPERS = frozenset({"time", "sudo", "nohup", "env", "exec", "command", "stdbuf", "nice", "xvfb-run"})
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&"})
_COMMAND_HEAD = 500  # the first line is read this far: the program and its target come first


def shell_command(name: str, arguments: str) -> str | None:
    """The command line a shell call runs (a JSON `command` or `cmd`, a string or an argv list; a text agent's
    command written out, named after its first word), or None for a call that is no shell's."""
    if arguments[:1] == "{":
        if ('"command"' not in arguments and '"cmd"' not in arguments) or is_edit(name):
            return None  # an editor's `command` is its operation (`view`, `str_replace`), no command line
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return None
        command = value.get("command", value.get("cmd")) if isinstance(value, dict) else None
        if isinstance(command, list) and command and all(isinstance(part, str) for part in command):
            if len(command) >= 3 and command[0] in _SHELLS and command[1] in _SHELL_FLAGS:
                return command[2]
            return " ".join(command)
        return command if isinstance(command, str) else None
    head = arguments[:len(name) + 1]
    return arguments if name and head.rstrip() == name else None


def _token(token: str) -> str:
    return token.strip("\"'`()")


def _looks_like_a_file(token: str) -> bool:
    if "/" in token:
        return True
    stem, dot, suffix = token.rpartition(".")
    return bool(stem and dot and suffix[:1].isalpha())


def shell_target(command: str) -> str:
    """What a command line runs: its program and its script or target (the first argument that names a file,
    else the first that is no option), after any `cd DIR &&`, variable assignments and wrappers (`timeout 60`,
    `sudo`)."""
    line = command.lstrip()[:_COMMAND_HEAD].split("\n", 1)[0]
    tokens = line.split()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "cd":  # `cd DIR && ...` or `cd DIR; ...`
            j = i + 1
            while j < len(tokens) and tokens[j] not in _SEPARATORS and not tokens[j].endswith(";"):
                j += 1
            if j >= len(tokens) - 1:
                break  # only a `cd`: that is what it runs
            i = j + 1
        elif token in _WRAPPERS or ("=" in token and token.split("=", 1)[0].isidentifier()):
            i += 1
        elif token == "timeout":
            i += 1
            while i < len(tokens) and (tokens[i].startswith("-") or tokens[i][:1].isdigit()):
                i += 1
        else:
            break
    if i >= len(tokens):
        return line.strip()
    program = os.path.basename(_token(tokens[i])) or tokens[i]
    fallback = ""
    for token in tokens[i + 1:]:
        if token in _SEPARATORS or token.startswith((">", "<", "2>", "|")):
            if token in _SEPARATORS:
                break
            continue
        word = _token(token)
        if not word or word.startswith("-"):
            continue
        if _looks_like_a_file(word):
            return f"{program} {word}"
        fallback = fallback or word
    return f"{program} {fallback}".rstrip()


# A call's target is kept as a digest; of a long one (an edit's whole file), its start, its end and its length.
_TARGET_WHOLE = 512


def call_target(name: str, arguments: str, attempt: str | None = None) -> bytes:
    """What identifies a call as the same call again, as a digest: what a shell command runs, whatever tool ran
    it and whatever its options and working directory; else the attempt it makes (`attempt_of`, when the caller
    has it already)."""
    command = shell_command(name, arguments)
    if command is not None:
        target = "\x02" + _shell_target(command[:_COMMAND_HEAD])
    else:
        target = attempt if attempt is not None else attempt_of(name, arguments)
    if len(target) > _TARGET_WHOLE:
        target = f"{target[:256]}\x00{target[-256:]}\x00{len(target)}"
    return digest(target)


_OLD_KEYS = ("old_str", "old_string", "oldString")


def edit_place(arguments: str) -> str | None:
    """The file and the text a replacing edit's arguments replace (`str_replace`'s `old_str`), or None: an edit
    written again with other new text at the same place is the same attempt, not a new call."""
    if not any(f'"{key}"' in arguments for key in _OLD_KEYS):
        return None
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    old = next((value[key] for key in _OLD_KEYS if isinstance(value.get(key), str)), None)
    path = next((value[key] for key in _FILE_KEYS if isinstance(value.get(key), str)), None)
    return None if old is None or path is None else f"{path}\x00{old}"


def attempt_of(name: str, arguments: str) -> str:
    """The attempt a call makes: its tool and canonical arguments; for an edit replacing text, the tool and the
    place it replaces (`edit_place`), whatever it would write there."""
    place = edit_place(arguments)
    return f"{name}\x00{arguments}" if place is None else f"{name}\x03{place}"


@functools.lru_cache(maxsize=4096)
def _shell_target(head: str) -> str:
    return shell_target(head)


# A shell tool's frame around its output (mini-swe-agent's tags, Codex CLI's header lines): no words of the error.
_FRAME = re.compile(r"</?\w+>|\b(?:process|exit(?:ed)?|with|code|status|returncode|output|chunk|id|wall|time"
                    r"|original|token|count)\b", re.IGNORECASE)


# A Python traceback's frame names the line it ran. The same call failing with the failure at another line ran
# other code (an edit moved it): no longer the same failure. Different calls (a script rewritten, its lines moved
# with it) meeting one exception at other lines meet the same error.
_FRAME_LINE = re.compile(r'(File "[^"\n]{0,500}", line )\d+')


@functools.lru_cache(maxsize=1024)
def lines_aside(error: str) -> str:
    """An error's text with the line numbers its traceback's frames name masked."""
    return _FRAME_LINE.sub(r"\1#", error) if 'File "' in error else error


class Call:
    """One tool call, compared by meaning: name plus canonical arguments, and its masked result.

    Masking a result is most of what a call costs, and most results are never compared: only a call whose
    name and arguments came before is. So the raw result is kept until the first comparison, or until the
    tracker settles its last calls at the end of a fold, and then dropped for its digest and excerpt."""

    __slots__ = ("key", "name", "arguments", "error", "negative", "rejected", "said", "nudged", "_raw", "_result",
                 "_excerpt", "_attempt")

    def __init__(self, name: str, arguments: str, raw_result: str | None = None, error: str | None = None,
                 negative: bool = False, rejected: bool = False, said: bool = False, nudged: bool = False) -> None:
        self.key = f"{name}\x00{arguments}"
        self.name = name
        self.arguments = arguments  # canonical arguments
        self.error = error  # the masked error text when the result is an error
        self.negative = negative  # the error is a short answer that only says nothing was found
        self.rejected = rejected  # the harness refused the step before running it (its format error)
        self.said = said  # the step is the model's text with no action in it, which the harness answered
        # that text was answered by the harness's own words again, words with no error in them (OpenHands' `Please
        # continue working on the task`): a nudge, weaker evidence than an error
        self.nudged = nudged
        self._raw = raw_result
        self._result: bytes | None = None
        self._excerpt = ""
        self._attempt: str | None = None

    def _settle(self) -> None:
        if self._raw is not None:
            masked = mask(self._raw)
            self._result, self._excerpt, self._raw = digest(masked), masked[:160], None

    @property
    def says_something(self) -> bool:
        """An error that names a cause in words of its own: more than an exit code and empty output (`grep`
        finding nothing) or a one-word nudge (`continue`). A usage message names what the call got wrong, and a
        short negative answer (`No more results.`) what it found."""
        return self.error is not None and (self.error[:6].lower() == "usage:"
                                           or sum(c.isalpha() for c in _FRAME.sub("", self.error)) >= 16
                                           or self.negative)

    @property
    def attempt(self) -> str:
        """The attempt the call makes (`attempt_of`): its arguments read once, however many rules ask."""
        if self._attempt is None:
            self._attempt = attempt_of(self.name, self.arguments)
        return self._attempt

    @property
    def succeeded(self) -> bool:
        """The call ran and its result is known and no error."""
        return self.error is None and (self._raw is not None or self._result is not None)

    @property
    def result(self) -> bytes | None:
        """The digest of the masked result; None while the result is unknown."""
        self._settle()
        return self._result

    @property
    def result_excerpt(self) -> str:
        """The start of the masked result, for the evidence."""
        self._settle()
        return self._excerpt


@dataclass(frozen=True, slots=True)
class ToolFinding:
    type: str  # tool_call, tool_cycle or tool_error
    calls: tuple[Call, ...]  # the call, the cycle's calls in order, or the calls one error answered
    repeats: int
    same_result: bool = True  # False for identical calls counted whatever their results
    idle: bool = False  # calls that each did nothing, whatever their form


def _same(a: Call, b: Call) -> bool:
    # A result not yet known counts as unchanged.
    return a.key == b.key and (a.result is None or b.result is None or a.result == b.result)


_NUMBERS = re.compile(r"\d+")


def numbers_aside(key: str) -> str:
    """A call's name and arguments, numbers and white space aside: calls that differ in nothing else are the same
    call made again (a coder's `# attempt 3`, then `# attempt 4`, over the same code)."""
    return _NUMBERS.sub("\x00", "".join(key.split()))


def one_attempt(calls: "tuple[Call, ...] | list[Call]") -> bool:
    """Whether different calls one error answered are one attempt made again: alike but for their numbers (unless
    the error says every further attempt fails alike: then each is a new call, the next file to download, meeting
    the same wall), or each running one program that does not exist (it never ran, whatever it was given)."""
    missing = {missing_program(c) for c in calls}
    if None not in missing and len(missing) == 1:
        return True
    return len({numbers_aside(c.key) for c in calls}) == 1 and not is_standing(calls[-1].error or "")


def never_ran(call: Call) -> bool:
    """A step that never ran: the harness refused it (its format error), it held no action (the model's text the
    harness answered), or the tool or program it called does not exist."""
    return call.rejected or call.said or missing_program(call) is not None or missing_tool(call)


def _enough(calls: "list[Call]", count: int, error_repeats: int, retried: bool) -> bool:
    """Whether `count` calls one answer met (the last of them `calls`) are a loop, `error_repeats` the count for calls
    as good as one call failing alike (one of them a blind retry, all one attempt, all never run). Different calls
    meeting one error need one more than the same call would (at least ERROR_REPEATS + WEAKER_EXTRA: a ladder whose
    threshold is higher already asks more); an answer weaker than an error (a search finding nothing, a nudge to go
    on), one more than the threshold whatever the calls."""
    last = calls[-1]
    if last.negative or last.nudged:
        return count >= error_repeats + WEAKER_EXTRA
    if count >= max(error_repeats, ERROR_REPEATS + WEAKER_EXTRA):
        return True
    if count < error_repeats:
        return False
    recent = calls[-error_repeats:]
    return retried or one_attempt(recent) or all(never_ran(c) for c in recent)


def cycle_rounds(period: int, threshold: int) -> int:
    """How many rounds of a cycle of `period` calls make a loop."""
    return threshold if period < LONG_CYCLE else max(2, threshold - 1)


@functools.cache
def _matches_needed(threshold: int) -> tuple[int, ...]:
    """Per period k (index k), the calls in a row equal to the call k before that make a loop: all of the
    rounds but the first."""
    return (0,) + tuple(k * (cycle_rounds(k, threshold) - 1) for k in range(1, MAX_CYCLE + 1))


class _ToolError:
    """The calls of one tool one error answered in a task: how many, their different arguments, the last few, how
    many calls of the task had succeeded when it last counted one, and the words of the last searches it
    answered that found nothing."""

    __slots__ = ("count", "arguments", "calls", "successes", "searched", "retried")

    def __init__(self) -> None:
        self.count = 0
        self.arguments: set[str] = set()
        self.calls: list[Call] = []
        self.successes = 0
        self.searched: list[frozenset[str]] = []
        self.retried = False  # one of the calls was made again at once, unchanged, and failed alike

    def copy(self) -> "_ToolError":
        other = _ToolError()
        other.count, other.arguments, other.calls = self.count, set(self.arguments), self.calls[:]
        other.successes, other.searched, other.retried = self.successes, self.searched[:], self.retried
        return other


# A search finding nothing is told apart from the searches before it by its words (numbers aside): one that shares
# at least half of its words with one of them (`famous bhavageete by Arun Date`, then `... in India`), or differs
# from it only in numbers (`click` on element 1260, then 1261), is the same search said again; one that does not
# (`**/bunfig.toml`, then `**/tsconfig*.json`) is a new search.
_WORD = re.compile(r"[a-z0-9]+")
_SEARCH_WORDS = 300  # the characters of a call's arguments read for its words
SAME_SEARCH = 0.5
SEARCHES_KEPT = 8


def search_words(arguments: str) -> frozenset[str]:
    """The words a call's argument values hold (keys and numbers aside), in lower case."""
    text = " ".join(argument_values(arguments))[:_SEARCH_WORDS].lower()
    return frozenset(word for word in _WORD.findall(text) if not word.isdigit())


def _reworded(words: frozenset[str], before: "list[frozenset[str]]") -> bool:
    """Whether a search says again, in other words or other numbers, one of the searches before it."""
    return any(len(words & other) >= SAME_SEARCH * len(words | other) for other in before)


# An error that says the condition behind it stands, whatever is asked next: a quota or a budget used up, a limit
# reached, a permission or a key revoked or expired, an account suspended, or in so many words that every further
# attempt fails alike. New calls it answers are no exploration: each meets the same wall.
_STANDING = re.compile(
    r"quota\W+(?:\w+\W+){0,3}?(?:exceeded|exhausted|reached|used\x20up)|(?:exceeded|exhausted|reached)\W+(?:\w+\W+){0,2}?quota"
    r"|\bno\x20(?:\w+\x20)?(?:downloads|requests|credits|calls|uploads|runs|tokens|quota)\x20(?:left|remaining)"
    r"|rate[\x20_-]limit\w*\x20(?:\w+\x20){0,2}?(?:exceeded|exhausted|reached)"
    r"|insufficient\x20(?:credits?|balance|funds|quota)|out\x20of\x20(?:credits|quota)"
    r"|(?:permission|access|token|api\x20key|key|credentials?|authorization|license)\x20(?:has\x20been\x20|was\x20|is\x20)?"
    r"(?:revoked|expired|suspended|disabled)"
    r"|account\x20(?:has\x20been\x20|is\x20)?(?:suspended|disabled|deactivated|locked)"
    r"|(?:every|all|any)\x20(?:further|subsequent|other|new)\x20(?:\w+\x20)?(?:requests?|attempts?|calls?|downloads?)"
    r"\x20(?:\w+\x20){0,3}?(?:fail|be\x20(?:refused|rejected|denied|blocked))",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=1024)
def is_standing(error: str) -> bool:
    """Whether an error says that every further attempt will fail alike (SPEC: a condition no retry can change)."""
    return _STANDING.search(error[:WHOLE_ERROR]) is not None


# -- calls that do nothing, and programs that do not exist ------------------------------------------------------
# A shell call that does nothing: an empty command, `true` or `:`, an `echo` of nothing or of one short word
# (`echo 'plan'`, `echo '??'`), a placeholder left for a command. Made again and again, in whatever form, it is the
# agent idling: IDLE_CALLS of them in a row are a loop (weak evidence: the calls differ).
IDLE_CALLS = 5
_IDLE_WORD = 12  # an echoed word longer than this says something
_PLACEHOLDER = re.compile(r"<[^<>\n]{0,40}>|\.\.\.|…|(?:todo|tbd|placeholder|noop|no-op|nothing|command)\b",
                          re.IGNORECASE)


def does_nothing(name: str, arguments: str) -> bool:
    """Whether a shell call's command does nothing (its `cd DIR &&` aside)."""
    command = shell_command(name, arguments)
    if command is None:
        return False
    line = command.strip()
    if "\n" in line or len(line) > 200:
        return False
    while line.startswith("cd ") and "&&" in line:
        line = line.split("&&", 1)[1].strip()
    if line in ("", "true", ":", "echo", "/bin/true"):
        return True
    if any(mark in line for mark in ("|", ">", "<<", ";", "&&", "$(", "`")):
        return _PLACEHOLDER.fullmatch(line) is not None
    words = line.split()
    if words[0] == "echo" and len(words) <= 2:
        return len(words) == 1 or len(words[1].strip("'\"")) <= _IDLE_WORD
    return _PLACEHOLDER.fullmatch(line) is not None


# The shell saying the program itself does not exist (`bash: line 1: update_plan: command not found`, `update_plan:
# No such file or directory`): the call never ran, whatever its arguments.
_MISSING = re.compile(r"(?:^|[\x20:])([\w.+-]+):\x20(?:command\x20not\x20found|No\x20such\x20file\x20or\x20directory)")


def names_missing_program(error: str, name: str, arguments: str) -> str | None:
    """The program a shell call ran, when its (masked) error says that program does not exist."""
    if "not found" not in error and "No such file" not in error:
        return None
    command = shell_command(name, arguments)
    if not command:
        return None
    program = shell_target(command).split(" ", 1)[0]
    for found in _MISSING.finditer(error[:WHOLE_ERROR]):
        if found.group(1) == program:
            return program
    return None


# A tool's answer that the tool called does not exist (`Error: tool 'search_code' does not exist`, `Unknown tool:
# search_code`): the call never ran, whatever its arguments.
_MISSING_TOOL = re.compile(
    r"\b(?:tool|function)\b[^\n]{0,120}?(?:does\x20not\x20exist|doesn't\x20exist|\bnot\x20found"
    r"|\bis\x20not\x20(?:a\x20valid|available|recognized|registered))"
    r"|\b(?:unknown|invalid|unavailable|no\x20such)\x20(?:tool|function)\b", re.IGNORECASE)


def missing_tool(call: "Call") -> bool:
    """Whether a failed call's error says the tool it called does not exist (naming it)."""
    error = call.error
    if error is None or call.name not in error[:WHOLE_ERROR]:
        return False
    return _MISSING_TOOL.search(error[:WHOLE_ERROR]) is not None


def missing_program(call: "Call") -> str | None:
    """The program a failed shell call ran, when its error says that program does not exist."""
    return None if call.error is None else names_missing_program(call.error, call.name, call.arguments)


# A harness's format error answering steps with this many successful calls between recurs apart: the agent
# recovered each time (Gemini 3 sends two blocks every few replies and goes on with the next). Back to back, with
# nothing run between, it counts.
FAR_APART = 1
# The calls a task ran, kept to tell a new call from one run before; past this many, every call counts as run
# before (the stricter reading).
RAN_KEPT = 4096


class ToolTracker:
    """Streaks for every period 1..MAX_CYCLE, error counts and the run of one error answering consecutive
    calls, for one task. Constant memory but the error table."""

    __slots__ = ("_recent", "_runs", "_blind_runs", "_answers", "_errors", "_tool_errors", "_error_run",
                 "_error_calls", "_error_retried", "_ran", "_successes", "_idle", "_idle_run")

    def __init__(self) -> None:
        self._recent: list[Call | None] = []  # last MAX_CYCLE calls; None is a call never counted
        self._runs = [0] * (MAX_CYCLE + 1)  # _runs[k]: consecutive calls equal to the call k before
        # _blind_runs[k]: consecutive calls with the name and arguments of the call k before, results aside
        self._blind_runs = [0] * (MAX_CYCLE + 1)
        # The results the identical calls in a row got so far: a result that comes back to one of them is no news
        # (a search whose ranking jitters, a status that flips back), so it does not start the streak again.
        self._answers: set[bytes] = set()
        # (call, error) -> how many times that call failed so, and the task's successes when it last did
        self._errors: dict[tuple[str, str], tuple[int, int]] = {}
        self._tool_errors: dict[tuple[str, str | None], _ToolError] = {}  # (tool, error) -> the calls it answered
        self._error_run = 0  # consecutive calls answered by one and the same error
        self._error_calls: list[Call] = []  # the last of them, for the evidence
        self._error_retried = False  # one of them was the call before it again, unchanged
        self._ran: set[bytes] = set()  # what the task's calls ran (`call_target`)
        self._successes = 0  # the task's calls that succeeded
        self._idle: list[Call] = []  # the last calls in a row that did nothing (`does_nothing`)
        self._idle_run = 0  # how many calls in a row did nothing

    def clone(self) -> "ToolTracker":
        other = ToolTracker.__new__(ToolTracker)
        other._recent = self._recent[:]
        other._runs = self._runs[:]
        other._blind_runs = self._blind_runs[:]
        other._answers = set(self._answers)
        other._errors = dict(self._errors)
        other._tool_errors = {key: seen.copy() for key, seen in self._tool_errors.items()}
        other._error_run = self._error_run
        other._error_calls = self._error_calls[:]
        other._error_retried = self._error_retried
        other._ran = set(self._ran)
        other._successes = self._successes
        other._idle, other._idle_run = self._idle[:], self._idle_run
        return other

    def skip(self) -> None:
        """A whitelisted call: never counted, and it breaks every streak and cycle around it."""
        self._recent = (self._recent + [None])[-MAX_CYCLE:]
        self._runs = [0] * (MAX_CYCLE + 1)
        self._blind_runs = [0] * (MAX_CYCLE + 1)
        self._answers = set()
        self._error_run = 0
        self._error_calls = []
        self._error_retried = False
        self._idle, self._idle_run = [], 0

    def add(self, call: Call, threshold: int, error_repeats: int = ERROR_REPEATS,
            edit: bool = False) -> list[ToolFinding]:
        """Count a call (`edit`: the tool edits); every rule it trips, in the order of SPEC's table."""
        recent = self._recent
        runs = self._runs
        blind = self._blind_runs
        streak = runs[1]
        for k in range(1, MAX_CYCLE + 1):
            before = recent[-k] if len(recent) >= k else None
            same_key = before is not None and before.key == call.key
            blind[k] = blind[k] + 1 if same_key else 0
            runs[k] = runs[k] + 1 if same_key and _same(call, before) else 0
        previous = recent[-1] if recent else None
        self._repeated_answer(call, previous, streak)
        # A blind retry: the call just made, made again unchanged (`blind[1]`), and failing alike.
        retried = bool(blind[1]) and call.error is not None and previous.error == call.error
        self._recent = (recent + [call])[-MAX_CYCLE:]
        new = self._new_call(call)

        found: list[ToolFinding] = []
        needed = _matches_needed(threshold)
        for k in range(1, MAX_CYCLE + 1):
            if runs[k] >= needed[k]:
                cycle = tuple(c for c in self._recent[-k:] if c is not None)
                found.append(ToolFinding("tool_call" if k == 1 else "tool_cycle", cycle, runs[k] // k + 1))
                break
        if not found:
            # Whatever the results: the same edit `threshold` times in a row, the same call past 3 × threshold
            # times, the same calls in the same order past 3 × threshold rounds (two edits applied in turn).
            identical = blind[1] + 1
            if identical >= BLIND_REPEATS * threshold or (edit and identical >= threshold):
                found.append(ToolFinding("tool_call", (call,), identical, same_result=False))
            else:
                for k in range(2, MAX_CYCLE + 1):
                    if blind[k] >= k * (BLIND_REPEATS * threshold - 1):
                        cycle = tuple(c for c in self._recent[-k:] if c is not None)
                        found.append(ToolFinding("tool_cycle", cycle, blind[k] // k + 1, same_result=False))
                        break
        if not found:
            found.extend(self._idling(call, threshold))
        if call.error is not None:
            # An edit refused for the text it replaces is the same call whatever it would have written there.
            attempt = call.attempt
            count, successes = self._errors.get((attempt, call.error), (0, 0))
            if call.rejected and self._successes - successes >= FAR_APART:
                count = 0  # the harness refused it before, and the agent recovered and worked on: a slip, again
            count += 1
            self._errors[(attempt, call.error)] = (count, self._successes)
            if count >= error_repeats:
                found.append(ToolFinding("tool_error", (call,), count))
            else:
                found.extend(self._tool_error(call, max(error_repeats, threshold), new, retried))
        found.extend(self._same_error(call, error_repeats, new, retried))
        for finding in found:  # the evidence outlives the fold
            for counted in finding.calls:
                counted._settle()
        return found

    def _idling(self, call: Call, threshold: int) -> list[ToolFinding]:
        """Calls in a row that each did nothing, whatever their form: IDLE_CALLS of them (the threshold, when
        higher) are a loop; each one more, a loop again."""
        if not does_nothing(call.name, call.arguments):
            self._idle_run, self._idle = 0, []
            return []
        self._idle_run += 1
        self._idle = (self._idle + [call])[-IDLE_CALLS:]
        if self._idle_run < max(IDLE_CALLS, threshold):
            return []
        return [ToolFinding("tool_call", tuple(self._idle), self._idle_run, same_result=False, idle=True)]

    def _repeated_answer(self, call: Call, before: Call | None, streak: int) -> None:
        """Identical calls in a row (`before` the call just before, `streak` its run of calls without news): a call
        whose result came back to one an earlier call of the run got continues the streak."""
        if not self._blind_runs[1]:
            self._answers = set()
            return
        if not self._answers and before is not None and before.result is not None:
            self._answers.add(before.result)
        result = call.result
        if result is None:
            return
        if not self._runs[1] and result in self._answers:
            self._runs[1] = streak + 1
        self._answers.add(result)

    def _new_call(self, call: Call) -> bool:
        """Whether the call runs what no call of the task ran before; counts it, and its success. A step with no
        action in it (the model's text, answered) is no call at all: never a new one."""
        if call.said:
            self._successes += call.succeeded
            return False
        if call.error is None:
            self._successes += call.succeeded
            if len(self._ran) < RAN_KEPT:
                self._ran.add(call_target(call.name, call.arguments, call.attempt))
            return False  # asked of failed calls only
        target = call_target(call.name, call.arguments, call.attempt)
        if target in self._ran:
            return False
        if len(self._ran) < RAN_KEPT:
            self._ran.add(target)
            return True
        return False

    def _tool_error(self, call: Call, error_repeats: int, new: bool = False,
                    retried: bool = False) -> list[ToolFinding]:
        """The same error answering `error_repeats` calls of one tool in the task (the ladder's threshold at
        least), not all of them the same call (that is the rule above's), other calls between them or not: a
        shell's commands that differ failing alike, a lookup echoing each new argument in the same failure. An
        error that says nothing but its exit code is no evidence of one cause, and one read by its start and end
        only (a long answer) is not known to be the same."""
        if not call.says_something:
            return []
        if len(call.error or "") > WHOLE_ERROR:  # told by its start and end only: a page with an error line on it
            return []
        seen = self._tool_errors.setdefault((call.name, lines_aside(call.error or "")), _ToolError())
        if call.negative:
            words = search_words(call.arguments)
            reworded = _reworded(words, seen.searched)
            seen.searched = (seen.searched + [words])[-SEARCHES_KEPT:]
            if seen.count and new and not reworded:
                return []  # a new search finding nothing, not one said again in other words: the search at work
        since = self._successes - seen.successes  # the calls that succeeded since this error last counted
        if seen.count and ((new and since and not is_standing(call.error or "") and missing_program(call) is None)
                           or (call.rejected and since >= FAR_APART)):
            # Exploration: a call the task never made (a new script the timeout kills, a new command a sandbox
            # refuses) after work that succeeded, unless the error says no attempt can get past it; a step the
            # harness refused (its format error) far apart.
            return []
        seen.retried = seen.retried or retried
        seen.successes = self._successes
        seen.count += 1
        seen.arguments.add(call.arguments)
        seen.calls = (seen.calls + [call])[-(error_repeats + WEAKER_EXTRA):]
        if len(seen.arguments) < 2 or not _enough(seen.calls, seen.count, error_repeats, seen.retried):
            return []
        return [ToolFinding("tool_error", tuple(seen.calls), seen.count)]

    def _same_error(self, call: Call, error_repeats: int, new: bool = False,
                    retried: bool = False) -> list[ToolFinding]:
        """The same error answering `error_repeats` consecutive calls, whatever the calls (a harness repeating
        its format error, a tool that does not exist, near-identical edits rejected alike). Identical calls
        alone are the rule above's; an error that says nothing but its exit code is no evidence of one cause,
        and new searches each finding nothing are a search at work."""
        calls = self._error_calls
        if not call.says_something:
            if calls:
                self._error_run, self._error_calls, self._error_retried = 0, [], False
            return []
        if calls and (lines_aside(calls[-1].error or "") != lines_aside(call.error or "") or (
                new and call.negative and not _reworded(search_words(call.arguments),
                                                        [search_words(c.arguments) for c in calls]))):
            # Another error; or a new search finding nothing, not one said again in other words: a run anew.
            self._error_run, calls, self._error_retried = 0, [], False
        self._error_run += 1
        self._error_retried = self._error_retried or (retried and bool(calls))
        self._error_calls = calls = (calls + [call])[-(error_repeats + WEAKER_EXTRA):]
        if all(c.key == call.key for c in calls) \
                or not _enough(calls, self._error_run, error_repeats, self._error_retried):
            return []
        return [ToolFinding("tool_error", tuple(calls), self._error_run)]

    def settle(self) -> None:
        """Mask the results of the calls later calls will be compared with, so no raw result outlives a fold."""
        for call in self._recent:
            if call is not None:
                call._settle()

    @property
    def state_size(self) -> int:
        return len(self._errors) + len(self._tool_errors) + len(self._recent) + len(self._ran)
