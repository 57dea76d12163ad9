"""loopwarden as a guardrail of LiteLLM's proxy: the same inspection step as loopwarden's own proxy, called from
LiteLLM's hooks.

    guardrails:
      - guardrail_name: loopwarden
        litellm_params:
          guardrail: proxy.integrations.litellm.LoopwardenGuardrail
          mode: [pre_call, post_call]
          default_on: true

The settings are loopwarden's environment variables (LOOPWARDEN_*). Before the call, the request is inspected
(`Inspector.inspect`, through the `Guard` the proxy builds): a stop is LiteLLM's error answer, warnings go into
the messages LiteLLM sends upstream. The verdict's tap then reads the answer: whole (the post-call hook) or as it
streams (the streaming iterator hook), where a chant ends the stream. Episodes go to the proxy's episode log.
Chat completions only: other APIs go through untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Iterator, Mapping

import orjson
from multidict import CIMultiDict

from litellm.integrations.custom_guardrail import CustomGuardrail
from litellm.proxy._types import ProxyException
from litellm.types.utils import ModelResponseStream

from proxy.config import build
from proxy.conversation import RequestError
from proxy.inspection import Incoming, Stop, Tap, tenant_of
from proxy.lru import LRU
from proxy.server.addons import Addons, Exchange
from proxy.server.guard import Guard
from proxy.store.store import Store
from proxy.wire import OPENAI
from proxy.wire.dialect import sse
from proxy.wire.sse import SSEParser

log = logging.getLogger("loopwarden.litellm")

CHAT_CALLS = frozenset({"completion", "acompletion"})
CHAT_PATH = "/v1/chat/completions"
# What of LiteLLM's request data is the chat request itself (the rest is LiteLLM's own: metadata, its key).
CHAT_FIELDS = ("model", "messages", "tools", "tool_choice", "functions", "stream", "max_tokens",
               "max_completion_tokens", "n")
PENDING_CALLS = 4096  # answers awaited (one per call in flight); the oldest forgotten past it


class LoopwardenGuardrail(CustomGuardrail):
    """Loop detection in LiteLLM's proxy, by loopwarden's inspection step."""

    use_native_lifecycle_hooks = True  # the hooks below, not LiteLLM's unified text-only path

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = build()
        settings = self.settings
        store = Store(settings.database_url, settings.log_buffer_size,
                      response_retention_days=settings.response_retention_days,
                      detection_retention_days=settings.detection_retention_days,
                      resume_link_ttl_hours=settings.resume_link_ttl)
        self.guard = Guard(settings, store)
        self.addons = Addons([self.guard.episodes])
        self._taps: LRU = LRU(PENDING_CALLS)  # LiteLLM's call id -> the verdict's tap
        self._started: asyncio.Future | None = None

    async def _ready(self) -> None:
        """The log's schema brought up to date and its writer started, once (on LiteLLM's loop, at the first
        request). A database that fails is logged and the requests go on."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        from proxy.store.database import run_migrations

        try:
            await asyncio.to_thread(run_migrations, self.settings.database_url)
        except Exception as exc:
            log.warning("loopwarden's log cannot be migrated, detecting anyway: %s", str(exc).splitlines()[0])
        await self.guard.start()

    async def async_pre_call_hook(self, user_api_key_dict, cache, data: dict, call_type: str) -> dict:
        if call_type not in CHAT_CALLS or not isinstance(data.get("messages"), list):
            return data
        await self._ready()
        headers = request_headers(data)
        payload = {name: data[name] for name in CHAT_FIELDS if name in data}
        try:
            raw = orjson.dumps(payload)
        except TypeError:  # an object LiteLLM's SDK took that JSON cannot hold: not a request loopwarden reads
            return data
        exchange = Exchange(headers, OPENAI, CHAT_PATH, time.perf_counter(), payload, raw)
        try:
            verdict = self.guard.inspector.inspect(
                Incoming(headers, raw, payload, OPENAI, path=CHAT_PATH, origin=self.settings.public_url or "",
                         tenant=tenant(user_api_key_dict)),
                self.addons.sink(exchange))
        except RequestError:
            return data  # LiteLLM answers a request it cannot take itself
        if isinstance(verdict, Stop):
            error = orjson.loads(verdict.body)["error"]
            raise ProxyException(message=error["message"], type="loop_detected", param=None, code=verdict.status,
                                 headers=verdict.headers, openai_code="loop_detected")
        if verdict.body is not raw:  # warnings added: the messages as the proxy would send them
            data["messages"] = orjson.loads(verdict.body)["messages"]
        call_id = data.get("litellm_call_id")
        tap = verdict.tap
        if tap is not None and call_id:
            self._taps.put(call_id, tap)
        return data

    def _tap(self, data: Mapping[str, Any]) -> Tap | None:
        call_id = data.get("litellm_call_id") if isinstance(data, Mapping) else None
        return self._taps.pop(call_id, None) if call_id else None

    async def async_post_call_failure_hook(self, request_data: dict, original_exception: Exception,
                                           user_api_key_dict, traceback_str: str | None = None) -> None:
        """The call failed (after LiteLLM's retries and fallbacks): no answer to read, and, as in the proxy, the
        warnings it carried were not delivered."""
        self._tap(request_data)

    async def async_post_call_success_hook(self, data: dict, user_api_key_dict, response: Any) -> Any:
        """A whole answer: read for what it can change (the model moving on from a warning, a chant in its
        reasoning), after it is on its way (as the proxy reads it)."""
        tap = self._tap(data)
        if tap is None:
            return response
        try:
            answer = response.model_dump(exclude_none=True)
        except AttributeError:
            return response
        tap.delivered(200, answer.get("id"))
        asyncio.get_running_loop().call_soon(tap.complete, answer)
        return response

    async def async_post_call_streaming_iterator_hook(self, user_api_key_dict, response: Any, request_data: dict
                                                      ) -> AsyncIterator[Any]:
        """The streamed answer, chunk by chunk, read by the tap: a chant ends the stream there (the cut's last
        chunks, then no more reading upstream); a stop reached mid-stream ends it with LiteLLM's error."""
        tap = self._tap(request_data)
        if tap is None:
            async for chunk in response:
                yield chunk
            return
        delivered = False
        async for chunk in response:
            event = chunk_event(chunk)
            if event is None:
                yield chunk
                continue
            if not delivered:
                tap.delivered(200, None)
                delivered = True
            passing = tap.pass_on(event)
            if not passing.last:
                yield chunk
                continue
            # The stream ends here: the upstream's is read no further.
            close = getattr(response, "aclose", None)
            if close is not None:
                await close()
            # Each chunk is one whole event: the cut ends after it, or before it (a call begun after a chant).
            if passing.data.startswith(event):
                yield chunk
            for last in ending(passing.data[len(event):] if passing.data.startswith(event) else passing.data):
                yield last
            return
        tap.ended()


def ending(tail: bytes) -> Iterator[Any]:
    """The tap's ending of a stream as LiteLLM's chunks: the notice and a clean stop, or the stop's error raised
    (LiteLLM ends the stream with it)."""
    for event in SSEParser().feed(tail):
        if event.data == b"[DONE]":
            continue
        data = orjson.loads(event.data)
        if "error" in data:
            error = data["error"]
            raise ProxyException(message=error["message"], type="loop_detected", param=None, code=400,
                                 headers={"x-should-retry": "false"}, openai_code="loop_detected")
        yield ModelResponseStream(**{k: v for k, v in data.items() if k != "loopwarden"})


def chunk_event(chunk: Any) -> bytes | None:
    """A streamed chunk as the server-sent event the proxy's tap reads."""
    try:
        data = chunk.model_dump(exclude_none=True)
    except AttributeError:
        return None
    return sse(data)


def tenant(user_api_key_dict: Any) -> str | None:
    """Whose the request is: LiteLLM's key. LiteLLM holds it as its SHA-256, whose beginning is the tenant the
    proxy names for the same key (`tenant_of`); None (the fingerprint of no key) without one."""
    hashed = getattr(user_api_key_dict, "api_key", None) or getattr(user_api_key_dict, "token", None)
    if not isinstance(hashed, str) or not hashed:
        return None
    return hashed[:16] if len(hashed) == 64 and all(c in "0123456789abcdef" for c in hashed) else tenant_of(hashed)


def request_headers(data: Mapping[str, Any]) -> CIMultiDict:
    """The headers the inspection step names a session by and reads the agent from: those the client sent
    (LiteLLM keeps them without its credentials)."""
    server_request = data.get("proxy_server_request") or {}
    sent = server_request.get("headers") if isinstance(server_request, Mapping) else None
    headers = CIMultiDict(sent if isinstance(sent, Mapping) else {})
    for credential in ("Authorization", "x-api-key", "api-key", "x-goog-api-key"):
        headers.popall(credential, None)
    return headers
