"""The inspection step: one request in, its verdict out, without I/O.

Headers, the parsed payload, its dialect and the stored facts (operator controls, judge verdicts, the
conversation a chained request continues) go in; out comes either `Stop` (the answer to give instead of
calling upstream) or `Forward` (the body to send, the headers to add to the answer, and the `Tap` that reads
the upstream's answer on its way back and may cut it). The episodes a request serves go to the `EpisodeSink`
it is inspected with (the server's tells them to the add-ons that log them); the answers the service keeps go
to a `keep` callback. The aiohttp handler is a thin adapter around this.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import orjson

from proxy.agents import agent_name, session_title
from proxy.config import Settings
from proxy.conversation import USER, Chain, Conversation, Message, RequestError, ToolCall
from proxy.detect.actions import Action
from proxy.detect.engine import (
    RECOVERY_TURNS,
    Decision,
    DetectConfig,
    Episode,
    FoldCache,
    ResponseWatcher,
    UnseenChant,
    after_warning,
    analyze,
    answer_action,
    ends_task,
    episodes,
    fingerprints_of,
    late_episodes,
)
from proxy.detect.judge_policy import JudgeCheck, check_due
from proxy.detect.ladder import shown
from proxy.detect.normalize import digest
from proxy.detect.speakers import system_text
from proxy.detect.text_steps import person_text
from proxy.detect.texts import cut_notice, stop_text, warning_text
from proxy.lru import LRU
from proxy.wire.dialect import Dialect, StreamAssembler, Summary
from proxy.wire.errors import error_object
from proxy.wire.known import LONG_BODY, Parsed, written
from proxy.wire.sse import Passing, SSEParser, WholeEvents

# Read in this order; the README lists them with the agents that send them.
SESSION_HEADERS = ("X-Loopwarden-Session", "X-Session-Id", "X-Claude-Code-Session-Id", "session_id", "session-id",
                   "thread-id", "X-Session-Affinity", "Helicone-Session-Id", "X-Litellm-Session-Id")
# Agents whose side requests share the session header of their main conversation.
SIDE_SPLIT_HEADERS = frozenset({"X-Claude-Code-Session-Id"})
CACHED_SESSIONS = 4096
MODEL_POLICIES = 256  # models whose settings are kept resolved
UNSEEN_PER_SESSION = 8  # chants in whole answers' reasoning remembered per session
DEFAULT_COMPLETION_TOKENS = 4096
_NO_MODES: frozenset[str] = frozenset()
# A session is named from its first messages (an agent's preamble and example conversation come before the
# person's first prompt): never read further, so a long conversation first seen costs no more to name.
OPENING_MESSAGES = 100
KEPT_CALLS = 16384  # calls of kept answers remembered, for requests that name them rather than send them
# What the per-session memories may hold, all sessions together, and the kept calls (each weighed when put, at
# most: `_session_weight`, `_call_weight`); past it the least recently used go first.
SESSIONS_BYTES = 128 * 1024 * 1024
KEPT_CALLS_BYTES = 32 * 1024 * 1024
# A session's memory: its record and task state before any step, then what each message adds at most (its
# fingerprint, and the task state's records of a step: its call's digests, its error, its place).
SESSION_BYTES = 4096
MESSAGE_BYTES = 1024
MODEL_CHARS = 256  # a model's name as every cache, span and column holds it (no real one is longer)


def client_key(headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> str:
    """The key the client authenticates with: in a header, or (the Gemini API's other way) the `key` query
    parameter."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    key = headers.get("x-api-key") or headers.get("api-key") or headers.get("x-goog-api-key")
    if not key and query is not None:
        key = query.get("key")
    return (key or "").strip()


@functools.lru_cache(maxsize=4096)
def tenant_of(key: str) -> str:
    """A short, one-way name for a client key: the key itself is never stored or logged."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def session_of(headers: Mapping[str, str], messages: list[Message], tenant: str, chain: Chain | None = None,
               side: bool = False) -> str:
    """The session's id: a header, else the conversation of the chain the request continues or its session,
    else a fingerprint of the key and how the conversation began. State is kept per (tenant, id), never per id
    alone."""
    named = named_session(headers, chain, side)
    return named if named is not None else opening_fingerprint(tenant, messages)[0]


def body_slot(headers: Mapping[str, str], query: Mapping[str, str], dialect: str, raw: bytes) -> tuple:
    """Where a long body is remembered for the conversation's next request (`KnownBodies`): per dialect, client
    key and session headers, and by its opening bytes (an agent's subagents share its session header)."""
    return (dialect, client_key(headers, query), *[headers.get(name) for name in SESSION_HEADERS],
            headers.get("x-claude-code-agent-id"), hash(raw[:LONG_BODY]))  # a digest of the opening: no body kept


def named_session(headers: Mapping[str, str], chain: Chain | None = None, side: bool = False) -> str | None:
    """The session's id as a header names it, or the chain the request continues; None when neither does.
    Claude Code's subagents and an agent's side requests share its session header but are conversations of
    their own."""
    for header in SESSION_HEADERS:
        value = headers.get(header)
        if value and (value := value.strip()):
            agent = headers.get("x-claude-code-agent-id", "").strip()
            if agent:
                value = f"{value}/agent-{agent}"
            elif side and header in SIDE_SPLIT_HEADERS:
                value += "/side"
            return value[:256]
    if chain is not None and chain.conversation_id:
        return _printable(chain.conversation_id)[:256]
    if chain is not None and chain.session_id:
        return chain.session_id
    return None


def opening_fingerprint(tenant: str, messages: Sequence[Message]) -> tuple[str, int]:
    """The id of a session no header names: a fingerprint of the key, the system text and the person's first
    prompt; and how many of the first messages it was read from (0 when no person wrote yet)."""
    system = system_text(messages)
    prompt, place = opening_prompt(messages, system)
    session = "fp-" + digest(f"{tenant}\x00{system}\x00{prompt}").hex()[:16]
    return session, (max(place + 1, 2) if place >= 0 else 0)


def first_prompt(messages: Sequence[Message], system: str | None = None) -> str:
    """The first message a person wrote, as names a task (the session's fingerprint and its title): an agent's
    own preamble (Aider's file-context message, which moves after the first request, and its example
    conversation) is skipped, and the reminder it appends to the newest message is cut. (`system`: the
    conversation's system text, when the caller has it.)"""
    return opening_prompt(messages, system_text(messages) if system is None else system)[0]


def opening_prompt(messages: Sequence[Message], system: str) -> tuple[str, int]:
    """The first prompt (`first_prompt`) and the index of the message it is read from (-1: none)."""
    return person_text(((k, m.text) for k, m in enumerate(_opening(messages)) if m.role == USER), system)


def _opening(messages: Sequence[Message]):
    """The messages a session is named from: its first ones, however long the conversation has grown."""
    return itertools.islice(messages, OPENING_MESSAGES)


@dataclass(slots=True)
class Context:
    """Whose an episode is: the proxy logs it under these."""

    tenant: str
    session_id: str
    task: str
    model: str | None
    api: str
    enforced: bool = True


class EpisodeSink(Protocol):
    """Where episodes go: the log, alerts, telemetry and metrics."""

    def episode(self, context: Context, episode: Episode, action: Action, request_id: str | None,
                tokens_saved: int, served_by: str | None = None) -> None: ...

    def recovery(self, context: Context, episode: Episode) -> None: ...


class Facts(Protocol):
    """The stored facts a verdict needs, beyond the conversation (kept in memory: never waited on), and where
    a session's sightings go."""

    def controls(self, tenant: str, session_id: str) -> Any: ...  # .disabled, .reset_at_message

    def judge_checks(self, tenant: str, session_id: str, task: str) -> list[JudgeCheck]: ...

    def session_seen(self, tenant: str, session_id: str, message_count: int, model: str | None,
                     agent: str | None = None, title: str | None = None, task: str | None = None) -> None: ...

    def resume_link_issued(self, token: str, tenant: str, session_id: str, task: str) -> None: ...


@dataclass
class Incoming:
    headers: Mapping[str, str]
    raw: bytes
    payload: dict
    dialect: Dialect
    chain: Chain | None = None  # what a request continuing a conversation the service keeps continues
    path: str = ""  # the request's path, as sent (some dialects name the model there)
    query: Mapping[str, str] | None = None  # its query (the Gemini API may carry the key there)
    origin: str = ""  # the proxy's address as the client reached it (a resume link's, without PUBLIC_URL)
    parsed: Parsed | None = None  # how the body was parsed: the items it shares with the conversation's last
    tenant: str | None = None  # whose, where the caller has it already (a gateway's hash of its key); else the key's


@dataclass
class JudgeDue:
    """A judge check the request made due: started once the request has been forwarded."""

    key: tuple[str, str]
    context: Context
    task: str
    turn: int
    task_start: int
    messages: list[Message]
    client_key: str


@dataclass
class Stop:
    episode: Episode
    body: bytes
    headers: dict[str, str]
    status: int = 400


class Forward:
    """The request goes on: its body, the headers added to the answer, a judge check it made due, and the tap
    that reads the answer (None: relayed unread). The tap is made by `prepare`, once the request is on its way
    (the upstream need not wait for it), or when first asked for."""

    __slots__ = ("body", "headers", "judge", "_make_tap", "_tap")

    def __init__(self, body: bytes, headers: dict[str, str] | None = None,
                 make_tap: "Callable[[], Tap] | None" = None, judge: JudgeDue | None = None) -> None:
        self.body = body
        self.headers = {} if headers is None else headers
        self.judge = judge
        self._make_tap = make_tap
        self._tap: Tap | None = None

    def prepare(self) -> None:
        make, self._make_tap = self._make_tap, None
        if make is not None:
            self._tap = make()

    @property
    def tap(self) -> "Tap | None":
        self.prepare()
        return self._tap


@dataclass(slots=True)
class SessionMemory:
    """What this process remembers of a session between its requests (one record: one lookup a request)."""

    message_count: int = 0
    fold: FoldCache | None = None  # the task state after the conversation's settled messages
    unseen: tuple[UnseenChant, ...] = ()  # chants found in whole answers' reasoning


@dataclass(slots=True, eq=False)
class Flow:
    """One request on its way through the inspection: what each step learned, for the next."""

    incoming: Incoming
    payload: dict
    raw: bytes  # the body as it may go upstream
    parsed: Parsed | None  # how it was parsed (None: whole, or cleaned since)
    client_key: str
    tenant: str
    conversation: Conversation
    session_id: str = ""
    fingerprints: list[int] | None = None  # the messages', when they named the session
    answer_headers: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    memory: SessionMemory | None = None
    controls: Any = None  # an operator's, for the session (.disabled, .reset_at_message)
    agent: str | None = None  # the agent and the title read of a session new to this process
    title: str | None = None
    plan_mode: bool = False
    observe: bool = False
    settings: Settings | None = None
    config: DetectConfig | None = None
    body: bytes = b""  # what goes upstream: `raw`, with the warnings where there are any

    @property
    def dialect(self) -> Dialect:
        return self.incoming.dialect

    @property
    def messages(self) -> Sequence[Message]:
        return self.conversation.messages

    @property
    def key(self) -> tuple[str, str]:
        return self.tenant, self.session_id


def _session_weight(key: tuple[str, str], memory: SessionMemory) -> int:
    """What a session's memory holds, at most: it grows with the messages its task state has read."""
    fold = memory.fold
    return SESSION_BYTES + sys.getsizeof(key[1]) + (MESSAGE_BYTES * len(fold.fingerprints) if fold is not None else 0)


def _call_weight(key: tuple[str, str], call: ToolCall) -> int:
    """What a kept call holds: its id, name and arguments (a client's size), and its entry."""
    return 256 + sys.getsizeof(key[1]) + sys.getsizeof(call.name) + sys.getsizeof(call.arguments)


class Inspector:
    """Per-process inspection state: what is remembered per session and the settings resolved per model."""

    def __init__(self, settings: Settings, facts: Facts | None, judging: bool = False,
                 keep: Callable[..., None] | None = None, is_judge: Callable[[Mapping[str, str]], bool] = None
                 ) -> None:
        self.settings = settings
        self.config = DetectConfig.from_settings(settings)
        self.facts = facts
        self.judging = judging  # a judge can be asked
        self.keep = keep  # records an answer the service keeps: keep(tenant, response_id, previous, conversation,
        #                   session, messages)
        self.is_judge = is_judge or (lambda headers: False)
        # (tenant, session) -> SessionMemory
        self._sessions: LRU = LRU(CACHED_SESSIONS, SESSIONS_BYTES, _session_weight)
        # (tenant, first two message fingerprints) -> (fingerprints of the messages the id was read from, the id)
        self._openings: LRU = LRU(CACHED_SESSIONS)
        self._per_model: LRU = LRU(MODEL_POLICIES)
        self._links: LRU = LRU(CACHED_SESSIONS)  # (tenant, session, task) -> its stop's link's token
        # (tenant, call id) -> the calls of the answers the service keeps, as this process relayed them
        self._kept_calls: LRU = LRU(KEPT_CALLS, KEPT_CALLS_BYTES, _call_weight)

    def remember_unseen(self, key: tuple[str, str], chant: UnseenChant) -> None:
        """A chant in a whole answer's reasoning: the session's next request is warned of it."""
        memory = self._sessions.get(key)
        if memory is None:
            memory = SessionMemory()
            self._sessions.put(key, memory)
        memory.unseen = (*memory.unseen[-(UNSEEN_PER_SESSION - 1):], chant)

    def _fingerprinted(self, tenant: str, messages: Sequence[Message], fingerprints: list[int]) -> str:
        """The id of a session no header names (`opening_fingerprint`), read once per conversation and process:
        a request whose first messages, up to the person's first prompt, are those of an earlier one is of its
        session."""
        head = (tenant, *fingerprints[:2])
        known = self._openings.get(head)
        if known is not None and fingerprints[:len(known[0])] == known[0]:
            return known[1]
        session, read = opening_fingerprint(tenant, messages)
        if read:  # until a person writes, the id is not the conversation's for good
            self._openings.put(head, (fingerprints[:read], session))
        return session

    def caches(self) -> dict:
        """The memories bounded in bytes (for /metrics)."""
        return {"sessions": self._sessions, "kept_calls": self._kept_calls}

    def known_message_counts(self) -> dict:
        return {key: memory.message_count for key, memory in self._sessions.items()}

    def inspect(self, incoming: Incoming, sink: EpisodeSink) -> Stop | Forward:
        """The verdict on one request; the episodes it serves, now and as its answer comes, go to `sink`.
        Raises the dialect's RequestError for a body it cannot read."""
        if self.is_judge(incoming.headers):
            return Forward(incoming.raw)  # the judge's own request: not a session's turn
        flow = self._read(incoming)
        self._identify(flow)
        if self._disabled(flow):
            self._seen(flow, None)
            return Forward(flow.raw, flow.answer_headers)
        self._mode(flow)
        state, fold = analyze(flow.config, flow.messages, flow.controls.reset_at_message if flow.controls else 0,
                              flow.memory.fold, flow.fingerprints)
        flow.memory.fold = fold
        self._sessions.put(flow.key, flow.memory)  # weighed again, as its conversation grew
        self._seen(flow, state.key)
        checks = self.facts.judge_checks(flow.tenant, flow.session_id, state.key) if self.facts is not None else []
        decision = Decision(episodes(flow.config, state, plan_mode=flow.plan_mode, judge_checks=checks,
                                     unseen=flow.memory.unseen))
        context = Context(flow.tenant, flow.session_id, state.key, flow.model, incoming.dialect.name,
                          not flow.observe)
        if state.ended is not None and not state.turns:  # a person's message has just ended a task
            self._late(flow, state, context, sink)
        stop = decision.stop
        if stop is not None:
            # A stop saves at least the request it refused (or, observed, would have refused).
            sink.episode(context, stop, Action.STOPPED, None, len(flow.raw) // 4)
            if not flow.observe:
                return self._stop(flow, stop, state.key)
        inserted = self._render(flow, decision.warnings, stop)
        watcher = ResponseWatcher(flow.config, state, decision, len(flow.messages), flow.plan_mode,
                                  shared=state is fold.state)
        warned = self._warned(flow, decision, context, sink)
        keep = self._keeper(flow, inserted)

        def tap() -> Tap:  # made once the request is on its way; nothing it reads changes meanwhile
            return Tap(incoming.dialect, sink, context, watcher, TapOrders(
                flow.dialect.max_output_tokens(flow.payload) or DEFAULT_COMPLETION_TOKENS, warned,
                # After an observed would-be stop, the task logs nothing more.
                decision.logged() if stop is None else [], keep, flow.settings.cut_notice, flow.observe,
                lambda chant: self.remember_unseen(flow.key, chant),
                lambda: self._resume_link(flow.tenant, flow.session_id, state.key, incoming.origin)))

        return Forward(flow.body, flow.answer_headers, tap, self._judge_due(flow, state, checks, context))

    @staticmethod
    def _late(flow: Flow, state: Any, context: Context, sink: EpisodeSink) -> None:
        """What the last turn of the task just ended found, that no request of it carried: logged under that
        task, as found too late to act on."""
        late = late_episodes(flow.config, state, plan_mode=flow.plan_mode, unseen=flow.memory.unseen)
        if late:
            ended = Context(context.tenant, context.session_id, state.ended.key, context.model, context.api,
                            context.enforced)
            for episode in late:
                sink.episode(ended, episode, Action.LATE, None, 0)

    def _read(self, incoming: Incoming) -> Flow:
        """The request's payload as it may go upstream, and its conversation, read from what the conversation's
        previous request left (`Incoming.parsed`)."""
        payload, raw, parsed, dialect = incoming.payload, incoming.raw, incoming.parsed, incoming.dialect
        previous = parsed.previous if parsed is not None else None
        cleaned = dialect.forwardable(payload, parsed.reused if previous is not None and previous.forwardable else 0)
        if cleaned is not None:  # a block the service would refuse (one the proxy cut) is left out
            payload, raw, parsed = cleaned, orjson.dumps(cleaned), None  # its items are no longer those parsed
        elif parsed is not None and parsed.known is not None:
            parsed.known.forwardable = True
        key_of_client = client_key(incoming.headers, incoming.query)
        tenant = incoming.tenant or tenant_of(key_of_client)
        kept_calls = self._kept_calls
        conversation: Conversation = dialect.read(
            payload, incoming.chain.messages if incoming.chain is not None else None,
            (lambda call_id: kept_calls.get((tenant, call_id))) if kept_calls else None,
            (parsed.reused, previous.reading) if parsed is not None and previous is not None else None)
        if parsed is not None and parsed.known is not None:
            parsed.known.reading = conversation.reading
        return Flow(incoming, payload, raw, parsed, key_of_client, tenant, conversation)

    def _identify(self, flow: Flow) -> None:
        """Whose conversation it is: the session, the model, what this process remembers of it; and the session
        seen (the agent and title read once per session and process: the first wins)."""
        incoming, messages = flow.incoming, flow.messages
        flow.session_id = named_session(incoming.headers, incoming.chain, flow.dialect.is_side_request(flow.payload))
        if not flow.session_id:  # the messages' fingerprints, for the fold cache, taken here when they name it
            flow.fingerprints = fingerprints_of(messages)
            flow.session_id = self._fingerprinted(flow.tenant, messages, flow.fingerprints)
        flow.answer_headers = {"X-Loopwarden-Session": flow.session_id}
        model = flow.dialect.model(flow.payload, incoming.path)
        flow.model = model[:MODEL_CHARS] if model is not None else None  # before it keys settings, a span or the log
        memory = self._sessions.get(flow.key)
        new_here = memory is None
        if new_here:
            memory = SessionMemory()
        self._sessions.put(flow.key, memory)
        memory.message_count = len(messages)
        flow.memory = memory
        if self.facts is not None:
            if new_here:
                system = system_text(messages)
                flow.agent, flow.title = agent_name(incoming.headers, system), session_title(
                    (m.text for m in _opening(messages) if m.role == USER), system)
            flow.controls = self.facts.controls(flow.tenant, flow.session_id)

    def _seen(self, flow: Flow, task: str | None) -> None:
        """The session seen, in its current task (None: not read, detection being off for it)."""
        if self.facts is not None:
            self.facts.session_seen(flow.tenant, flow.session_id, len(flow.messages), flow.model, flow.agent,
                                    flow.title, task)

    @staticmethod
    def _disabled(flow: Flow) -> bool:
        """Detection is off for this request (its header) or its session (an operator)."""
        disable = flow.incoming.headers.get("X-Loopwarden-Disable")
        return (disable is not None and disable.strip() in ("1", "true", "yes")) or (
            flow.controls is not None and flow.controls.disabled)

    def _mode(self, flow: Flow) -> None:
        """The settings in force for the model, and the modes the request asks for (plan, observe)."""
        mode = flow.incoming.headers.get("X-Loopwarden-Mode")
        modes = {each.strip().lower() for each in mode.split(",")} if mode else _NO_MODES
        flow.plan_mode = "plan" in modes
        flow.settings, flow.config = self._settings_for(flow.model)
        flow.observe = "observe" in modes or flow.settings.mode == "observe"

    def _stop(self, flow: Flow, stop: Episode, task: str) -> Stop:
        """The request refused: the stop in the dialect's error shape, with the task's resume link."""
        link = self._resume_link(flow.tenant, flow.session_id, task, flow.incoming.origin)
        return Stop(stop, flow.dialect.error_body(stop_text(stop, link), "loop_detected", "loop_detected"),
                    {**flow.answer_headers, "X-Loopwarden-Loop": stop.type, "x-should-retry": "false"})

    @staticmethod
    def _render(flow: Flow, warnings: list[Episode], stop: Episode | None) -> list[tuple[int, str, str]]:
        """The body that goes upstream (`flow.body`) and the headers of the answer; the warnings inserted.
        A warning is re-created at its place in every request; where the service keeps the conversation (a
        chained request), the ones already sent are in it, and only new ones are added. Observe mode adds none:
        the request goes on as the client sent it."""
        flow.body = flow.raw
        inserted = [] if flow.observe else [(e.place, flow.settings.warning_role, warning_text(e)) for e in warnings
                                            if e.place >= flow.conversation.own_start]
        if inserted:
            try:
                flow.body = written(flow.payload, flow.dialect.with_warnings(flow.payload, flow.conversation,
                                                                             inserted),
                                    flow.parsed.known if flow.parsed is not None else None)
            except orjson.JSONEncodeError as exc:  # nested past what is written here (255 levels)
                raise RequestError(f"the request cannot carry loopwarden's warning: {exc}") from None
        if flow.observe and (stop is not None or warnings):
            flow.answer_headers["X-Loopwarden-Observed"] = f"stop {stop.type}" if stop is not None else \
                f"{shown(warnings[-1].number, warnings[-1].limit, stopped=False)} {warnings[-1].type}"
        elif warnings:
            flow.answer_headers["X-Loopwarden-Warning"] = \
                f"{shown(warnings[-1].number, warnings[-1].limit, stopped=False)} {warnings[-1].type}"
        return inserted

    def _warned(self, flow: Flow, decision: Decision, context: Context, sink: EpisodeSink) -> Episode | None:
        """The warning whose recovery the answer may show. Recovery is measured only on warnings the model was
        given, and is the last episode of its task: the model moved on when the loop's calls did not come back
        and it went on RECOVERY_TURNS turns, or (seen in the answer) it ended the task with an answer of its own."""
        warnings = decision.warnings
        warned = warnings[-1] if warnings and not flow.observe and decision.stop is None and \
            warnings[-1] is decision.episodes[-1] else None
        if warned is not None:
            taken, returned = after_warning(flow.messages, warned)
            if returned:
                return None
            if taken >= RECOVERY_TURNS:
                sink.recovery(context, warned)
        return warned

    def _keeper(self, flow: Flow, inserted: list[tuple[int, str, str]]
                ) -> Callable[[Message, str | None], None] | None:
        """Where the service keeps this answer: what remembers the conversation as sent, with the answer, for
        the requests that continue it."""
        if self.keep is None or not flow.dialect.keeps_answer(flow.payload):
            return None
        chain, record, tenant, session_id = flow.incoming.chain, self.keep, flow.tenant, flow.session_id
        sent = _with_warnings(flow.messages, inserted)[flow.conversation.own_start:]
        conversation_id = chain.conversation_id if chain is not None else flow.dialect.chain_ids(flow.payload)[1]
        previous = chain.last_id if chain is not None else None

        def keep(answer: Message, response_id: str | None) -> None:
            record(tenant, response_id, previous, conversation_id, session_id, sent + [answer])
            for call in answer.calls:  # a later request may name them only (`item_reference`)
                self._kept_calls.put((tenant, call.id), call)
        return keep

    def _judge_due(self, flow: Flow, state: Any, checks: list[JudgeCheck], context: Context) -> JudgeDue | None:
        """A judge check this request makes due, once it has been forwarded."""
        if self.judging and flow.settings.llm_check and flow.model and \
                check_due(state.turns, flow.settings.llm_check_after_turns, checks):
            return JudgeDue(flow.key, context, state.key, state.turns, state.start, flow.messages, flow.client_key)
        return None

    def _resume_link(self, tenant: str, session_id: str, task: str, origin: str) -> str | None:
        """The stopped task's resume link (the same token for each of its stops), kept in the log when first drawn,
        on the address the client reached (PUBLIC_URL where set); None where nothing is logged, so no link could
        be used."""
        if self.facts is None:
            return None
        key = (tenant, session_id, task)
        token = self._links.get(key)
        if token is None:
            token = secrets.token_urlsafe(24)
            self._links.put(key, token)
            self.facts.resume_link_issued(token, tenant, session_id, task)
        return f"{(self.settings.public_url or origin).rstrip('/')}/loopwarden/resume/{token}"

    def resume_url(self, tenant: str, session_id: str, task: str) -> str | None:
        """The link a stop of this task named, for operators: on PUBLIC_URL only (a client's Host header never
        chooses where operators are sent); None without it, or when this process named no link."""
        token = self._links.get((tenant, session_id, task))
        if token is None or not self.settings.public_url:
            return None
        return f"{self.settings.public_url.rstrip('/')}/loopwarden/resume/{token}"

    def _settings_for(self, model: str | None) -> tuple[Settings, DetectConfig]:
        """The settings and detection config in force for a model (its policy over the settings)."""
        found = self._per_model.get(model)
        if found is None:
            settings = self.settings.for_model(model)
            config = self.config if settings is self.settings else DetectConfig.from_settings(settings)
            found = (settings, config)
            self._per_model.put(model, found)
        return found


@dataclass(frozen=True, slots=True)
class TapOrders:
    """What the request decided for its answer."""

    max_completion: int
    warned: Episode | None  # the latest warning this request carries: did the model move on from it?
    deliver: list[tuple[Episode, Action]]  # what the request logs once it reaches the model
    keep: Callable[[Message, str | None], None] | None  # the whole answer, for a conversation the service keeps
    cut_notice: bool
    observe: bool  # find and log a chant, but let the stream run on
    unseen: Callable[[UnseenChant], None] | None = None  # told of a chant in a whole answer's reasoning
    resume_link: Callable[[], str | None] = lambda: None  # drawn only when the stream ends in a stop


class Tap:
    """Relays the upstream's stream in whole events and reads a copy (never re-encoding it) for the engine: cuts
    a chanting stream, keeps the answer the service keeps, logs what the answer completes. Sans-IO: bytes and
    parsed answers in, the bytes to forward out. A stream relayed unread has the same three steps
    (`WholeEvents`: pass_on, ended, broken)."""

    def __init__(self, dialect: Dialect, sink: EpisodeSink, context: Context, watcher: ResponseWatcher,
                 orders: TapOrders) -> None:
        self._dialect = dialect  # its stream's assembler is made when a stream comes (most answers are not)
        self._assembler_made: StreamAssembler | None = None
        self._sink = sink
        self.context = context
        self._watcher = watcher
        self._orders = orders
        self._deliver = orders.deliver  # what the request logs once it reaches the model
        self._keep = orders.keep  # given the whole answer once, then None
        self._warned = orders.warned
        self._parser: SSEParser | None = None
        self._events = WholeEvents()
        self._kept = False  # the answer the service keeps was kept with the read being passed on
        self.request_id: str | None = None

    @property
    def _assembler(self) -> StreamAssembler:
        assembler = self._assembler_made
        if assembler is None:
            assembler = self._assembler_made = self._dialect.stream()
        return assembler

    @property
    def keeps_answer(self) -> bool:
        return self._keep is not None

    def delivered(self, status: int, request_id: str | None) -> None:
        """The upstream answered: with a 200, the model has this request's warnings."""
        self.request_id = request_id
        if status == 200:
            for episode, action in self._deliver:
                self._sink.episode(self.context, episode, action, request_id, 0)
        self._deliver = []

    def pass_on(self, chunk: bytes) -> Passing:
        """A read of the stream: its whole events go out, or, where the stream must end, what comes up to the end
        of the event that completed the loop and the bytes that end the stream."""
        cut = self._read(chunk)
        kept, self._kept = self._kept, False
        if cut is None:
            return Passing(self._events.release(chunk), kept=kept)
        forward, ending = cut
        return Passing(self._events.ended() + chunk[:forward] + ending, last=True, kept=kept)

    def ended(self) -> bytes:
        """The stream ended as the upstream sent it: what is held goes out, and the whole answer is read."""
        rest = self._events.ended()
        self._stream_end()
        return rest

    def broken(self, error_event: bytes) -> bytes:
        """The upstream broke off: the dialect's error event, after what ends an event that went out in part."""
        return self._events.broken(error_event)

    def _read(self, chunk: bytes) -> tuple[int, bytes] | None:
        """Read a copy of upstream bytes. When the stream must end here: how much of `chunk` to forward (up to
        the end of the event that completed the loop), and the bytes that end the stream."""
        assembler = self._assembler
        parser = self._parser
        if parser is None:
            parser = self._parser = SSEParser()
        event_start = 0 if parser.at_boundary else -1  # -1: the first event began in an earlier read
        for event in parser.feed(chunk):
            start, event_start = event_start, event.end
            if event.data == b"[DONE]":
                continue
            try:
                data = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(data, dict):
                continue
            try:
                text, call_started = assembler.add(data, event.event)
            except (TypeError, AttributeError, KeyError, ValueError):
                continue  # an event of a shape its API does not have: passed on as it came, not read
            reasoning = assembler.last_reasoning
            if reasoning:  # the turn's reasoning and its answer are one text for the chanting rule
                found = self._watcher.reasoning(reasoning)
                if found is not None and not self._observed_only(found):
                    return event.end, self._ending(found)
            if text:
                found = self._watcher.text(text)
                if found is not None and not self._observed_only(found):
                    return event.end, self._ending(found)  # the delta that completed the chant is the last
            if call_started:
                found = self._watcher.tool_call_started()
                if found is not None and not self._observed_only(found):
                    # The text before this call chanted: end before the call, unless it began earlier.
                    return (start if start >= 0 else event.end), self._ending(found)
        if self._keep is not None and assembler.finished:
            # The answer is complete: record it now, so it is written before its last event goes out.
            self._keep_answer(assembler.message(), assembler.response_id)
        return None

    def _saved(self) -> int:
        """The tokens the request could still have spent (its reasoning counts against its maximum too)."""
        assembler = self._assembler
        return max(0, self._orders.max_completion - (len(assembler.text) + len(assembler.reasoning_text)) // 4)

    def _observed_only(self, episode: Episode) -> bool:
        """In observe mode a chant is logged where it would have been cut, and the stream goes on."""
        if not self._orders.observe:
            return False
        action = answer_action(episode)
        if action is not None:
            self._sink.episode(self.context, episode, action, self.request_id, self._saved())
        return True

    def _ending(self, episode: Episode) -> bytes:
        """Count the episode and build the stream's last bytes: the notice and a clean stop, or the stop's error
        (in a dialect whose clients resume after an error event, the stop ends as a cut does, and the next
        request is refused)."""
        assembler = self._assembler
        saved = self._saved()
        if episode.is_stop and not assembler.stop_is_cut:
            self._sink.episode(self.context, episode, Action.STOPPED, self.request_id, saved)
            return assembler.stop_ending(error_object(stop_text(episode, self._orders.resume_link()), "loop_detected",
                                                      "loop_detected"))
        notice = cut_notice(episode) if self._orders.cut_notice else None
        action = Action.STOPPED if episode.is_stop else Action.CUT
        # With the notice, later requests show the cut was served (and logged) here: the row is this response's.
        # A stop is one row however it was served: the next request, refused, finds the same key.
        self._sink.episode(self.context, episode, action, self.request_id, saved,
                           served_by=assembler.response_id if notice and not episode.is_stop else None)
        ending = assembler.cut_ending({"loop": episode.type, "action": action,
                                       "episode": shown(episode.number, episode.limit, episode.is_stop)}, notice)
        if self._keep is not None:
            message = assembler.message()
            self._keep_answer(Message(message.role, assembler.text + (notice or ""), message.calls),
                              assembler.response_id)
        return ending

    def _stream_end(self) -> None:
        try:
            try:
                message = self._assembler.message()
            except RequestError:  # an answer the rules cannot read (arguments nested past JSON's depth here)
                return
            self._finish(message, self._assembler.response_id)
        finally:
            self._watcher.release()

    def streamed_summary(self, tokens: Callable[[Any], tuple[int | None, int | None]]) -> Summary:
        """What a finished stream said of itself (`tokens`: the dialect's reading of its usage object)."""
        assembler = self._assembler
        return Summary(assembler.response_id, assembler.model, *tokens(assembler.usage))

    def complete(self, answer: object) -> bool:
        """A whole, non-streamed answer. Read only for what it can change: a chant in its reasoning, the answer
        the service keeps, and whether the model moved on from the warning it was given. Whether it kept the
        answer (to be written before the answer goes out)."""
        try:
            self._complete(answer)
        finally:
            self._watcher.release()
        kept, self._kept = self._kept, False
        return kept

    def _complete(self, answer: object) -> None:
        if not isinstance(answer, dict):
            return
        reasoning = self._dialect.reasoning(answer)
        if not reasoning and self._keep is None and self._warned is None:
            return
        try:
            message = self._dialect.answer(answer)
        except RequestError:  # an answer the rules cannot read (arguments nested past JSON's depth here)
            return
        if message is None:
            return
        if reasoning:  # no cut is possible here: the next request is warned (its conversation lacks the reasoning)
            found = self._watcher.reasoning(reasoning)
            if found is not None and self._orders.unseen is not None:
                self._orders.unseen(self._watcher.unseen(found, message))
        if message.text and self._warned is not None:  # an answer that chants has not moved on
            self._watcher.text(message.text)
        self._finish(message, answer.get("id") if isinstance(answer.get("id"), str) else None)

    def _keep_answer(self, message: Message, response_id: str | None) -> None:
        """Keep the answer the service keeps, once; it is written before the bytes that complete it go out."""
        keep, self._keep = self._keep, None
        keep(message, response_id)
        self._kept = True

    def _finish(self, message: Message, response_id: str | None) -> None:
        """The answer is whole. Its own episode, if any, is logged when its warning or stop is served; an
        answer that completes none, given a warning, is the model moving on."""
        if self._keep is not None:
            self._keep_answer(message, response_id)
        if self._warned is not None and self._watcher.episode is None and self._watcher.finish(message) is None \
                and ends_task(message):
            self._sink.recovery(self.context, self._warned)


def _printable(text: str) -> str:
    """An id from a request body as it may stand in a response header: printable ASCII only."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def _with_warnings(messages: list[Message], inserted: list[tuple[int, str, str]]) -> list[Message]:
    """The neutral conversation with the warnings inserted at their places (as the request sent them)."""
    result = list(messages)
    for place, role, text in reversed(sorted(inserted, key=lambda item: item[0])):
        result.insert(place, Message(role, text))
    return result
