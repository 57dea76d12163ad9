"""The engine: a conversation in, episodes and the warn-then-stop decision out. No I/O.

A conversation is folded message by message. A user message starts a task;
each assistant message is one turn and may complete one finding (the rules it
tripped, in SPEC order); a message holding several calls is several steps, each
of which may complete one. The fold's state after the messages already seen is
cached per session, so a long conversation is analysed only by its new
messages; the cache is checked against every message's fingerprint, so it can
make an analysis faster but never change a verdict.

The fold's parts each have their module: who speaks and where a task may begin (`speakers.py`), what a step is
(`steps.py`), the rules on steps with their evidence's strength (`tools.py`, the content layer, `evidence.py`) and
what an episode comes to (`ladder.py`). This module folds, numbers the episodes and decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from proxy.detect import ladder
from proxy.detect.actions import Action
from proxy.detect.content import Chant, ContentTracker
from proxy.detect.evidence import REASONING, Chanting, Cycle, Evidence, RepeatedReply, Verdict
from proxy.detect.judge_policy import JudgeCheck
from proxy.detect.normalize import digest, excerpt, mask
from proxy.detect.speakers import (HARNESS_KEPT, PERSON_REPLY_EXTRA, PersonTurns, harness_key, keeps_loop,
                                   may_open_task, opening_answer, own_at, own_reply, person_turns, reply_form,
                                   repeats_opener)
from proxy.detect.steps import (acted_steps, chanting, make_call, reasoning_cut, spoken, text_call, tool_evidence,
                                tool_results)
from proxy.detect.text_steps import read_actions, task_text, trajectory
from proxy.detect.tools import ERROR_REPEATS, Call, ToolFinding, ToolTracker, changes_a_file, is_edit
from proxy.conversation import (  # noqa: F401 (the prefixes are the engine's vocabulary too)
    ASSISTANT,
    CUT_NOTICE_PREFIX,
    INJECTED_PREFIX,
    TOOL,
    USER,
    Message,
    model_text,
    role_at,
)
from proxy.policy import Policies

TYPES = ("tool_call", "tool_cycle", "tool_error", "reply", "content", "llm")


@dataclass(frozen=True)
class DetectConfig:
    tool_call_threshold: int = 3
    content_chunk_size: int = 50
    content_loop_threshold: int = 10
    dynamic_thresholds: bool = False
    whitelisted_tools: frozenset[str] = frozenset()
    max_warnings: int = 2
    judge_confirm: bool = False
    policies: Policies = Policies()  # per-tool exemptions and thresholds

    @classmethod
    def from_settings(cls, settings) -> "DetectConfig":
        return cls(
            tool_call_threshold=settings.tool_call_threshold,
            content_chunk_size=settings.content_chunk_size,
            content_loop_threshold=settings.content_loop_threshold,
            dynamic_thresholds=settings.dynamic_thresholds,
            whitelisted_tools=settings.whitelisted_tools,
            max_warnings=settings.max_warnings,
            judge_confirm=settings.judge_confirm_model is not None,
            policies=settings.policies,
        )

    def tool_rule(self, name: str, turn: int) -> tuple[bool, int, int, bool | None]:
        """For a tool: whether it is exempt, its thresholds for repeats and for the same error, and whether it
        edits (as its policy says; False when its name says nothing of editing; None when its name does, and
        its arguments are to tell: `changes_a_file`)."""
        rule = self.policies.tool(name) if self.policies.tools else {}
        if name in self.whitelisted_tools or rule.get("exempt"):
            return True, 0, 0, False
        edit = rule.get("edit")
        if edit is None:  # by its name, then by what its arguments do (None: the caller asks them)
            edit = None if is_edit(name) else False
        threshold = rule.get("threshold")
        if threshold is not None:
            return False, threshold, threshold, edit
        return False, self.tool_threshold(turn), ERROR_REPEATS, edit

    def _scaled(self, base: int, turn: int) -> int:
        # Short tasks stricter, long ones looser (3 / 5 / 7 for a base of 5).
        if not self.dynamic_thresholds or 10 <= turn <= 30:
            return base
        return max(2, round(base * (0.6 if turn < 10 else 1.4)))

    def tool_threshold(self, turn: int) -> int:
        return self._scaled(self.tool_call_threshold, turn)

    def content_threshold(self, turn: int) -> int:
        return self._scaled(self.content_loop_threshold, turn)

    def new_content_tracker(self) -> ContentTracker:
        widest = self.content_threshold(31)
        return ContentTracker(self.content_chunk_size, self.content_loop_threshold, max_threshold=widest)


@dataclass
class Finding:
    """What one assistant message tripped, in SPEC order; its warning goes at `place`."""

    message_index: int
    place: int
    turn: int
    trips: list[Evidence]
    was_cut: bool = False  # the message carries the cut notice: the proxy cut it, and logged it then
    step: int = 0  # the step within the message: a call of several in one message, a DSPy trajectory's step

    @property
    def position(self) -> tuple[int, int]:
        return self.message_index, self.step


@dataclass(frozen=True)
class Episode:
    number: int
    limit: int  # MAX_WARNINGS: episodes beyond it may stop the task (`ladder`)
    evidence: Evidence
    message_index: int
    place: int
    turn: int
    was_cut: bool = False
    step: int = 0
    judge_agreed: bool = False  # the judge found this task looping, at this episode or before it
    after_stop: bool = False  # an episode of the task was its stop before this one

    @property
    def is_stop(self) -> bool:
        """The task's stop (or, in observe mode and replay, an episode past it)."""
        return self.after_stop or ladder.stops(self.number, self.limit, self.evidence.strength, self.judge_agreed)

    @property
    def type(self) -> str:
        return self.evidence.type

    @property
    def detail(self) -> dict:
        """The evidence as the log records it, with its strength."""
        return {**self.evidence.logged(), "strength": self.evidence.strength}


@dataclass
class TaskState:
    start: int
    key: str
    tools: ToolTracker
    content: ContentTracker
    turns: int = 0
    anchored: bool = False  # the task's first assistant turn has been seen (and named the run)
    findings: list[Finding] = field(default_factory=list)
    turn_places: list[tuple[int, int, int]] = field(default_factory=list)  # per turn: (message index, step, place)
    # Masked user texts that answered the assistant in this conversation: the harness talking, should they come
    # again (an environment's `Nothing happens.`, a role-play's same review), not a person opening a new task.
    harness: set[bytes] = field(default_factory=set)
    # When a user text answering the assistant's text opened this task: the task before, as it was before that
    # assistant message, the message's index, and the text's harness key. Should the same text (numbers aside)
    # answer the assistant again, it was the harness all along, and the two are one task.
    before: "tuple[TaskState, int, bytes] | None" = None
    borrowers: int = 0  # response watchers that will read this state as it is, should they need it (copied then)
    reply: bytes | None = None  # the form of the last turn's reply, when it was a reply without an action
    replies: int = 0  # consecutive turns that gave it
    across: bool = False  # a person's message that kept the task came within that run of replies
    # The person's turns (`PersonTurns`): what the agent answered the latest person's message and the one before it,
    # and the task as it was before the latest person's message opened this one.
    persons: "PersonTurns | None" = None
    ended: "TaskState | None" = None  # the task a person's message ended to open this one (`late_episodes`)

    def clone(self) -> "TaskState":
        return TaskState(self.start, self.key, self.tools.clone(), self.content.clone(), self.turns,
                         self.anchored, list(self.findings), list(self.turn_places), set(self.harness),
                         self.before, 0, self.reply, self.replies, self.across,
                         None if self.persons is None else self.persons.clone(), self.ended)

    def anchor(self, first_turn: Message) -> None:
        """Name this run of the task by its first assistant turn's first call id: a rerun of the same
        prompt, or a twin agent started alike, gets new call ids from the model and so is another task."""
        if self.anchored:
            return
        self.anchored = True
        for call in first_turn.calls:
            if call.id:
                self.key = digest(f"{self.key}\x00{call.id}").hex()[:16]
                return


@dataclass
class FoldCache:
    reset_at: int
    fingerprints: list[int]
    state: TaskState
    config: DetectConfig | None = None  # a verdict under other settings (another model's policy) is not reused


def _fingerprint(message: Message) -> int:
    return hash(message)


def _task_key(messages: list[Message], start: int) -> str:
    opener = task_text(messages[start - 1].text) if start > 0 else ""
    return digest(f"{start}\x00{opener}").hex()[:16]


def _new_task(config: DetectConfig, messages: list[Message], start: int,
              before: "TaskState | None" = None) -> TaskState:
    """A task starting at `start`; it knows the harness's texts the conversation met before it."""
    harness = set(before.harness) if before is not None and len(before.harness) < HARNESS_KEPT else set()
    return TaskState(start, _task_key(messages, start), ToolTracker(), config.new_content_tracker(),
                     harness=harness)


class Turn:
    """One assistant turn being folded: text first, then tool calls, then the finding (one per step, when the
    message holds several calls)."""

    def __init__(self, config: DetectConfig, state: TaskState, message_index: int, step: int = 0) -> None:
        self.config = config
        self.state = state
        self.message_index = message_index
        self.step = step
        state.turns += 1
        self.turn = state.turns
        state.content.threshold = config.content_threshold(self.turn)
        self.chant = None
        self.channel: str | None = None  # the channel of the text last fed: where a chant completes
        self.tool_found: dict[str, ToolFinding] = {}  # the first finding of each type in this turn
        self._text_ended = False
        self._chant_told = False  # the chant went into a step's finding already
        self._last_step = step  # the step the turn's end belongs to
        self.replied: RepeatedReply | None = None  # when this turn repeats the replies before it

    def reply(self, text: str | None) -> None:
        """The turn's reply when it took no action (None: it acted, or said nothing of its own): the same reply
        in consecutive turns is a loop, numbers aside, at the tool threshold (SPEC §5, `reply`)."""
        state = self.state
        form = reply_form(text) if text else ""
        if not form:
            state.reply, state.replies, state.across = None, 0, False
            return
        key = digest(form)
        if key == state.reply:
            state.replies += 1
        else:
            state.replies, state.across = 1, False
        state.reply = key
        if state.persons is not None:  # to a person, a reply in other numbers is another answer (`go to desk 2`)
            state.persons.mark("R", mask(text).lower())
        # Across a person's messages the same reply needs one turn more (`PERSON_REPLY_EXTRA`).
        threshold = self.config.tool_threshold(self.turn) + (PERSON_REPLY_EXTRA if state.across else 0)
        if state.replies >= threshold:
            self.replied = RepeatedReply(excerpt(text, 200), state.replies)

    def text(self, piece: str, channel: str | None = None) -> bool:
        """Feed text (`channel` REASONING for the model's reasoning: the turn's reasoning and its answer are one
        text); True when it completed a chant."""
        if self.chant is None and not self._text_ended:
            self.channel = channel
            self.chant = self.state.content.feed(piece)
            return self.chant is not None
        return False

    def chanting(self) -> Chanting:
        return chanting(self.chant, self.channel)

    def cut_in_reasoning(self, chant: Chant) -> None:
        """The proxy cut this turn inside its reasoning (its notice says so): the chant counts as found."""
        if self.chant is None:
            self.chant, self.channel = chant, REASONING
            self.state.content.reset()

    def end_text(self) -> bool:
        """The text is over (a tool call began, or the message ended)."""
        if self._text_ended:
            return False
        self._text_ended = True
        ended = self.state.content.end_message()
        if self.chant is None and ended is not None:
            self.chant = ended
            return True
        return False

    def tool_call(self, call: Call) -> None:
        self.end_text()
        self.state.content.reset()  # a tool call starts the content tracking afresh
        exempt, threshold, error_repeats, edit = self.config.tool_rule(call.name, self.turn)
        if exempt:
            self.state.tools.skip()
            return
        if edit is None:  # named as an edit: one when it changes a file (a path and new content, or a patch)
            edit = changes_a_file(call.arguments)
        for found in self.state.tools.add(call, threshold, error_repeats, edit):
            self.tool_found.setdefault(found.type, found)

    def tool_calls(self, calls: list[Call], place: int) -> list[Finding]:
        """The message's calls in order. Several in one message are steps (numbered from 1), each of which may
        complete a finding of its own: identical calls in one message are consecutive repeats like any
        others. Their warnings all go at `place`, after the results that answer the message."""
        if len(calls) <= 1:
            for call in calls:
                self.tool_call(call)
            return []
        found = []
        for number, call in enumerate(calls, start=1):
            self.tool_call(call)
            finding = self._found(place, False, number)
            if finding is not None:
                found.append(finding)
        self._last_step = len(calls)
        return found

    def _found(self, place: int, was_cut: bool, step: int) -> Finding | None:
        """What the step ending here tripped, as a finding; the turn's trips are spent."""
        trips = [tool_evidence(self.tool_found[kind]) for kind in TYPES if kind in self.tool_found]
        self.tool_found = {}
        if self.replied is not None:
            trips.append(self.replied)
            self.replied = None
        if self.chant is not None and not self._chant_told:
            trips.append(self.chanting())
            self._chant_told = True
        if not trips:
            return None
        finding = Finding(self.message_index, place, self.turn, trips, was_cut, step)
        self.state.findings.append(finding)
        return finding

    def finish(self, place: int, was_cut: bool = False) -> Finding | None:
        self.end_text()
        self.state.turn_places.append((self.message_index, self._last_step, place))
        return self._found(place, was_cut, self._last_step)


def _fold(config: DetectConfig, state: TaskState, messages: list[Message], begin: int, end: int,
          reset_at: int) -> TaskState:
    j = begin
    opening: tuple[TaskState, int, int] | None = None  # the task before a user text that may open one
    while j < end:
        message = messages[j]
        if j == reset_at and j > 0:
            state = _new_task(config, messages, j, state)
        role = message.role
        if message.injected:
            j += 1
        elif role == USER:
            own = own_at(messages, j)
            if own:
                j += own  # the agent's own preamble or note, and the reply it recorded: no task, no turn
                continue
            if not may_open_task(messages, j):
                j += 1  # another agent's answer or the harness's that no step took as its result: no task
                continue
            state = _person_text(config, state, messages, j, opening, reset_at)
            opening = None
            j += 1
        elif role == ASSISTANT:
            if own_reply(messages, j):
                j += 1  # an agent's recorded `Ok.` whose preamble is out of this request
                continue
            state, may_open, j = _assistant_turn(config, state, messages, j, reset_at)
            if may_open is not None:
                opening = may_open
        else:
            j += 1  # system, developer, stray tool results
    if end == reset_at and state.start < reset_at:
        state = _new_task(config, messages, reset_at, state)
    state.tools.settle()  # the messages may be gone by the next request
    return state


def _person_text(config: DetectConfig, state: TaskState, messages: list[Message], j: int,
                 opening: tuple[TaskState, int, int] | None, reset_at: int) -> TaskState:
    """A user's text at `j`: the task it opens (after an assistant's text that may have opened one, the task
    before it is kept, in case this text is the harness answering); or, when the person's turn changes nothing of
    what is asked while the agent answers alike (`keeps_loop`), the task it goes on with."""
    text = messages[j].text
    if keeps_loop(state, messages, j):
        return _kept(config, state, messages, j, reset_at)
    persons = person_turns(state, messages, j)
    ended = _ended(state)
    state = _new_task(config, messages, j + 1, state)
    state.persons = persons
    state.ended = ended
    if opening is not None and opening[1] == j:
        state.before = (opening[0], opening[2], harness_key(text))
        state.harness.add(state.before[2])  # if it comes again, it is the harness talking
    elif j > 0 and messages[j - 1].role == ASSISTANT:
        state.harness.add(harness_key(text))
    for number, step in enumerate(trajectory(text) or (), start=1):
        # DSPy's ReAct: each step of the trajectory in this message is a turn.
        turn = Turn(config, state, j, number)
        turn.tool_call(text_call(step.action, step.observation))
        turn.finish(j + 1)
    return state


def _kept(config: DetectConfig, state: TaskState, messages: list[Message], j: int, reset_at: int) -> TaskState:
    """The task going on past the person's message at j. When the task began at the person's message before, the
    answer that message got is folded again into the task before it, which holds the first answer alike."""
    last = state.persons
    before = last.before
    if before is not None and state.start == last.at + 1 and not (before.start < reset_at <= j):
        restored = before.clone()
        _keep(restored, messages, last.at)
        state = _fold(config, restored, messages, last.at + 1, j, reset_at)
    _keep(state, messages, j)
    return state


def _keep(state: TaskState, messages: list[Message], j: int) -> None:
    """The person's message at j keeps the task open: their turn begins, the run of replies goes on across it."""
    state.persons = person_turns(state, messages, j)
    state.persons.before = None
    state.across = state.replies > 0
    state.content.reset()  # the replies on either side of it are two texts, no chant
    if j > 0 and messages[j - 1].role == ASSISTANT and len(state.harness) < HARNESS_KEPT:
        state.harness.add(harness_key(messages[j].text))


def _assistant_turn(config: DetectConfig, state: TaskState, messages: list[Message], j: int, reset_at: int
                    ) -> tuple[TaskState, tuple[TaskState, int, int] | None, int]:
    """The assistant's message at `j` and what answered it, as one turn: the state after it, the task before it
    where its text may open one (None: it may not), and the index past the turn."""
    message = messages[j]
    text, was_cut = model_text(message)
    opening = None
    if not message.calls:
        if repeats_opener(state, messages, j, reset_at):
            # The text that opened this task answers again: it was the harness, and its step is one of the task
            # before, folded again from that step on.
            restored, at, key = state.before
            restored = restored.clone()
            restored.harness.add(key)
            state = _fold(config, restored, messages, at, j, reset_at)
        at = opening_answer(state, messages, j)
        if at is not None:
            snapshot = state.clone()
            snapshot.before = None
            opening = (snapshot, at, j)
    state.anchor(message)
    said = None
    if message.calls:
        results, after = tool_results(messages, j + 1)
        calls = [make_call(call, results) for call in message.calls]
    else:
        said = spoken(state, messages, j, text)
        calls, after = ([], j + 1) if said is not None else acted_steps(state, messages, j, text)
    turn = Turn(config, state, j)
    # A reply that took no action: none written, or only one the harness rejected; or what it said to the person
    turn.reply(said if said is not None else
               text if not message.calls and not was_cut and all(c.error for c in calls) else None)
    if state.persons is not None:
        state.persons.calls(calls)
    if text:
        turn.text(text)
    if was_cut:
        cut = reasoning_cut(message.text)
        if cut is not None:
            turn.cut_in_reasoning(cut)
    turn.tool_calls(calls, after)
    turn.finish(after, was_cut)
    return state, opening, after


def _final_step_start(messages: list[Message]) -> int:
    """Where the messages whose results may still grow begin (the last call still unanswered)."""
    last = len(messages)
    while last > 0 and (own_reply(messages, last - 1) or own_at(messages, last - 1)):
        last -= 1  # what the agent wrote itself after a step comes before the step's answer
    if last and messages[last - 1].role == ASSISTANT and (last == len(messages) or not messages[last - 1].calls):
        return last - 1  # its answer, native or in text, is still to come
    for j in range(len(messages) - 1, -1, -1):
        role = messages[j].role
        if role == TOOL:
            continue
        if role == ASSISTANT and messages[j].calls:
            results, _ = tool_results(messages, j + 1)
            ids = {c.id for c in messages[j].calls}
            if not ids <= results.keys():
                return j
        break
    return len(messages)


def fingerprints_of(messages: Sequence[Message]) -> list[int]:
    """A fingerprint per message; from the dialect's own items when the messages are read lazily."""
    own = getattr(messages, "fingerprints", None)
    return own() if own is not None else [_fingerprint(m) for m in messages]


# A conversation first seen (a new process, another replica, a history edited before its end) is read from its
# recent steps only, so its first request costs a bounded amount whatever its length: at least the turns the
# longest rule needs (the same 8 calls in order, 3 × TOOL_CALL_THRESHOLD rounds whatever their results, a
# dynamic threshold 1.4 times that: `_rule_turns`), then as far back as FIRST_SIGHT_MESSAGES messages or
# FIRST_SIGHT_CHARS characters of text reach. What the task did before that window (an episode warned there, an
# error seen twice) is not counted.
FIRST_SIGHT_MESSAGES = 400
FIRST_SIGHT_CHARS = 2_000_000


def _rule_turns(config: DetectConfig) -> int:
    """The most assistant turns any rule reads back: 102 at the default threshold of 3."""
    return 34 * config.tool_call_threshold


def _window_start(messages: list[Message], end: int, min_turns: int) -> int:
    """Where the recent steps before `end` begin, as far back as the first sight reads."""
    turns = chars = 0
    begin = end
    while begin > 0:
        if turns >= min_turns and (end - begin >= FIRST_SIGHT_MESSAGES or chars >= FIRST_SIGHT_CHARS):
            break
        begin -= 1
        message = messages[begin]
        chars += len(message.text)
        turns += message.role == ASSISTANT
    return begin


def _first_sight(config: DetectConfig, messages: list[Message], reset_at: int, settled: int) -> tuple[int, TaskState]:
    """Where the fold of a conversation not seen before begins, and the state it begins with: the task that
    message belongs to, named as a fold from the first message names it."""
    begin = _window_start(messages, settled, _rule_turns(config))
    if begin <= max(reset_at, 0):
        return 0, _new_task(config, messages, 0)
    while begin < settled and messages[begin].role == TOOL:
        begin += 1  # a step's results belong to its call, before the window
    start = reset_at
    for j in range(begin - 1, reset_at - 1, -1):  # only the user messages are read whole
        if role_at(messages, j) == USER and may_open_task(messages, j):
            start = j + 1
            break
    state = _new_task(config, messages, start)
    for j in range(start, begin):
        if role_at(messages, j) == ASSISTANT and not own_reply(messages, j):
            state.anchor(messages[j])
            break
    return begin, state


def analyze(config: DetectConfig, messages: list[Message], reset_at: int = 0,
            cache: FoldCache | None = None, fingerprints: list[int] | None = None) -> tuple[TaskState, FoldCache]:
    """The state of the current task after `messages`, and the cache for the next request. (A caller that
    holds the messages' fingerprints already, as replay does for each prefix of a record, may pass them.)"""
    fingerprints = fingerprints_of(messages) if fingerprints is None else fingerprints
    reset_at = min(reset_at, len(messages))  # a history shortened since the reset: all of it is forgiven
    settled = _final_step_start(messages)
    if cache is not None and (cache.config is config or cache.config == config) and cache.reset_at == reset_at \
            and len(cache.fingerprints) <= settled \
            and fingerprints[: len(cache.fingerprints)] == cache.fingerprints:
        begin = len(cache.fingerprints)
        state = cache.state
        if begin < settled and state.borrowers:
            state = state.clone()  # a response watcher may yet read it as it was
    else:
        cache = None
        begin, state = _first_sight(config, messages, reset_at, settled)
    if cache is None or begin < settled:  # else nothing new is settled: the cache stands as it is
        state = _fold(config, state, messages, begin, settled, reset_at)
        cache = FoldCache(reset_at, fingerprints[:settled], state, config)
    if settled < len(messages):
        state = _fold(config, state.clone(), messages, settled, len(messages), reset_at)
    return state, cache


def allowed_trips(finding: Finding, plan_mode: bool) -> list[Evidence]:
    """The rules a finding tripped that count for this request (plan mode leaves the content rule out)."""
    return [t for t in finding.trips if not (plan_mode and t.type == "content")]


def episode_of(config: DetectConfig, number: int, finding: Finding, trips: list[Evidence],
               previous_type: str | None, judge_agreed: bool = False, after_stop: bool = False) -> Episode:
    """A finding as the task's episode `number`: the fold and the live stream watcher number them alike.
    `judge_agreed`: the judge found the task looping; `after_stop`: an earlier episode was the stop."""
    judge_agreed = judge_agreed or ladder.judge_agrees(trips)
    trip = ladder.named_after(trips, previous_type, number, config.max_warnings)
    return Episode(number, config.max_warnings, trip, finding.message_index, finding.place, finding.turn,
                   finding.was_cut, finding.step, judge_agreed, after_stop)


@dataclass(frozen=True)
class UnseenChant:
    """A chant in the reasoning of a whole (non-streamed) answer: the conversation the client sends next does
    not hold that reasoning, so what was found in it is remembered, by the task and the turn it was."""

    task: str
    turn: int  # the task's assistant turn, from 1
    chanting: Chanting


def episodes(config: DetectConfig, state: TaskState, *, plan_mode: bool = False,
             judge_checks: list[JudgeCheck] = (), unseen: Sequence[UnseenChant] = ()) -> list[Episode]:
    """Number the task's findings: one episode per step (a message, or one call of several in a message),
    named after its first allowed rule."""
    if not (state.findings or unseen or judge_checks):
        return []  # most requests: nothing to number
    trips_at: dict[tuple[int, int], tuple[Finding, list[Evidence]]] = {}
    for finding in state.findings:
        trips = allowed_trips(finding, plan_mode)
        if trips:
            trips_at[finding.position] = (finding, trips)
    for chant in unseen:
        if chant.task == state.key and not plan_mode and 0 < chant.turn <= len(state.turn_places):
            _add_trip(trips_at, state, chant.turn - 1, chant.chanting)
    for check in judge_checks:
        # The verdict is about the turns it saw; it counts on the next turn after them.
        if check.task == state.key and check.is_loop(config.judge_confirm) and check.turn < len(state.turn_places):
            _add_trip(trips_at, state, check.turn, Verdict(check.confidence, excerpt(check.analysis, 300)))
    result: list[Episode] = []
    for number, index in enumerate(sorted(trips_at), start=1):
        finding, trips = trips_at[index]
        last = result[-1] if result else None
        result.append(episode_of(config, number, finding, trips, last and last.type, bool(last and last.judge_agreed),
                                 bool(last and last.is_stop)))
    return result


def _add_trip(trips_at: dict, state: TaskState, turn_index: int, trip: Evidence) -> None:
    """A rule tripped outside the conversation the rules read (a judge's verdict, a chant in a whole answer's
    reasoning), at the task's turn `turn_index` (from 0): beside that step's own trips, in SPEC order, once
    per rule."""
    index, step, place = state.turn_places[turn_index]
    found = trips_at.get((index, step))
    if found is None:
        trips_at[index, step] = (Finding(index, place, turn_index + 1, [], step=step), [trip])
    elif all(each.type != trip.type for each in found[1]):
        found[1].append(trip)
        found[1].sort(key=lambda each: TYPES.index(each.type))


def _ended(task: TaskState) -> TaskState | None:
    """What a task a person's message ends keeps for `late_episodes`: its key, findings and turns (none of its
    trackers, nor the task it ended in turn)."""
    if not task.turns:
        return None
    return TaskState(task.start, task.key, None, None, task.turns, task.anchored, task.findings, task.turn_places)


def late_episodes(config: DetectConfig, state: TaskState, *, plan_mode: bool = False,
                  unseen: Sequence[UnseenChant] = ()) -> list[Episode]:
    """A chant in the last turn of the task a person's message has just ended (a whole answer's text or reasoning,
    the person writing next): no request of that task carried its warning, and the new task does not, yet it was
    a detection. Its episode as that task numbers it, asked on the new task's first request (no turn yet); a chant
    the proxy cut, or one past the task's stop, was logged then or logs nothing."""
    ended = state.ended
    if ended is None or state.turns:
        return []
    last = ended.turn_places[-1][0]
    return [episode for episode in episodes(config, ended, plan_mode=plan_mode, unseen=unseen)
            if episode.message_index == last and episode.type == "content" and not episode.was_cut
            and not episode.after_stop]


class Decision:
    """What a request's episodes come to: the stop, if one is among them, and the warnings."""

    __slots__ = ("episodes", "stop", "warnings")

    def __init__(self, episodes: list[Episode]) -> None:
        self.episodes = episodes
        self.stop: Episode | None = next((e for e in episodes if e.is_stop), None) if episodes else None
        self.warnings: list[Episode] = [e for e in episodes if not e.is_stop] if episodes else []

    def logged(self) -> list[tuple[Episode, Action]]:
        """What a request with this decision logs (the proxy, live or observing, and replay alike): its stop;
        else each warning it carries, when it reaches the model, except a chant the proxy cut (logged then)."""
        if self.stop is not None:
            return [(self.stop, Action.STOPPED)]
        return [(warning, Action.WARNED) for warning in self.warnings if not warning.was_cut]


RECOVERY_TURNS = 5  # turns after a warning, with no further episode, that count as the model having moved on


def _action_keys(message: Message) -> set[str]:
    """What an assistant message did: its calls, native or written in text, by name and canonical arguments."""
    calls = [make_call(call, {}) for call in message.calls] or \
        [text_call(action, None) for action in read_actions(model_text(message)[0]) or ()]
    return {call.key for call in calls}


def ends_task(message: Message) -> bool:
    """An answer of the model's own that calls nothing: the agent's task ends with it."""
    return bool(model_text(message)[0].strip()) and not _action_keys(message)


def after_warning(messages: Sequence[Message], warning: Episode) -> tuple[int, bool]:
    """Since the model was given this warning: how many turns it took, and whether any of them came back to the
    loop's calls (those of the message that completed it; for a cycle, of every turn of the cycle)."""
    looped: set[str] = set()
    turns = len(warning.evidence.cycle) if isinstance(warning.evidence, Cycle) else 1
    for index in range(min(warning.message_index, len(messages) - 1), -1, -1):
        message = messages[index]
        if message.role == ASSISTANT:
            looped |= _action_keys(message)
            turns -= 1
            if not turns:
                break
    taken, returned = 0, False
    for index in range(warning.place, len(messages)):  # read no further than the turns that decide
        message = messages[index]
        if message.role == ASSISTANT:
            taken += 1
            returned = returned or not looped.isdisjoint(_action_keys(message))
            if returned or taken > RECOVERY_TURNS:
                break
    return taken, returned


def answer_action(episode: Episode) -> Action | None:
    """How an episode completed by a streamed answer is logged ("stopped" or "cut"); None past a task's
    would-be stop (observe mode, replay), after which a task logs nothing more."""
    if episode.after_stop:
        return None
    return Action.STOPPED if episode.is_stop else Action.CUT


class ResponseWatcher:
    """Follows the response to one request: the next assistant turn of the task."""

    def __init__(self, config: DetectConfig, state: TaskState, decision: Decision, message_index: int,
                 plan_mode: bool, *, shared: bool = False) -> None:
        """`shared`: the state is the fold cache's, copied only if the answer is read (most whole answers are
        not); until then it is borrowed, and the next request's fold does not change it in place."""
        self.config = config
        self.plan_mode = plan_mode
        self.next_number = len(decision.episodes) + 1
        last = decision.episodes[-1] if decision.episodes else None
        self.previous_type = last.type if last else None
        self.judge_agreed = bool(last and last.judge_agreed)
        self.after_stop = bool(last and last.is_stop)
        self.episode: Episode | None = None
        self._state = state
        self._message_index = message_index
        self._shared = shared
        self._current: Turn | None = None
        if shared:
            state.borrowers += 1

    @property
    def _turn(self) -> Turn:
        """The answer's turn, on the watcher's own copy of the state."""
        turn = self._current
        if turn is None:
            state = self._state
            if self._shared:
                self.release()
                state = state.clone()
            turn = self._current = Turn(self.config, state, self._message_index)
        return turn

    def release(self) -> None:
        """The answer needs no more reading: a borrowed state is given back."""
        if self._shared:
            self._shared = False
            self._state.borrowers -= 1

    def _content_episode(self) -> Episode | None:
        if self.plan_mode or self._turn.chant is None:
            return None
        turn = self._turn
        finding = Finding(turn.message_index, turn.message_index + 1, turn.turn,
                          [turn.chanting()], was_cut=True)
        self.episode = episode_of(self.config, self.next_number, finding, finding.trips, None, self.judge_agreed,
                                  self.after_stop)
        return self.episode

    def text(self, piece: str) -> Episode | None:
        """Streamed text; an episode when it completes a chant (the stream is to be cut)."""
        return self._content_episode() if self._turn.text(piece) else None

    def reasoning(self, piece: str) -> Episode | None:
        """Streamed reasoning: the same window as the answer that follows it."""
        return self._content_episode() if self._turn.text(piece, REASONING) else None

    def tool_call_started(self) -> Episode | None:
        return self._content_episode() if self._turn.end_text() else None

    def unseen(self, episode: Episode, message: Message) -> UnseenChant:
        """A chant this whole answer's reasoning completed, as the next request's fold will know its task (a
        task is named by its first turn's call id once it has one)."""
        state = self._turn.state  # this request's own copy of the task
        state.anchor(message)
        return UnseenChant(state.key, episode.turn, episode.evidence)

    def finish(self, message: Message) -> Episode | None:
        """The response is complete: its actions, native or written in text, count now, their results
        still unknown."""
        if self.episode is not None:
            return None
        text, was_cut = model_text(message)
        calls = [make_call(call, {}) for call in message.calls] or \
            [text_call(action, None) for action in read_actions(text) or ()]
        if not calls and self._turn.end_text():
            return self._content_episode()
        self._turn.reply(text if not calls and not was_cut else None)
        place = self._turn.message_index + 1
        found = self._turn.tool_calls(calls, place)
        last = self._turn.finish(place)
        # The first step that completes an episode (several identical calls in one answer: the first past the
        # threshold); the next request's history numbers the rest.
        for finding in found + ([last] if last is not None else []):
            trips = allowed_trips(finding, self.plan_mode)
            if trips:
                self.episode = episode_of(self.config, self.next_number, finding, trips, self.previous_type,
                                          self.judge_agreed, self.after_stop)
                return self.episode
        return None
