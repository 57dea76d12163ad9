"""Agents that act in text: their actions read from the assistant's text, their observations recognised.

Many agents never send a native tool call. They write the action in their text (ReAct's `Action:`,
smolagents' `Calling tools:` and `<code>` blocks, SWE-agent's and mini-swe-agent's fenced command, the
`<function=bash>` blocks of SWE-agent's XML function calling (Qwen3-Coder's tool format),
Aider's SEARCH/REPLACE blocks, Cline's, Roo Code's and Kilo Code's XML tags) and their harness answers with
a user message (`Observation: ...`, `[read_file for 'a.py'] Result:`).
DSPy's ReAct sends the whole trajectory inside one user message. Each function here reads one
format, learned from the requests those agents send; the engine turns what they find into steps,
the same steps a native tool call and its result make. Pure code, no I/O.
"""

from __future__ import annotations

import ast
import itertools
import re
from typing import NamedTuple

import orjson

from proxy.detect.normalize import canonical_arguments


class TextAction(NamedTuple):
    name: str
    arguments: str  # canonical


# -- the assistant's action ------------------------------------------------------------------------------

_SMOLAGENTS_CALLS = "Calling tools:\n"
# ReAct: `Action: tool` and its `Action Input:`, at the start of a line; the ReAct paper's harnesses number the
# step (`Action 3: Lookup[Cher]`) and give the argument in brackets.
_REACT_ACTION = re.compile(r"^Action(?:\x20\d+)?:[ \t]*(\S[^\n]*)(?:\n(?:Action Input:[ \t]*(.*))?)?",
                           re.MULTILINE | re.DOTALL)
_BRACKETED = re.compile(r"(\w+)\[(.*)\]\s*\Z", re.DOTALL)
_CODE_TAG = re.compile(r"<code>\n?(.*?)</code>", re.DOTALL)
_FENCE = re.compile(r"^```([\w+-]*)[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_DSPY_FIELD = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n*\Z)", re.DOTALL)
_AIDER_BLOCK = re.compile(r"^(\S[^\n]*)\n(?:```[^\n]*\n)?<<<<<<< SEARCH\n(.*?)^=======\n(.*?)^>>>>>>> REPLACE",
                          re.MULTILINE | re.DOTALL)
# Cline, Roo Code and Kilo Code with XML tools: the tool is a tag opening a line, its parameters tags inside it.
# Their tools are named in snake case (`read_file`, `execute_command`), which no HTML element is.
# A browser agent's action: one call in an inline triple-backtick span ending the message (BrowserGym's
# ```click('a51')```, WebArena's ```click [1234]```). Read on the message's end only.
_CALL_SPAN = re.compile(r"```([a-z_][a-z0-9_.]{0,63})(?:\((.{0,500})\)|\x20?\[(.{0,500})\])```")
# SWE-agent's XML function calling, OpenHands' calls for models without native ones, Qwen3-Coder's tool format:
# `<function=bash>\n<parameter=command>ls</parameter>\n</function>` (the closing tag may be cut by a stop word).
_FUNCTION_TAG = re.compile(r"<function=([\w.-]{1,64})>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER_OPEN = re.compile(r"<parameter=([\w.-]{1,64})>\n?")
_XML_OPEN = re.compile(r"^<([a-z][a-z0-9]*_[a-z0-9_]{1,62})>", re.MULTILINE)
_XML_TRIED = 8  # the opening tags tried for their closing one (each search reads the rest of the text)
_NOT_TOOLS = frozenset({"thinking", "think", "environment_details", "task", "feedback", "answer", "result"})
_SHELL_LANGUAGES = frozenset({"", "bash", "sh", "shell", "console", "zsh", "mswea_bash_command"})
_PYTHON_LANGUAGES = frozenset({"py", "python", "python3"})


def _arguments(raw: object) -> str:
    """Arguments written as JSON or as a Python literal (LlamaIndex replays `{'path': 'a.txt'}`)."""
    if isinstance(raw, str):
        text = raw.strip()
        if text[:1] in "{[" and text[-1:] in "}]":
            try:
                return canonical_arguments(orjson.loads(text))
            except orjson.JSONDecodeError:
                pass
            try:
                return canonical_arguments(ast.literal_eval(text))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                pass
        return canonical_arguments(text)
    return canonical_arguments(raw)


def _smolagents(text: str) -> list[TextAction] | None:
    at = text.rfind(_SMOLAGENTS_CALLS)
    if at < 0:
        return None
    try:
        calls = ast.literal_eval(text[at + len(_SMOLAGENTS_CALLS):].strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    actions = []
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            actions.append(TextAction(function["name"], _arguments(function.get("arguments", ""))))
    return actions or None


# τ-bench's ReAct agent: `Thought:` and a line, then `Action:` and, on the next line, one JSON object naming the
# action and its arguments; the harness reads what follows the last `Action:`. Its reply to the person is the
# action `respond` (`{"name": "respond", "arguments": {"content": ...}}`); an action whose JSON it cannot read it
# sends to the person as it is, as if it were that reply.
RESPOND = "respond"
_JSON_ACTION = "Action:"


def _json_action_text(text: str) -> str | None:
    """What follows the last `Action:` opening a line, when it is (or starts like) a JSON object."""
    at = text.rfind("\n" + _JSON_ACTION)
    if at < 0:
        if not text.startswith(_JSON_ACTION):
            return None
        at = -1
    raw = text[at + 1 + len(_JSON_ACTION):].strip()
    if raw[:1] != "{" or "\nObservation:" in raw or "\nAction Input:" in raw:
        return None
    return raw


def _react_json(text: str) -> list[TextAction] | None:
    raw = _json_action_text(text) if _JSON_ACTION in text else None
    if raw is None:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("name"), str) and "arguments" in value:
        return [TextAction(value["name"], canonical_arguments(value["arguments"]))]
    return [TextAction(RESPOND, canonical_arguments({"content": raw}))]


def spoken_action(text: str) -> str | None:
    """What a τ-bench ReAct action says to the person: its `respond` content, or the action as written when its
    JSON cannot be read (the harness sends it as it is); None for any other action."""
    actions = _react_json(text)
    if not actions or actions[0].name != RESPOND:
        return None
    try:
        value = orjson.loads(actions[0].arguments)
    except orjson.JSONDecodeError:
        return actions[0].arguments
    content = value.get("content") if isinstance(value, dict) else None
    return content if isinstance(content, str) else actions[0].arguments


def _react(text: str) -> list[TextAction] | None:
    match = _REACT_ACTION.search(text) if "Action" in text else None
    if match is None:
        return None
    name, given = match.group(1).strip(), match.group(2)
    bracketed = _BRACKETED.match(name) if given is None else None
    if bracketed is not None:  # `Lookup[Cher]`: the tool and its argument
        return [TextAction(bracketed.group(1), _arguments(bracketed.group(2)))]
    arguments = (given or "").split("\nObservation:")[0]
    return [TextAction(name, _arguments(arguments))]


def inline_observation(text: str) -> str | None:
    """The observation a harness wrote into the assistant's own ReAct message, after its action (CrewAI's
    text tools: `Action: ...\nAction Input: ...\nObservation: <result>`, then the same nudge as the user's
    message every step), or None."""
    match = _REACT_ACTION.search(text) if "\nObservation:" in text else None
    if match is None:
        return None
    at = text.find("\nObservation:", match.start())
    return text[at + len("\nObservation:"):].strip() if at >= 0 else None


def _code(text: str) -> list[TextAction] | None:
    """smolagents' CodeAgent: a `<code>` block (a fenced Python block is read by `_fenced`)."""
    if "<code>" in text:
        match = _CODE_TAG.search(text)
        if match:
            return [TextAction("python_interpreter", match.group(1).strip())]
    return None


def _fenced(text: str) -> list[TextAction] | None:
    """SWE-agent, mini-swe-agent and other shell agents: one fenced command; its first word names it."""
    if "```" not in text:
        return None
    blocks = _FENCE.findall(text)
    if not blocks:
        return None
    language, body = blocks[-1]
    command = body.strip()
    if not command:
        return None
    if language.lower() in _PYTHON_LANGUAGES:
        return [TextAction("python_interpreter", command)]
    if language.lower() not in _SHELL_LANGUAGES:
        return None
    return [TextAction(command.split(None, 1)[0], command)]


def _call_span(text: str) -> list[TextAction] | None:
    """A browser agent's action: the message ends with one call in an inline triple-backtick span."""
    tail = text[-600:].rstrip()
    if not tail.endswith("```"):
        return None
    start = tail.rfind("```", 0, len(tail) - 3)  # the span's opening: the one pattern tried once, on it alone
    match = _CALL_SPAN.fullmatch(tail, start) if start >= 0 else None
    if match is None:
        return None
    name, parenthesized, bracketed = match.groups()
    return [TextAction(name, (parenthesized if parenthesized is not None else bracketed).strip())]


def _aider(text: str) -> list[TextAction] | None:
    if "<<<<<<< SEARCH" not in text:
        return None
    blocks = _AIDER_BLOCK.findall(text)
    if not blocks:
        return None
    return [TextAction("edit", canonical_arguments({"path": path.strip(), "search": search, "replace": replace}))
            for path, search, replace in blocks]


def _function_tag(text: str) -> list[TextAction] | None:
    """`<function=NAME>` blocks with `<parameter=KEY>VALUE</parameter>` inside: one action each."""
    if "<function=" not in text:
        return None
    return [TextAction(name, canonical_arguments(_parameters(body)))
            for name, body in _FUNCTION_TAG.findall(text)] or None


def _parameters(body: str) -> dict[str, str]:
    """A function block's parameters, read in one pass (each closing tag with the opening tag nearest before it)."""
    found = {}
    for chunk in body.split("</parameter>")[:-1]:
        at = chunk.rfind("<parameter=")
        opening = _PARAMETER_OPEN.match(chunk, at) if at >= 0 else None
        if opening is not None:
            value = chunk[opening.end():]
            found[opening.group(1)] = value[:-1] if value.endswith("\n") else value
    return found


def _xml_tool(text: str) -> list[TextAction] | None:
    """Cline's, Roo Code's and Kilo Code's XML tool use: `<read_file>\n<path>a.py</path>\n</read_file>`."""
    if "</" not in text:
        return None
    for match in itertools.islice(_XML_OPEN.finditer(text), _XML_TRIED):
        name = match.group(1)
        end = text.find(f"</{name}>", match.end()) if name not in _NOT_TOOLS else -1
        if end >= 0:
            return [TextAction(name, _arguments(text[match.end():end].strip()))]
    return None


def _dspy_answer(text: str) -> list[TextAction] | None:
    """DSPy ReAct's answer: `next_tool_name` and `next_tool_args` fields."""
    if "[[ ## next_tool_name ## ]]" not in text:
        return None
    fields = dict(_DSPY_FIELD.findall(text))
    name = fields.get("next_tool_name", "").strip()
    return [TextAction(name, _arguments(fields.get("next_tool_args", "")))] if name else None


_READERS = (_smolagents, _dspy_answer, _react_json, _react, _aider, _code, _function_tag, _xml_tool, _call_span,
            _fenced)


def read_actions(text: str) -> list[TextAction] | None:
    """The actions an assistant message writes in its text, if it acts in text at all."""
    if not text:
        return None
    for reader in _READERS:
        actions = reader(text)
        if actions:
            return actions
    return None


# -- the harness's answer --------------------------------------------------------------------------------

# AutoGen's and AG2's code executor answers `exitcode: 1 (execution failed)\nCode output: ...`.
# τ-bench's ReAct harness answers a tool's action with `API output: ...`; SWE-agent answers a command that printed
# nothing with its own sentence; OpenHands, for a model without native tool calls, its `<function=...>` block with
# `EXECUTION RESULT of [terminal]:` (`[execute_bash]` in its versions before the SDK).
_OBSERVATION_STARTS = ("Observation:", "OBSERVATION:", "Error:\n", "<returncode>", "<exception>", "Call id:",
                       "exitcode: ", "API output: ", "Your command ran successfully and did not produce any output",
                       "EXECUTION RESULT of [")
_OBSERVATION_FRAME = re.compile(r"(?:Observation|OBSERVATION)(?:\x20\d+)?:")  # `Observation 3:` numbers the step
# Cline's, Roo Code's and Kilo Code's answer to a tool written in XML, and their error when no tool was written.
_XML_RESULT = re.compile(r"\[[a-z][a-z0-9_]{0,63}(?:\x20for\x20[^\n]{0,300}?)?\]\x20Result:")
_XML_HARNESS_ERROR = "[ERROR] You did not use a tool in your previous response!"

# Aider's linter report, reflected to the model as a user message after an edit (its `lint_edited`).
_AIDER_LINT = "# Fix any errors below, if possible."

_SWE_AGENT_TAIL = re.compile(r"\(Current directory: [^\n]*\)\s*(?:bash-\$)?\s*\Z")
# OpenHands' error for an action it could not run, sent as a user message (a tool call it could not parse).
_OPENHANDS_ERROR_TAIL = "[Error occurred in processing last action]"


def is_observation(text: str) -> bool:
    """A user message the harness wrote to answer an action written in text, not a person's."""
    head = text.lstrip()[:64]
    if head.startswith(_OBSERVATION_STARTS) or _OBSERVATION_FRAME.match(head):
        return True
    if head.startswith("[") and (head.startswith(_XML_HARNESS_ERROR[:40]) or _XML_RESULT.match(text.lstrip()[:400])):
        return True
    if "SEARCH/REPLACE block" in head and "failed to match" in text[:200]:
        return True  # Aider: `# 1 SEARCH/REPLACE block failed to match!`
    if head.startswith(_AIDER_LINT):
        return True  # Aider's linter after an edit: `# Fix any errors below, if possible.`
    tail = text[-300:]
    if tail.rstrip().endswith(_OPENHANDS_ERROR_TAIL):
        return True
    return "(Current directory: " in tail and _SWE_AGENT_TAIL.search(tail) is not None


def observation_failed(text: str) -> bool:
    """An observation whose harness frame says the action failed (beyond what its text's form says)."""
    head = text.lstrip()[:200]
    return head.startswith(("<exception>", _XML_HARNESS_ERROR, _AIDER_LINT)) or (
        "SEARCH/REPLACE block" in head and "failed to match" in head) \
        or text[-100:].rstrip().endswith(_OPENHANDS_ERROR_TAIL)


# What a harness prints when an edit went through or when it takes up the next request (aider's `Applied edit to
# src/app.py`, its watch mode's `Processing your request...`): information, never a rejection of the step, however
# often the same note comes back.
_APPLIED = "Applied edit to "
_PROCESSING = "Processing your request..."
_NOTE_READ = 4000  # a note's lines are looked for this far from its start and its end


def is_progress_note(text: str) -> bool:
    """A harness's text that reports an edit applied or the next request taken up, not a failure."""
    return text.rstrip().endswith(_PROCESSING) or text.startswith(_APPLIED) \
        or f"\n{_APPLIED}" in text[:_NOTE_READ] or f"\n{_APPLIED}" in text[-_NOTE_READ:]


def observation_text(text: str) -> str:
    """An observation without the harness's frame, which says nothing about the result."""
    head = text.lstrip()
    frame = _OBSERVATION_FRAME.match(head)
    return head[frame.end():] if frame is not None else text


# -- what agents write themselves ------------------------------------------------------------------------
# Messages an agent records in the conversation on its own, in a person's place or the model's: never a
# person's new task, never the model's output. After every reply that holds an edit (failed or not) Aider
# writes a note and records the model's `Ok.`: outside a git repository `I updated the files.`; in one (its
# default) `I committed the changes with git hash ...` when an edit was applied and committed, else `I didn't
# see any properly formatted edits in your reply?!` (every edit failed to match, or auto-commits are off). It
# puts its file-context message (or, with no file in the chat, the note that says so), its repository map and
# its read-only files, each with a recorded reply, just before the newest user message. For models whose
# examples it does not put in the system message, it opens with its example conversation as user and assistant
# messages, closed by `I switched to a new code base. ...` and `Ok.`; for those models it also appends the
# closing part of its system message (`# *SEARCH/REPLACE block* Rules: ...`) to the newest user message, and
# only in the request that is newest. Qwen Code opens with its environment.

_EXAMPLES_END = "I switched to a new code base."
_EXAMPLES_READ = 12  # the user messages an example conversation may take
_REMINDER_LENGTH = 64  # the least of a system message's closing part taken for a reminder

_OWN_PREAMBLES = (
    "I have *added these files to the chat*",  # Aider's file-context message
    "I am not sharing any files that you can edit yet.",  # Aider's, with no file in the chat
    "Don't try and edit any existing code without asking me to add the files to the chat!",  # the same, with a map
    "Here are summaries of some files present in my git repository.",  # Aider's repository map
    "Here are some READ ONLY files, provided for your reference.",  # Aider's read-only files
    "This is the Qwen Code. We are setting up the context for our chat.",  # Qwen Code's environment
    "I committed the changes with git hash ",  # Aider's note after an edit it committed
    "I ran this command:\n",  # Aider's record of a test or lint run it made (`--auto-test`, `/test`, `/run`)
    _EXAMPLES_END,  # Aider's, closing its example conversation
)
_OWN_NOTES = frozenset({  # Aider's after an edit
    "I updated the files.", "I didn't see any properly formatted edits in your reply?!"})
_OWN_REPLIES = frozenset({
    "Ok.", "Ok, any changes I propose will be to those files.",
    "Ok, I won't try and edit those files without asking first.", "Ok, I will use these files as references.",
    "Ok, based on your requests I will suggest which files need to be edited and then stop and wait for your "
    "approval.", "Got it. Thanks for the context!"})


def is_agent_preamble(text: str) -> bool:
    """A user message the agent wrote itself, not a person: Aider's file-context message and the notes it
    writes after an edit, Qwen Code's environment."""
    head = text.lstrip()
    return head.startswith(_OWN_PREAMBLES) or head.rstrip() in _OWN_NOTES


def is_agent_reply(text: str) -> bool:
    """An assistant message the agent recorded itself in answer to its own preamble (`Ok.`)."""
    return text.strip() in _OWN_REPLIES


def person_text(texts, system: str = "") -> tuple[str, int]:
    """The first of a conversation's user texts that a person wrote (the agent's own preambles skipped, and an
    example conversation the agent opens with; the reminder it appends to the newest message cut), as names a
    task: DSPy's fields before its trajectory. `texts` are (place, text) pairs; with the text comes the place
    it had (-1 when no text is a person's)."""
    texts = iter(texts)
    opening = []
    for place, text in texts:
        if text.lstrip().startswith(_EXAMPLES_END):
            opening = []  # what came before were the agent's examples
            break
        opening.append((place, text))
        if len(opening) == _EXAMPLES_READ:
            break
    for place, text in itertools.chain(opening, texts):
        if not is_agent_preamble(text):
            return task_text(without_reminder(text, system)), place
    return "", -1


def without_reminder(text: str, system: str) -> str:
    """A user message without the reminder an agent appended to it: a copy of its system message's closing
    part after a blank line (Aider's `# *SEARCH/REPLACE block* Rules: ...`, for models that take it in the
    newest user message). The message then reads the same in the request that carried the reminder and in the
    later ones, which do not."""
    if not system or len(text) <= _REMINDER_LENGTH or not system.endswith(text[-_REMINDER_LENGTH:]):
        return text
    low, high = _REMINDER_LENGTH, min(len(text), len(system))  # the longest common ending, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        if system.endswith(text[-middle:]):
            low = middle
        else:
            high = middle - 1
    common = len(text) - low  # where the common ending begins: the blank line before the reminder is there
    at = text.find("\n\n", max(0, common - 2), common + 2)
    if at < 0:
        return text
    end = at + 2
    while end < len(text) and text[end] == "\n":
        end += 1  # the blank line is the run's last two newlines: the message's own end before them stays
    return text[:end - 2] if len(text) - end >= _REMINDER_LENGTH else text


# -- DSPy's ReAct: the trajectory inside one user message ------------------------------------------------

_TRAJECTORY = "[[ ## trajectory ## ]]"
_DSPY_INSTRUCTION = "\n\nRespond with "  # the adapter's closing instruction, after the last field
_STEP_FIELD = re.compile(r"(thought|tool_name|tool_args|observation)_(\d+)")


class TrajectoryStep(NamedTuple):
    action: TextAction
    observation: str | None


def task_text(text: str) -> str:
    """What names a task: a DSPy request's fields before its trajectory, which grows every step."""
    at = text.find(_TRAJECTORY)
    return text if at < 0 else text[:at]


def trajectory(text: str) -> list[TrajectoryStep] | None:
    """The steps of a DSPy ReAct trajectory carried in a user message, in order."""
    at = text.find(_TRAJECTORY)
    if at < 0:
        return None
    body = text[at + len(_TRAJECTORY):]
    end = body.rfind(_DSPY_INSTRUCTION)
    if end >= 0:
        body = body[:end]
    steps: dict[int, dict[str, str]] = {}
    for field, value in _DSPY_FIELD.findall(body):
        match = _STEP_FIELD.fullmatch(field)
        if match:
            steps.setdefault(int(match.group(2)), {})[match.group(1)] = value
    result = []
    for number in sorted(steps):
        fields = steps[number]
        name = fields.get("tool_name", "").strip()
        if name:
            result.append(TrajectoryStep(TextAction(name, _arguments(fields.get("tool_args", ""))),
                                         fields.get("observation")))
    return result
