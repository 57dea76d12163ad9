"""Who speaks in a conversation, and where a task may begin. No I/O.

A user message is not always a person: it may be the proxy's own warning, the agent's note to itself (Aider's
file-context message and the `Ok.` it records after it), another agent's answer in a group, or the harness's
observation of a step. Only a text a person may have written opens a task; the harness repeating itself (the same
text, numbers aside) is the harness, and a person whose new message changes nothing of what is asked, while the
agent answers alike, goes on with the task (`keeps_loop`). Read by the engine's fold and by the first sight of a
long conversation alike, so both begin a task at the same message.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from proxy.conversation import ASSISTANT, SYSTEM, USER, Message
from proxy.detect.normalize import digest, mask
from proxy.detect.text_steps import is_agent_preamble, is_agent_reply, is_observation, trajectory
from proxy.detect.tools import Call

if TYPE_CHECKING:
    from proxy.detect.engine import TaskState


# The harness's texts a conversation hands from task to task; past this many, a new task starts knowing none
# (as each did before), so a conversation of many distinct prompts holds no more.
HARNESS_KEPT = 1024


def own_at(messages: list[Message], k: int) -> int:
    """How many messages from k on the agent wrote itself: its preamble or note (Aider's `I updated the
    files.`, its file-context message), and the reply it recorded for the model (`Ok.`). 0, 1 or 2."""
    message = messages[k]
    if message.role != USER or message.injected or not is_agent_preamble(message.text):
        return 0
    if k + 1 < len(messages) and messages[k + 1].role == ASSISTANT and not messages[k + 1].calls \
            and is_agent_reply(messages[k + 1].text):
        return 2
    return 1


def may_open_task(messages: Sequence[Message], k: int) -> bool:
    """Whether the user message at k may open a task, read alone: one a person may have written, not the
    proxy's, the agent's own note, another agent's answer or the harness's observation. (The fold and the first
    sight of a long conversation ask the same, so both begin its task at the same message.)"""
    message = messages[k]
    return not (message.injected or own_at(messages, k) or from_agent(messages, k) or is_observation(message.text))


def past_own(messages: list[Message], k: int) -> int:
    """The first message from k on that the agent did not write itself."""
    while k < len(messages):
        own = own_at(messages, k)
        if not own:
            break
        k += own
    return k


def from_agent(messages: Sequence[Message], k: int) -> bool:
    """The user message at k is another agent's answer in a group of agents: named after a speaker other than
    the one whose message opened the conversation. A step's result, never a new task."""
    name = messages[k].name
    if not name:
        return False
    for message in messages:  # the first user message: whoever set the task
        if message.role == USER:
            return name != message.name
    return False


def group_answer(messages: list[Message], at: int) -> tuple[int, int]:
    """In a group of agents, the others may speak in turn before the harness answers a step (a critic, then the
    code's output): the answer read as the step's result (the harness's observation when one of them is, else
    the first) and the index past them all. Elsewhere the answer at `at` alone."""
    if not from_agent(messages, at):
        return at, at + 1
    result, k = None, at
    while k < len(messages) and messages[k].role == USER and not messages[k].injected:
        observed = is_observation(messages[k].text)
        if not (observed or from_agent(messages, k)):
            break
        if observed and result is None:
            result = k
        k += 1
    return (at if result is None else result), k


def user_answer(messages: list[Message], j: int) -> int | None:
    """Where the user message answering message j is (after what the agent wrote itself), if there is one."""
    k = past_own(messages, j + 1)
    if k < len(messages):
        answer = messages[k]
        if answer.role == USER and not answer.injected:
            return k
    return None


NUMBERS = re.compile(r"\d+")


# A reply this long (masked) is compared numbers aside: a harness's template with a count in it. A person's
# short question about folder 2, then folder 3, stays two questions.
NUMBERS_ASIDE_FROM = 80


def reply_form(text: str) -> str:
    """An assistant's reply as its repeats are compared: masked, numbers aside, case folded."""
    return NUMBERS.sub("\x00", mask(text)).lower()


def harness_form(text: str) -> str:
    """A user text as the harness repeats it: masked, and numbers aside (`found 3 actions`, `found 2 actions`)."""
    masked = mask(text)
    return NUMBERS.sub("\x00", masked) if len(masked) >= NUMBERS_ASIDE_FROM else masked


def harness_key(text: str) -> bytes:
    return digest(harness_form(text))


def system_text(messages: Sequence[Message]) -> str:
    """The conversation's system message (the first; it opens the conversation)."""
    for k in range(min(len(messages), 2)):
        if messages[k].role in (SYSTEM, "developer"):
            return messages[k].text
    return ""


def answered_before(state: "TaskState", answer: str) -> bool:
    """Another agent's answer is one given before in this conversation (numbers aside): no news, as a harness
    repeating itself. Its answers are remembered as the harness's texts are."""
    key = harness_key(answer)
    if key in state.harness:
        return True
    if len(state.harness) < HARNESS_KEPT:
        state.harness.add(key)
    return False


def opening_answer(state: "TaskState", messages: list[Message], j: int) -> int | None:
    """Where the user text answering the assistant's text at j is, when it may open a new task (it is no
    observation and not the harness known to this task)."""
    at = user_answer(messages, j)
    if at is None:
        return None
    answer = messages[at].text
    if is_observation(answer) or from_agent(messages, at) or (state.harness and harness_key(answer) in state.harness):
        return None
    return at


def repeats_opener(state: "TaskState", messages: list[Message], j: int, reset_at: int) -> bool:
    """The text answering the assistant's text at j is the one that opened this task (numbers aside): the
    harness answering again, so the task it opened never was one. Only a harness's template (a text long
    enough to be compared numbers aside) is taken back so, and only while the task it opened has found
    nothing (what it logged stays logged under it); a short nudge (`go on`) is the harness from its repeat on."""
    before = state.before
    if before is None or state.findings or before[1] < reset_at <= j:  # a reset between forgives what came before
        return False
    at = user_answer(messages, j)
    if at is None:
        return False
    form = harness_form(messages[at].text)
    return len(form) >= NUMBERS_ASIDE_FROM and digest(form) == before[2]


# -- a person's turns -------------------------------------------------------------------------------------------
# In a conversation with a person (a customer-facing agent, a chat), the person's messages keep coming while the
# agent may answer each alike: the same reply, the same failing call, the same hand-off. A person's message that
# changes nothing of what is asked (the same person, giving no new facts) after the agent answered the person's
# last two messages alike does not open a task: the loop stays in view, its warnings stay where they were given,
# before the person's next message, and its count goes on. Another person, the same ask again in the same words
# (numbers aside: on purpose, `try it once more`), new facts (an id, a number, an address not said before), or an
# answer that ran a call that succeeded (a lookup, a poll whose answer is news) start afresh.

PERSON_MARKS_KEPT = 64  # the marks of one answer kept (a long answer's last ones do not count)


PERSON_FACTS_KEPT = 256  # the facts a conversation's person gave, kept to tell new ones; past this, none is new


# A reply repeated across a person's messages needs this many more turns than a reply repeated to a harness: the
# person may push for what the agent rightly refuses, or greet it again.
PERSON_REPLY_EXTRA = 1


# What a person gives as a fact: an id, a number, a code (a token holding a digit), an address.
# Read as tokens (runs of these characters), each kept when it holds a digit or is an address: one pass, where a
# pattern finding a digit inside a run would try each run from every position.
_TOKEN = re.compile(r"[\w.+@-]+")
_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


_FACT_LENGTH = 3  # shorter tokens (`2`, `a1`) are counts and choices, not facts


# A call that hands the conversation over (to a person, another agent, another department): made again after each
# of the person's messages it did not take effect, whatever it answered.
_HANDOFF = re.compile(r"transfer|hand_?off|escalat", re.IGNORECASE)


class PersonTurns:
    """The person's latest message in a conversation and what the agent answered it (its loop marks: each call that
    failed, by its tool and its error (a search that found nothing by the call itself); each hand-off, by the call; each reply, by its form, counted only when no
    call of the answer succeeded), with the marks of its answer to the person's message before."""

    __slots__ = ("name", "said", "at", "marks", "replies", "worked", "earlier", "facts", "before")

    def __init__(self, name: str | None, said: bytes, at: int, facts: frozenset[str],
                 earlier: frozenset[bytes] = frozenset(), before: "TaskState | None" = None) -> None:
        self.name = name  # the person's name, where the client gives one
        self.said = said  # what the person said (masked, numbers aside, case folded), as a digest
        self.at = at  # the message's index
        self.marks: set[bytes] = set()
        self.replies: set[bytes] = set()
        self.worked = False  # a call of the answer succeeded: its replies say what it found
        self.earlier = earlier
        self.facts = facts
        self.before = before  # the task before this message opened this one, while it may be taken up again

    def clone(self) -> "PersonTurns":
        other = PersonTurns(self.name, self.said, self.at, self.facts, self.earlier, self.before)
        other.marks, other.replies, other.worked = set(self.marks), set(self.replies), self.worked
        return other

    def answer(self) -> frozenset[bytes]:
        """The marks of the agent's answer to this message."""
        return frozenset(self.marks if self.worked else self.marks | self.replies)

    def mark(self, kind: str, text: str) -> None:
        marks = self.replies if kind == "R" else self.marks
        if len(marks) < PERSON_MARKS_KEPT:
            marks.add(digest(f"{kind}\x00{text}"))

    def calls(self, calls: list[Call]) -> None:
        """A turn's calls, as marks of the answer."""
        for call in calls:
            if call.said:
                continue
            if call.error is not None:  # one tool failing alike (its arguments aside: a date written anew); a
                # search finding nothing is the same only for the same search
                self.mark("E", f"{call.key if call.negative else call.name}\x00{call.error}")
            elif _HANDOFF.search(call.name):
                self.mark("H", call.key)
            elif call.succeeded:
                self.worked = True


def person_facts(text: str) -> frozenset[str]:
    return frozenset(token.lower() for token in _TOKEN.findall(text[:4000]) if len(token) >= _FACT_LENGTH and (
        any(c.isdigit() for c in token) or ("@" in token and _ADDRESS.fullmatch(token))))


def said_form(text: str) -> bytes:
    return digest(reply_form(text))


def person_turns(state: TaskState, messages: list[Message], j: int, before: "TaskState | None" = None
                  ) -> PersonTurns:
    """The person's message at j, after the answer the state holds (the task before, when this message opens a new
    task that the next may take up again: `_kept`)."""
    message = messages[j]
    last = state.persons
    facts = person_facts(message.text)
    if last is None:
        return PersonTurns(message.name, said_form(message.text), j, facts)
    known = last.facts
    if len(known) < PERSON_FACTS_KEPT:
        known = known | facts
    # The task before may be taken up again unless this message starts afresh on its own account.
    said = said_form(message.text)
    fresh = message.name != last.name or said == last.said or not facts <= last.facts
    if not fresh:
        last.before = None  # only the task just before is ever taken up again: no chain of tasks is kept
        before = state
    return PersonTurns(message.name, said, j, known, last.answer(), before)


def keeps_loop(state: TaskState, messages: list[Message], j: int) -> bool:
    """Whether the person's message at j leaves the task open: the same person, saying something else than the
    last time (numbers aside) and nothing new, after the agent answered their last two messages alike."""
    last = state.persons
    if last is None or not last.earlier:
        return False
    message = messages[j]
    if message.name != last.name or trajectory(message.text):
        return False
    if said_form(message.text) == last.said or not person_facts(message.text) <= last.facts:
        return False  # the same ask again (numbers aside), on purpose; or new facts given
    return not last.earlier.isdisjoint(last.answer())


def own_reply(messages: list[Message], j: int) -> bool:
    """The assistant message at j is a reply the agent recorded after its own preamble (Aider's `Ok.`)."""
    return j > 0 and own_at(messages, j - 1) == 2
