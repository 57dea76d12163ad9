"""The guard: between the HTTP handler and the engine. One exchange per inspected request.

On the way up it names the session, asks the engine for a verdict on the
conversation so far, and answers the stop or adds the task's warnings. On the
way down it reads a copy of the upstream's bytes (never re-encoding them),
feeds the engine, and cuts a chanting stream. Everything it learns goes to the
log writer without waiting. The API dialect (Chat Completions, Responses)
translates between its shapes and the one neutral conversation; the guard is
the same for every dialect.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from typing import Callable

import orjson
from aiohttp import web

from proxy.config import Settings
from proxy.detect.engine import (
    Decision,
    DetectConfig,
    Episode,
    FoldCache,
    ResponseWatcher,
    TaskState,
    analyze,
    episodes,
)
from proxy.detect.judge_policy import check_due, judge_window
from proxy.detect.normalize import digest
from proxy.detect.text_steps import task_text
from proxy.detect.texts import cut_notice, stop_text, warning_text
from proxy.judge import JUDGE_HEADER, Judge
from proxy.lru import LRU
from proxy.server.alerts import Alerts
from proxy.server.telemetry import Telemetry
from proxy.server.upstream import anthropic_root, json_error
from proxy.store.store import Chain
from proxy.store.writer import SessionSeen, utcnow
from proxy.wire.chat import Conversation, message_text
from proxy.wire.errors import error_object
from proxy.wire.sse import SSEParser

log = logging.getLogger("loopwarden.guard")

# Read in this order; the README lists them with the agents that send them.
SESSION_HEADERS = ("X-Loopwarden-Session", "X-Session-Id", "X-Claude-Code-Session-Id", "session_id", "session-id",
                   "thread-id", "X-Session-Affinity", "Helicone-Session-Id", "X-Litellm-Session-Id")
CACHED_SESSIONS = 4096
REMEMBERED_EPISODES = 100_000
DEFAULT_COMPLETION_TOKENS = 4096


def client_key(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return (request.headers.get("x-api-key") or request.headers.get("api-key", "")).strip()


@functools.lru_cache(maxsize=4096)
def tenant_of(key: str) -> str:
    """A short, one-way name for a client key: the key itself is never stored or logged."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def session_of(request: web.Request, messages: list[dict], tenant: str, chain: Chain | None = None,
               side: bool = False) -> str:
    """The session's id: a header, else the Responses conversation or the session of the chain the request
    continues, else a fingerprint of the key and how the conversation began. State is kept per (tenant,
    id), never per id alone. Claude Code's subagents and its side requests (`side`: a title asked for with no
    tools) share its session header but are conversations of their own."""
    for header in SESSION_HEADERS:
        value = request.headers.get(header, "").strip()
        if value:
            agent = request.headers.get("x-claude-code-agent-id", "").strip()
            if agent:
                value = f"{value}/agent-{agent}"
            elif side and header == "X-Claude-Code-Session-Id":
                value += "/side"
            return value[:256]
    if chain is not None and chain.conversation_id:
        return _printable(chain.conversation_id)[:256]
    if chain is not None and chain.session_id:
        return chain.session_id
    system = next((message_text(m) for m in messages if m.get("role") in ("system", "developer")), "")
    first_user = task_text(next((message_text(m) for m in messages if m.get("role") == "user"), ""))
    return "fp-" + digest(f"{tenant}\x00{system}\x00{first_user}").hex()[:16]


class Exchange:
    """One chat completion on its way through: what to send, and the tap on what comes back."""

    def __init__(self, body: bytes, response_headers: dict[str, str] | None = None) -> None:
        self.stop: web.Response | None = None
        self.body = body
        self.response_headers: dict[str, str] = response_headers or {}
        self.request_id: str | None = None
        self.after_forward: Callable[[], None] | None = None
        self.on_delivered: Callable[[str | None], None] | None = None  # the model has this request's warnings
        self.persist_pending = False  # an answer the service keeps was recorded: write it before the last byte

    def on_response_headers(self, status: int, headers) -> None:
        """The request has been forwarded and answered: background work may start now."""
        self.request_id = headers.get("x-request-id")
        if status == 200 and self.on_delivered is not None:
            self.on_delivered(self.request_id)
            self.on_delivered = None
        if self.after_forward is not None:
            self.after_forward()
            self.after_forward = None

    def on_stream_bytes(self, chunk: bytes) -> tuple[int, bytes] | None:
        """Read a copy of upstream bytes. When the stream must end here: how much of `chunk` to
        forward (up to the end of the event that completed the loop), and the bytes that end the stream."""
        return None

    def on_stream_end(self) -> None:
        pass

    def on_complete(self, answer: object) -> None:
        pass

    @property
    def keeps_answer(self) -> bool:
        """The service keeps this answer, and a chained request may continue from it."""
        return False

    async def persist(self) -> None:
        """Make what was recorded readable by every replica; the client gets the last byte after this."""
        self.persist_pending = False

    def streamed_answer(self) -> dict | None:
        """What a finished stream said of itself (its id, model and usage), as a JSON answer says it."""
        return None


class WatchedExchange(Exchange):
    """An exchange whose response is watched by the engine."""

    def __init__(self, guard: "Guard", dialect, body: bytes, response_headers: dict[str, str], context: dict,
                 watcher: ResponseWatcher, max_completion: int, warned: Episode | None,
                 on_answer: Callable[[dict, str | None], None] | None = None, *, cut_notice: bool = True,
                 observe: bool = False) -> None:
        super().__init__(body, response_headers)
        self._guard = guard
        self._dialect = dialect
        self._context = context
        self._watcher = watcher
        self._max_completion = max_completion
        self._warned = warned  # the latest warning this request carries: did the model move on from it?
        self._on_answer = on_answer  # the whole answer, for a conversation the service keeps
        self._cut_notice = cut_notice
        self._observe = observe  # find and log a chant, but let the stream run on
        self._parser = SSEParser()
        self._assembler = dialect.stream()

    def on_stream_bytes(self, chunk: bytes) -> tuple[int, bytes] | None:
        event_start = 0 if self._parser.at_boundary else -1  # -1: the first event began in an earlier read
        for event in self._parser.feed(chunk):
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
                text, call_started = self._assembler.add(data, event.event)
            except (TypeError, AttributeError, KeyError, ValueError):
                continue  # an event of a shape its API does not have: passed on as it came, not read
            if text:
                found = self._watcher.text(text)
                if found is not None and not self._observed_only(found):
                    return event.end, self._ending(found)  # the delta that completed the chant is the last
            if call_started:
                found = self._watcher.tool_call_started()
                if found is not None and not self._observed_only(found):
                    # The text before this call chanted: end before the call, unless it began earlier.
                    return (start if start >= 0 else event.end), self._ending(found)
        if self._on_answer is not None and self._assembler.finished:
            # The response is complete: record it now, so it is written before its last event goes out.
            self._keep(self._assembler.message(), self._assembler.response_id)
        return None

    def _observed_only(self, episode: Episode) -> bool:
        """In observe mode a chant is logged where it would have been cut, and the stream goes on."""
        if not self._observe:
            return False
        if episode.number <= episode.limit + 1:  # after the would-be stop, nothing more
            saved = max(0, self._max_completion - len(self._assembler.text) // 4)
            self._guard.log_episode(self._context, episode, "stopped" if episode.is_stop else "cut",
                                    self.request_id, saved)
        return True

    def _ending(self, episode: Episode) -> bytes:
        """Count the episode and build the stream's last bytes: the notice and a clean stop, or the stop's error
        (in a dialect whose clients resume after an error event, the stop ends as a cut does, and the next
        request is refused)."""
        saved = max(0, self._max_completion - len(self._assembler.text) // 4)
        if episode.is_stop and not self._assembler.stop_is_cut:
            self._guard.log_episode(self._context, episode, "stopped", self.request_id, saved)
            return self._assembler.stop_ending(error_object(stop_text(episode), "loop_detected", "loop_detected"))
        notice = cut_notice(episode) if self._cut_notice else None
        action = "stopped" if episode.is_stop else "cut"
        # With the notice, later requests show the cut was served (and logged) here: the row is this response's.
        # A stop is one row however it was served: the next request, refused, finds the same key.
        self._guard.log_episode(self._context, episode, action, self.request_id, saved,
                                served_by=self._assembler.response_id if notice and not episode.is_stop else None)
        ending = self._assembler.cut_ending({"loop": episode.type, "action": action,
                                             "episode": f"{episode.number}/{episode.limit}"}, notice)
        if self._on_answer is not None:
            message = self._assembler.message()
            message["content"] = self._assembler.text + (notice or "")
            self._keep(message, self._assembler.response_id)
        return ending

    def on_stream_end(self) -> None:
        self._finish(self._assembler.message(), self._assembler.response_id)

    def streamed_answer(self) -> dict | None:
        return {"id": self._assembler.response_id, "model": self._assembler.model, "usage": self._assembler.usage}

    def on_complete(self, answer: object) -> None:
        message = self._dialect.answer(answer) if isinstance(answer, dict) else None
        if message is None:
            return
        text = message_text(message)
        if text:
            self._watcher.text(text)
        self._finish(message, answer.get("id") if isinstance(answer.get("id"), str) else None)

    @property
    def keeps_answer(self) -> bool:
        return self._on_answer is not None

    def _keep(self, message: dict, response_id: str | None) -> None:
        """Record the answer the service keeps, once; it is to be written before the client's last byte."""
        on_answer, self._on_answer = self._on_answer, None
        on_answer(message, response_id)
        self.persist_pending = True

    async def persist(self) -> None:
        self.persist_pending = False
        await self._guard.persist()

    def _finish(self, message: dict, response_id: str | None) -> None:
        """The answer is whole. Its own episode, if any, is logged when its warning or stop is served; an
        answer that completes none, given a warning, is the model moving on."""
        if self._on_answer is not None:
            self._keep(message, response_id)
        if self._watcher.episode is None and self._watcher.finish(message) is None \
                and self._warned is not None:
            self._guard.log_recovery(self._context, self._warned)


class Guard:
    """Per-process detection state: the fold caches, and what has been logged."""

    def __init__(self, settings: Settings, store=None, metrics=None) -> None:
        self.settings = settings
        self.alerts = Alerts(settings.webhook_url, settings.webhook_events, settings.public_url, metrics) \
            if settings.webhook_url else None
        self.config = DetectConfig.from_settings(settings)
        self.store = store
        self.metrics = metrics
        self._folds: LRU = LRU(CACHED_SESSIONS)
        self._logged: LRU = LRU(REMEMBERED_EPISODES)
        self._message_counts: LRU = LRU(CACHED_SESSIONS)
        self._per_model: LRU = LRU(256)
        self.judge = Judge(settings.judge_url or settings.upstream_url,
                           settings.judge_api_key or settings.upstream_api_key, settings.judge_timeout,
                           settings.judge_concurrency, anthropic_root(settings.anthropic_upstream_url),
                           settings.judge_api_key or settings.anthropic_upstream_api_key,
                           ) if settings.llm_check and store is not None else None
        self._judging: dict[tuple[str, str], asyncio.Task] = {}

    async def start(self) -> None:
        if self.store is not None:
            await self.store.start()
        if self.alerts is not None:
            await self.alerts.start()

    async def stop(self) -> None:
        for task in list(self._judging.values()):
            task.cancel()
        await asyncio.gather(*self._judging.values(), return_exceptions=True)
        if self.judge is not None:
            await self.judge.close()
        if self.alerts is not None:
            await self.alerts.close(min(self.settings.shutdown_grace, 5.0))
        if self.store is not None:
            await self.store.close(min(self.settings.shutdown_grace, 5.0))

    async def ready(self) -> bool:
        return True if self.store is None else await self.store.ready()

    async def persist(self) -> None:
        if self.store is not None:
            await self.store.persist()

    def known_message_counts(self) -> dict:
        return dict(self._message_counts)

    async def chain(self, request: web.Request, payload: dict) -> Chain | None:
        """For a Responses request that continues a conversation the service keeps: what came before, from
        the responses this proxy has seen (any replica's, through the store). Never fails the request."""
        previous = payload.get("previous_response_id")
        conversation = payload.get("conversation")
        if isinstance(conversation, dict):
            conversation = conversation.get("id")
        previous = previous if isinstance(previous, str) and previous else None
        conversation = conversation if isinstance(conversation, str) and conversation else None
        if self.store is None or (previous is None and conversation is None) or request.headers.get(JUDGE_HEADER):
            return None
        return await self.store.chain(tenant_of(client_key(request)), previous, conversation)

    def begin(self, request: web.Request, raw: bytes, payload: dict, dialect, chain: Chain | None = None,
              span=None) -> Exchange:
        if request.headers.get(JUDGE_HEADER):
            return Exchange(raw)  # the judge's own request: not a session's turn
        conversation: Conversation = dialect.read(payload, chain.messages if chain is not None else None)
        messages = conversation.messages
        tenant = tenant_of(client_key(request))
        side = dialect.name == "messages" and not payload.get("tools")
        session_id = session_of(request, messages, tenant, chain, side)
        headers = {"X-Loopwarden-Session": session_id}
        model = payload.get("model") if isinstance(payload.get("model"), str) else None
        key = (tenant, session_id)
        self._message_counts.put(key, len(messages))
        if self.store is not None:
            self.store.session_seen(SessionSeen(tenant, session_id, len(messages), model))
        controls = self.store.controls(tenant, session_id) if self.store is not None else None
        if request.headers.get("X-Loopwarden-Disable", "").strip() in ("1", "true", "yes") or (
                controls is not None and controls.disabled):
            return Exchange(raw, headers)
        modes = {mode.strip().lower() for mode in request.headers.get("X-Loopwarden-Mode", "").split(",")}
        plan_mode = "plan" in modes
        settings, config = self._settings_for(model)
        observe = "observe" in modes or settings.mode == "observe"

        state, cache = analyze(config, messages, controls.reset_at_message if controls else 0, self._folds.get(key))
        self._folds.put(key, cache)
        checks = self.store.judge_checks(tenant, session_id, state.key) if self.store is not None else []
        decision = Decision(episodes(config, state, plan_mode=plan_mode, judge_checks=checks))
        context = {"tenant": tenant, "session_id": session_id, "task": state.key, "model": model,
                   "api": dialect.name, "enforced": not observe, "span": span}

        stop = decision.stop
        if stop is not None:
            # A stop saves at least the request it refused (or, observed, would have refused).
            self.log_episode(context, stop, "stopped", None, len(raw) // 4)
            if not observe:
                exchange = Exchange(raw, headers)
                exchange.stop = json_error(400, stop_text(stop), "loop_detected", "loop_detected",
                                           headers={**headers, "X-Loopwarden-Loop": stop.type,
                                                    "x-should-retry": "false"}, shape=dialect.error_body)
                return exchange

        body = raw
        warnings = decision.warnings
        # A warning is re-created at its place in every request; where the service keeps the conversation
        # (a chained Responses request), the ones already sent are in it, and only new ones are added.
        # Observe mode adds none: the request goes on as the client sent it.
        inserted = [] if observe else [(e.place, settings.warning_role, warning_text(e)) for e in warnings
                                       if e.place >= conversation.own_start]
        if inserted:
            body = orjson.dumps(dialect.with_messages(payload, conversation, [
                (place, dialect.warning_message(role, text)) for place, role, text in inserted]))
        if observe and (stop is not None or warnings):
            headers["X-Loopwarden-Observed"] = f"stop {stop.type}" if stop is not None else \
                f"{warnings[-1].number}/{warnings[-1].limit} {warnings[-1].type}"
        elif warnings:
            headers["X-Loopwarden-Warning"] = f"{warnings[-1].number}/{warnings[-1].limit} {warnings[-1].type}"
        watcher = ResponseWatcher(config, _detached(state, cache), decision, len(messages), plan_mode)
        on_answer = None
        if dialect.name == "responses" and payload.get("store") is not False and self.store is not None:
            # The service keeps this response: remember the conversation as sent, for requests that continue it.
            sent = _with_neutral(messages, inserted)[conversation.own_start:]
            conversation_id = chain.conversation_id if chain is not None else _conversation_id(payload)
            previous = chain.last_id if chain is not None else None
            on_answer = lambda answer, response_id: self.store.record_response(  # noqa: E731
                tenant, response_id, previous, conversation_id, session_id, sent + [answer])
        # Recovery is measured only on warnings the model was given.
        warned = warnings[-1] if warnings and not observe else None
        exchange = WatchedExchange(self, dialect, body, headers, context, watcher, _max_completion(payload), warned,
                                   on_answer, cut_notice=settings.cut_notice, observe=observe)
        if warnings and stop is None:  # after an observed would-be stop, the task logs nothing more
            exchange.on_delivered = lambda request_id: self._log_warnings(context, warnings, request_id)
        if self.judge is not None and settings.llm_check and key not in self._judging and model and \
                check_due(state.turns, settings.llm_check_after_turns, checks):
            exchange.after_forward = lambda: self._start_judge(key, context, state, messages, client_key(request))
        return exchange

    def _settings_for(self, model: str | None) -> tuple[Settings, DetectConfig]:
        """The settings and detection config in force for a model (its policy over the settings)."""
        found = self._per_model.get(model)
        if found is None:
            settings = self.settings.for_model(model)
            config = self.config if settings is self.settings else DetectConfig.from_settings(settings)
            found = (settings, config)
            self._per_model.put(model, found)
        return found

    def _start_judge(self, key: tuple[str, str], context: dict, state: TaskState, messages: list[dict],
                     key_of_client: str) -> None:
        if key in self._judging:
            return
        request, window = judge_window(messages, state.start)
        model = self.settings.judge_model or context["model"]
        task = asyncio.get_running_loop().create_task(
            self._judge_task(key, context, state.key, state.turns, model, key_of_client, request, window))
        self._judging[key] = task

    async def _judge_task(self, key, context, task_key, turn, model, key_of_client, request, window) -> None:
        try:
            # A Messages session is judged in its own dialect by its own upstream, unless JUDGE_URL names one.
            messages_api = context["api"] == "messages" and self.settings.judge_url is None
            check, tokens = await self.judge.check(task_key, turn, model, self.settings.judge_confirm_model,
                                                   key_of_client, request, window, messages_api)
            self.store.record_judge_check(context["tenant"], context["session_id"], check, model, tokens)
            if self.metrics is not None:
                outcome = "none" if check.confidence is None else \
                    "loop" if check.is_loop(self.config.judge_confirm) else "progress"
                self.metrics.judge_checks.labels(outcome).inc()
                self.metrics.judge_tokens.inc(tokens)
        finally:
            self._judging.pop(key, None)

    def _log_warnings(self, context: dict, warnings: list[Episode], request_id: str | None) -> None:
        """The warnings reached the model: each is logged once, when a request first carries it. A chant the
        proxy cut was logged as the cut."""
        for episode in warnings:
            if not episode.was_cut:
                self.log_episode(context, episode, "warned", request_id, 0)

    def log_recovery(self, context: dict, episode: Episode) -> None:
        """The model answered a request carrying this warning without completing another episode."""
        key = "recovered:" + self._episode_key(context, episode)
        if key in self._logged:
            return
        self._logged.put(key, True)
        if self.store is not None:
            self.store.writer.add_recovery({"b_tenant": context["tenant"], "b_session_id": context["session_id"],
                                            "b_task": context["task"], "b_episode": episode.number})

    @staticmethod
    def _episode_key(context: dict, episode: Episode, served_by: str | None = None) -> str:
        return digest(f"{context['tenant']}\x00{context['session_id']}\x00{context['task']}\x00"
                      f"{episode.message_index}\x00{episode.step}\x00{served_by or ''}").hex()

    def log_episode(self, context: dict, episode: Episode, action: str, request_id: str | None,
                    tokens_saved: int, served_by: str | None = None) -> None:
        """One record per episode served. The key is the episode's place in this run of the task (a resent
        request finds the same key; a rerun has other call ids, so another task); a cut also names the
        response it cut, as a text-only rerun can repeat the same conversation word for word."""
        key = self._episode_key(context, episode, served_by)
        if key in self._logged:
            return
        self._logged.put(key, True)
        enforced = context.get("enforced", True)
        log.info("loop %s%s in session %s: %s episode %d/%d", action, "" if enforced else " (observed)",
                 context["session_id"], episode.type, episode.number, episode.limit)
        if self.metrics is not None:
            self.metrics.detections.labels(episode.type, action, "enforce" if enforced else "observe").inc()
        record = {
            "created_at": utcnow(), "session_id": context["session_id"], "tenant": context["tenant"],
            "task": context["task"], "model": context["model"], "type": episode.type, "action": action,
            "episode": episode.number, "episode_limit": episode.limit, "turn": episode.turn,
            "detail": {**episode.detail, "api": context["api"]}, "request_id": request_id,
            "tokens_saved_estimate": tokens_saved, "enforced": enforced,
            "episode_key": key,
        }
        if self.alerts is not None:
            self.alerts.episode(record)
        if context.get("span") is not None:
            Telemetry.episode(context["span"], record)
        if self.store is not None:
            self.store.writer.add_detection(record)


def _printable(text: str) -> str:
    """An id from a request body as it may stand in a response header: printable ASCII only."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def _max_completion(payload: dict) -> int:
    value = payload.get("max_completion_tokens") or payload.get("max_tokens") or payload.get("max_output_tokens")
    return value if isinstance(value, int) else DEFAULT_COMPLETION_TOKENS


def _with_neutral(messages: list[dict], inserted: list[tuple[int, str, str]]) -> list[dict]:
    """The neutral conversation with the warnings inserted at their places (as the request sent them)."""
    result = list(messages)
    for place, role, text in reversed(sorted(inserted, key=lambda item: item[0])):
        result.insert(place, {"role": role, "content": text})
    return result


def _conversation_id(payload: dict) -> str | None:
    conversation = payload.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    return conversation if isinstance(conversation, str) and conversation else None


def _detached(state: TaskState, cache: FoldCache) -> TaskState:
    """The response is folded on a copy: the cached state belongs to the next request."""
    return state.clone() if state is cache.state else state
