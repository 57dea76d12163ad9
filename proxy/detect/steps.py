"""What a step is: a native tool call with its result, an action written in text with the observation that
answered it, or a reply a person gets; and the evidence a rule's finding gives of its steps. No I/O.

A step is compared by meaning: its action's name and canonical arguments, and its result masked (times, ids,
paths, the call's own arguments echoed) and, for an error, read by its start and its end.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from proxy.conversation import CUT_NOTICE_PREFIX, TOOL, Message, ToolCall
from proxy.detect.content import Chant
from proxy.detect.evidence import REASONING, Chanting, Cycle, Evidence, RepeatedCall, RepeatedError
from proxy.detect.normalize import (canonical_arguments, excerpt, first_sentence, is_error_form, is_negative_answer,
                                    is_unchanged_read, mask, without_echo)
from proxy.detect.speakers import (answered_before, from_agent, group_answer, harness_form, harness_key,
                                   system_text, user_answer)
from proxy.detect.text_steps import (TextAction, inline_observation, is_observation, is_progress_note,
                                     observation_failed, observation_text, read_actions, spoken_action,
                                     without_reminder)
from proxy.detect.tools import Call, ToolFinding, names_missing_program, one_attempt

if TYPE_CHECKING:
    from proxy.detect.engine import TaskState


def tool_results(messages: list[Message], after: int) -> tuple[dict[str, tuple[str, bool]], int]:
    """Tool results that follow an assistant message, and the index just past them."""
    results: dict[str, tuple[str, bool]] = {}
    j = after
    while j < len(messages) and messages[j].role == TOOL:
        message = messages[j]
        results[message.call_id] = (message.text, message.failed)
        j += 1
    return results, j


def make_call(call: ToolCall, results: dict[str, tuple[str, bool]]) -> Call:
    """A native tool call, with its result when the conversation has it."""
    return _call(call.name, canonical_arguments(call.arguments or ""), results.get(call.id))


# The lines a sandboxed shell ends each result with (OpenHands: the interpreter, glued to the output's last line,
# the prompt, the exit code): no words of the failure, and long enough to push its last lines (a test run's
# assertion, its summary) out of the end an error is told by. Read line by line from the end: a pattern searched
# over the whole text would try every position of a long output.
_EXIT_LINE = "[Command finished with exit code"
_FRAME_READ = 600  # the exit line is looked for this far from the end
_PROMPT_LINE = re.compile(r"[\w.-]{1,100}@[\w.-]{1,100}:[^\n]{0,300}[#$]\s*")
_INTERPRETER = "[Python Interpreter: "
_INTERPRETER_READ = 400


def without_shell_frame(text: str) -> str:
    """A shell tool's result without the sandbox's closing lines, when it ends with them."""
    if _EXIT_LINE not in text[-_FRAME_READ:]:
        return text
    body = text.rstrip()
    cut = body.rfind("\n")
    if not body.endswith("]") or not body.startswith(_EXIT_LINE, cut + 1):
        return text
    body = body[:max(cut, 0)]
    cut = body.rfind("\n")
    if _PROMPT_LINE.fullmatch(body, cut + 1):
        body = body[:max(cut, 0)]
    at = body.rfind(_INTERPRETER, max(len(body) - _INTERPRETER_READ, 0))
    return body[:at] if at >= 0 and body.endswith("]") else body


# A terminal's transcript (Cursor's `run_terminal_cmd`): the prompt with the command echoed first, the bare prompt
# last. Neither says anything of the result; the first hides an error's form on the line after it.
_ECHO = re.compile(r"[\w.-]{1,100}@[\w.-]{1,100}[\x20:][^\n]{0,300}?[%$#]\x20[^\n]*\n")
_BARE_PROMPT = re.compile(r"\n[\w.-]{1,100}@[\w.-]{1,100}[\x20:][^\n]{0,300}?[%$#]\s*\Z")


def without_prompt_echo(text: str) -> str:
    """A terminal's transcript without its first line echoing the command and its last, bare prompt."""
    echo = _ECHO.match(text)
    if echo is None:
        return text
    body = text[echo.end():]
    tail = _BARE_PROMPT.search(body, max(len(body) - 400, 0))
    return body[:tail.start()] if tail is not None else body


def _call(name: str, arguments: str, outcome: tuple[str, bool] | None, rejected: bool = False,
          said: bool = False) -> Call:
    """A step, compared by meaning: the action's name and canonical arguments, and its result (masked when
    first compared). `rejected`: the harness refused the step before running it; `said`: the step is the model's
    text with no action in it."""
    if outcome is None or is_unchanged_read(outcome[0]):  # unknown, or the same as the read before
        return Call(name, arguments, said=said)
    text, marked = outcome
    text = without_prompt_echo(text)
    if not (marked or is_error_form(text)):
        return Call(name, arguments, text, said=said)
    masked = mask(without_shell_frame(text))
    missing = names_missing_program(masked, name, arguments)
    if missing is None:  # a missing program's name is no echo of the call, nor a search finding nothing
        masked = without_echo(masked, arguments)
    if missing is None and is_negative_answer(masked):  # told by its first sentence: the suggestions after it change each search
        return Call(name, arguments, text, first_sentence(masked), negative=True, rejected=rejected, said=said)
    return Call(name, arguments, text, error_text(masked), rejected=rejected, said=said,
                nudged=said and rejected and not is_error_form(text))


def error_text(masked: str) -> str:
    """What identifies an error: its start and its end (a traceback's exception and a test run's summary
    come last; two different failures often share a long start)."""
    return masked if len(masked) <= 500 else f"{masked[:250]} … {masked[-250:]}"


def text_call(action: TextAction, observation: str | None, marked: bool = False, rejected: bool = False,
              said: bool = False) -> Call:
    """An action written in text (`said`: the model's text that holds none), and the observation that answered it
    (None while unknown)."""
    return _call(action.name, action.arguments, None if observation is None else (observation, marked), rejected,
                 said)


def acted_steps(state: "TaskState", messages: list[Message], j: int, text: str) -> tuple[list[Call], int]:
    """An assistant message without native tool calls: the steps it acts in text, and where the messages
    that answer it end. A user message that is the harness talking (an observation, or the same text that
    answered the assistant before in this task) is part of the step, not a new task. An observation is read
    without the reminder the agent appended to the newest one (so it compares with the same observation in
    the earlier messages, which the agent sends without it)."""
    at = user_answer(messages, j)
    actions = read_actions(text)
    inline = inline_observation(text) if actions else None
    if inline is not None:  # CrewAI appends its system message's tool list to some of them: not the result
        inline = without_reminder(inline, system_text(messages))
    if at is not None:
        at, past = group_answer(messages, at)
        answer = messages[at].text
        harness_said = is_observation(answer)
        observed = harness_said or from_agent(messages, at)
        known = not observed and bool(state.harness) and harness_key(answer) in state.harness
        if inline is not None and not observed:
            # The result is in the assistant's message; the user's is the harness's nudge once it is known.
            return [text_call(action, inline) for action in actions], (at + 1 if known else j + 1)
        if observed or known:
            if not actions and harness_said and messages[at].name:
                return [], past  # in a group, the executor answering another agent's code: no step of this one's
            # A text the harness answered is a step, an action or not (Cline's `[ERROR] You did not use a tool`).
            said = not actions
            actions = actions or [TextAction("reply", mask(text)[:2000])]
            harness_repeats = not observed  # the harness's own text again (a format error): the step never ran
            if harness_repeats and is_progress_note(answer):
                # The harness's note that the edit went through, again: the step's result, read by its form.
                return [text_call(action, answer, said=said) for action in actions], past
            if observed and (harness_said or not answered_before(state, answer)):
                answer = without_reminder(answer, system_text(messages))
                observation, failed = observation_text(answer), observation_failed(answer)
                return [text_call(action, observation, failed, said=said) for action in actions], past
            # The harness repeating itself (a format error), or another agent giving the same answer again: what
            # it answers is the step, failed.
            return [text_call(action, harness_form(answer), marked=True, rejected=harness_repeats, said=said)
                    for action in actions], past
    return [text_call(action, inline) for action in actions or ()], j + 1


def spoken(state: "TaskState", messages: list[Message], j: int, text: str) -> str | None:
    """What the assistant's text action at j says to the person (its reply action, or an action its harness
    could not read and passed on as it was: `spoken_action`), when no harness answers it."""
    said = spoken_action(text) if "Action:" in text else None
    if said is None:
        return None
    at = user_answer(messages, j)
    if at is not None and (is_observation(messages[at].text) or from_agent(messages, at)):
        return None
    return said


def tool_evidence(found: ToolFinding) -> Evidence:
    first = found.calls[-1] if found.type != "tool_cycle" else found.calls[0]
    call = {"tool": first.name, "arguments": excerpt(first.arguments), "repeats": found.repeats,
            "result": excerpt(_readable(first.result_excerpt), 120) if first.result_excerpt else None}
    if found.type == "tool_cycle":
        return Cycle(**call, cycle=tuple(c.name for c in found.calls),
                     cycle_arguments=tuple(excerpt(c.arguments, 60) for c in found.calls),
                     same_result=found.same_result)
    if found.type == "tool_error":
        error = " ".join(_readable(first.error or "").split())
        # Its start and its end: where a traceback's exception and a test run's summary are.
        error = error if len(error) <= 200 else f"{error[:80]} … {error[-115:]}"
        differed = len({c.key for c in found.calls}) > 1  # one error answering different calls
        alike = differed and one_attempt(found.calls)
        return RepeatedError(**call, error=error, calls=tuple((c.name, excerpt(c.arguments, 60))
                                                              for c in found.calls) if differed else (), alike=alike)
    if found.idle:  # calls that each did nothing, in whatever form
        call["arguments"] = excerpt("; ".join(c.arguments for c in found.calls), 120)
        return RepeatedCall(**call, same_result=False, idle=True)
    return RepeatedCall(**call, same_result=found.same_result)


def _readable(masked: str) -> str:
    """A masked text as people read it: each masked run (a time, an id, a path, the call's own argument echoed)
    shown as an ellipsis."""
    return masked.replace("\x00", "…").replace("\x01", "…")


# The cut notice of a chant completed inside the reasoning (the answer holds only the notice): its count.
_REASONING_CUT = re.compile(re.escape(CUT_NOTICE_PREFIX) + r" the same text repeated (\d+) times in the reasoning\.")


def chanting(chant: Chant, channel: str | None = None) -> Chanting:
    return Chanting(excerpt(chant.repeated, 200), chant.occurrences, REASONING if channel == REASONING else None)


def reasoning_cut(text: str) -> Chant | None:
    """A message the proxy cut inside its reasoning: the chant its notice reports (the reasoning itself is not
    in the conversation a client sends on, or not reliably), so the next request carries its warning."""
    found = _REASONING_CUT.search(text) if CUT_NOTICE_PREFIX in text else None
    return Chant("", int(found.group(1))) if found else None
