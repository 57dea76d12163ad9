"""The guard: between the HTTP handler and the engine. One exchange per chat completion.

On the way up it names the session, asks the engine for a verdict on the
conversation so far, and answers the stop or adds the task's warnings. On the
way down it reads a copy of the upstream's bytes (never re-encoding them),
feeds the engine, and cuts a chanting stream. Everything it learns goes to the
log writer without waiting.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections import OrderedDict
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
from proxy.server.upstream import json_error
from proxy.store.writer import SessionSeen, utcnow
from proxy.wire.chat import ChatStreamAssembler, message_text, response_message
from proxy.wire.errors import sse_error_event
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
    return request.headers.get("api-key", "").strip()


@functools.lru_cache(maxsize=4096)
def tenant_of(key: str) -> str:
    """A short, one-way name for a client key: the key itself is never stored or logged."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def session_of(request: web.Request, messages: list[dict], tenant: str) -> str:
    """The session's id: a header, else a fingerprint of the key and how the conversation began.
    State is kept per (tenant, id), never per id alone."""
    for header in SESSION_HEADERS:
        value = request.headers.get(header, "").strip()
        if value:
            return value[:256]
    system = next((message_text(m) for m in messages if m.get("role") in ("system", "developer")), "")
    first_user = task_text(next((message_text(m) for m in messages if m.get("role") == "user"), ""))
    return "fp-" + digest(f"{tenant}\x00{system}\x00{first_user}").hex()[:16]


class _LRU(OrderedDict):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)


class Exchange:
    """One chat completion on its way through: what to send, and the tap on what comes back."""

    def __init__(self, body: bytes, response_headers: dict[str, str] | None = None) -> None:
        self.stop: web.Response | None = None
        self.body = body
        self.response_headers: dict[str, str] = response_headers or {}
        self.request_id: str | None = None
        self.after_forward: Callable[[], None] | None = None
        self.on_delivered: Callable[[str | None], None] | None = None  # the model has this request's warnings

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


class WatchedExchange(Exchange):
    """An exchange whose response is watched by the engine."""

    def __init__(self, guard: "Guard", body: bytes, response_headers: dict[str, str], context: dict,
                 watcher: ResponseWatcher, max_completion: int, warned: Episode | None) -> None:
        super().__init__(body, response_headers)
        self._guard = guard
        self._context = context
        self._watcher = watcher
        self._max_completion = max_completion
        self._warned = warned  # the latest warning this request carries: did the model move on from it?
        self._parser = SSEParser()
        self._assembler = ChatStreamAssembler()

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
            text, call_started = self._assembler.add(data)
            if text:
                found = self._watcher.text(text)
                if found is not None:
                    return event.end, self._ending(found)  # the delta that completed the chant is the last
            if call_started:
                found = self._watcher.tool_call_started()
                if found is not None:
                    # The text before this call chanted: end before the call, unless it began earlier.
                    return (start if start >= 0 else event.end), self._ending(found)
        return None

    def _ending(self, episode: Episode) -> bytes:
        """Count the episode and build the stream's last bytes: the notice and a clean stop, or the stop's error."""
        saved = max(0, self._max_completion - len(self._assembler.text) // 4)
        if episode.is_stop:
            self._guard.log_episode(self._context, episode, "stopped", self.request_id, saved)
            return sse_error_event(stop_text(episode), "loop_detected", "loop_detected")
        notice = self._guard.settings.cut_notice
        # With the notice, later requests show the cut was served (and logged) here: the row is this response's.
        self._guard.log_episode(self._context, episode, "cut", self.request_id, saved,
                                served_by=self._assembler.response_id if notice else None)
        head = {"id": self._assembler.response_id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self._assembler.model}
        ending = b""
        if notice:
            ending = b"data: " + orjson.dumps({**head, "choices": [
                {"index": 0, "delta": {"content": cut_notice(episode)}, "logprobs": None,
                 "finish_reason": None}]}) + b"\n\n"
        final = {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                 "loopwarden": {"loop": episode.type, "action": "cut",
                                "episode": f"{episode.number}/{episode.limit}"}}
        return ending + b"data: " + orjson.dumps(final) + b"\n\ndata: [DONE]\n\n"

    def on_stream_end(self) -> None:
        self._finish(self._assembler.message())

    def on_complete(self, answer: object) -> None:
        message = response_message(answer) if isinstance(answer, dict) else None
        if message is None:
            return
        text = message_text(message)
        if text:
            self._watcher.text(text)
        self._finish(message)

    def _finish(self, message: dict) -> None:
        """The answer is whole. Its own episode, if any, is logged when its warning or stop is served; an
        answer that completes none, given a warning, is the model moving on."""
        if self._watcher.episode is None and self._watcher.finish(message) is None \
                and self._warned is not None:
            self._guard.log_recovery(self._context, self._warned)


class Guard:
    """Per-process detection state: the fold caches, and what has been logged."""

    def __init__(self, settings: Settings, store=None, metrics=None) -> None:
        self.settings = settings
        self.config = DetectConfig.from_settings(settings)
        self.store = store
        self.metrics = metrics
        self._folds: _LRU = _LRU(CACHED_SESSIONS)
        self._logged: _LRU = _LRU(REMEMBERED_EPISODES)
        self._message_counts: _LRU = _LRU(CACHED_SESSIONS)
        self.judge = Judge(settings.judge_url or settings.upstream_url,
                           settings.judge_api_key or settings.upstream_api_key, settings.judge_timeout,
                           settings.judge_concurrency) if settings.llm_check and store is not None else None
        self._judging: dict[tuple[str, str], asyncio.Task] = {}

    async def start(self) -> None:
        if self.store is not None:
            await self.store.start()

    async def stop(self) -> None:
        for task in list(self._judging.values()):
            task.cancel()
        await asyncio.gather(*self._judging.values(), return_exceptions=True)
        if self.judge is not None:
            await self.judge.close()
        if self.store is not None:
            await self.store.close(min(self.settings.shutdown_grace, 5.0))

    async def ready(self) -> bool:
        return True if self.store is None else await self.store.ready()

    def known_message_counts(self) -> dict:
        return dict(self._message_counts)

    def begin(self, request: web.Request, raw: bytes, payload: dict) -> Exchange:
        if request.headers.get(JUDGE_HEADER):
            return Exchange(raw)  # the judge's own request: not a session's turn
        messages = payload.get("messages")
        messages = messages if isinstance(messages, list) else []
        tenant = tenant_of(client_key(request))
        session_id = session_of(request, messages, tenant)
        headers = {"X-Loopwarden-Session": session_id}
        model = payload.get("model") if isinstance(payload.get("model"), str) else None
        key = (tenant, session_id)
        self._message_counts.put(key, len(messages))
        if self.store is not None:
            self.store.writer.session_seen(SessionSeen(tenant, session_id, len(messages), model))
        controls = self.store.controls(tenant, session_id) if self.store is not None else None
        if request.headers.get("X-Loopwarden-Disable", "").strip() in ("1", "true", "yes") or (
                controls is not None and controls.disabled):
            return Exchange(raw, headers)
        plan_mode = request.headers.get("X-Loopwarden-Mode", "").strip().lower() == "plan"

        state, cache = analyze(self.config, messages, controls.reset_at_message if controls else 0,
                               self._folds.get(key))
        self._folds.put(key, cache)
        checks = self.store.judge_checks(tenant, session_id, state.key) if self.store is not None else []
        decision = Decision(episodes(self.config, state, plan_mode=plan_mode, judge_checks=checks))
        context = {"tenant": tenant, "session_id": session_id, "task": state.key, "model": model}

        stop = decision.stop
        if stop is not None:
            # A stop saves at least the request it refused.
            self.log_episode(context, stop, "stopped", None, len(raw) // 4)
            exchange = Exchange(raw, headers)
            exchange.stop = json_error(400, stop_text(stop), "loop_detected", "loop_detected",
                                       headers={**headers, "X-Loopwarden-Loop": stop.type,
                                                "x-should-retry": "false"})
            return exchange

        body = raw
        if decision.warnings:
            body = orjson.dumps({**payload, "messages": self._with_warnings(messages, decision.warnings)})
            latest = decision.warnings[-1]
            headers["X-Loopwarden-Warning"] = f"{latest.number}/{latest.limit} {latest.type}"
        watcher = ResponseWatcher(self.config, _detached(state, cache), decision, len(messages), plan_mode)
        max_completion = payload.get("max_completion_tokens") or payload.get("max_tokens")
        max_completion = max_completion if isinstance(max_completion, int) else DEFAULT_COMPLETION_TOKENS
        warnings = decision.warnings
        exchange = WatchedExchange(self, body, headers, context, watcher, max_completion,
                                   warnings[-1] if warnings else None)
        if warnings:
            exchange.on_delivered = lambda request_id: self._log_warnings(context, warnings, request_id)
        if self.judge is not None and key not in self._judging and model and \
                check_due(state.turns, self.settings.llm_check_after_turns, checks):
            exchange.after_forward = lambda: self._start_judge(key, context, state, messages, client_key(request))
        return exchange

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
            check, tokens = await self.judge.check(task_key, turn, model, self.settings.judge_confirm_model,
                                                   key_of_client, request, window)
            self.store.record_judge_check(context["tenant"], context["session_id"], check, model, tokens)
            if self.metrics is not None:
                outcome = "none" if check.confidence is None else \
                    "loop" if check.is_loop(self.config.judge_confirm) else "progress"
                self.metrics.judge_checks.labels(outcome).inc()
                self.metrics.judge_tokens.inc(tokens)
        finally:
            self._judging.pop(key, None)

    def _with_warnings(self, messages: list[dict], warnings: list[Episode]) -> list[dict]:
        result = list(messages)
        # From the last place back, so earlier places stay put; at one place, in episode order.
        for episode in sorted(warnings, key=lambda e: (e.place, e.number), reverse=True):
            result.insert(episode.place, {"role": self.settings.warning_role, "content": warning_text(episode)})
        return result

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
        log.info("loop %s in session %s: %s episode %d/%d", action, context["session_id"], episode.type,
                 episode.number, episode.limit)
        if self.metrics is not None:
            self.metrics.detections.labels(episode.type, action).inc()
        if self.store is None:
            return
        self.store.writer.add_detection({
            "created_at": utcnow(), "session_id": context["session_id"], "tenant": context["tenant"],
            "task": context["task"], "model": context["model"], "type": episode.type, "action": action,
            "episode": episode.number, "episode_limit": episode.limit, "turn": episode.turn,
            "detail": episode.detail, "request_id": request_id, "tokens_saved_estimate": tokens_saved,
            "episode_key": key,
        })


def _detached(state: TaskState, cache: FoldCache) -> TaskState:
    """The response is folded on a copy: the cached state belongs to the next request."""
    return state.clone() if state is cache.state else state
