"""The judge: a model asked, in the background, whether a task has stopped making progress.

Never on a request's path: a check starts after the request that made it due
has been forwarded, and its verdict counts from the session's next request.
One check in flight per session, a limit across sessions, a timeout, and any
failure is simply "no verdict".
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from dataclasses import dataclass
from typing import NamedTuple

from urllib.parse import quote

import aiohttp
import anthropic
import openai
import orjson

from proxy.conversation import TOOL, Message
from proxy.detect.judge_policy import LOOP_CONFIDENCE, JudgeCheck

log = logging.getLogger("loopwarden.judge")

JUDGE_HEADER = "X-Loopwarden-Judge"  # the judge's own requests: never inspected, never a session's turn
# Its value: drawn per process, so no client can pass its own requests off as the judge's (and skip inspection).
JUDGE_TOKEN = secrets.token_urlsafe(24)
PROMPT_VERSION = "2026-11-1"
SYSTEM_PROMPT = f"""You review the work of an autonomous AI agent (prompt version {PROMPT_VERSION}).
You are shown the task the user gave it and the latest messages of its work: its replies, the tool
calls it made and what the tools answered. Decide whether the agent has stopped making progress.

An agent is NOT making progress when it keeps doing the same thing and gets the same outcome: it
restates the same plan without acting on it, makes an edit and then undoes it, debugs the same error
with cosmetic changes that cannot fix it, re-reads what it already read without using it, or repeats
a failing command hoping for another result.

An agent IS making progress when its work moves forward even if it looks repetitive: batch work over
different files or items, edits to different places of the same file, re-running a build or the
tests after a change, retrying with new arguments, or polling something whose answer changes.

Answer with a JSON object and nothing else:
{{"analysis": "<one or two sentences on what the agent is doing and why it is or is not progress>",
  "confidence": <a number from 0 to 1: how sure you are that the agent has stopped making progress>}}"""

_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "loop_verdict",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"analysis": {"type": "string"}, "confidence": {"type": "number"}},
            "required": ["analysis", "confidence"],
            "additionalProperties": False,
        },
    },
}
_FORMATS = (_SCHEMA, {"type": "json_object"}, None)  # tried in turn on backends that refuse one
_OBJECT = re.compile(r"\{.*\}", re.DOTALL)
_MESSAGE_CHARS = 1500
MAX_CLIENTS = 64


@dataclass(frozen=True)
class Answer:
    confidence: float | None
    analysis: str
    tokens: int


def render(request: str, window: list[Message]) -> str:
    """What the judge reads: the original request, then each message, tool calls spelled out."""
    lines = [f"The user's request:\n{request or '(not in view)'}", "", "The agent's latest messages:"]
    for message in window:
        role = message.role or "?"
        text = message.text
        if len(text) > _MESSAGE_CHARS:
            text = text[:_MESSAGE_CHARS] + " …(cut)"
        if role == TOOL:
            lines.append(f"[tool result] {text}")
            continue
        if text:
            lines.append(f"[{role}] {text}")
        for call in message.calls:
            lines.append(f"[{role} calls] {call.name}({str(call.arguments)[:300]})")
    return "\n".join(lines)


def parse_answer(text: str | None) -> tuple[float | None, str]:
    """A confidence in 0..1 and the analysis, from JSON or from text that holds a JSON object."""
    if not text:
        return None, ""
    for candidate in (text, *(_OBJECT.findall(text)[:1])):
        try:
            data = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        if isinstance(data, dict):
            confidence = data.get("confidence")
            if isinstance(confidence, (int, float)) and not isinstance(confidence, bool) and 0 <= confidence <= 1:
                return float(confidence), str(data.get("analysis", ""))[:2000]
            return None, ""
    return None, ""


ANTHROPIC, GEMINI = "anthropic", "gcp.gemini"  # the providers judged in their own dialect


class Endpoint(NamedTuple):
    """Where the judge asks, and the key it asks with (None: the client's own)."""

    url: str | None
    api_key: str | None = None


class Question(NamedTuple):
    """What the judge is asked of a session's task at one of its turns: the person's request and the window of
    the conversation it reads, asked with the client's key (where the judge has none of its own)."""

    task: str
    turn: int
    client_key: str
    request: str
    window: list[Message]


class Judge:
    """Asks over Chat Completions (`chat`), or, for a session whose provider is Anthropic or Gemini (and no
    JUDGE_URL), that provider's upstream in its own dialect (`anthropic`, `gemini`)."""

    def __init__(self, chat: Endpoint, timeout: float, concurrency: int, anthropic: Endpoint = Endpoint(None),
                 gemini: Endpoint = Endpoint(None)) -> None:
        self.base_url, self.api_key = chat
        self.anthropic_url, self.anthropic_api_key = anthropic
        self.gemini_url, self.gemini_api_key = gemini
        self._gemini_http: aiohttp.ClientSession | None = None
        self.timeout = timeout
        self._limit = asyncio.Semaphore(concurrency)
        self._clients: dict[tuple[bool, str], openai.AsyncOpenAI | anthropic.AsyncAnthropic] = {}
        self._closing: set[asyncio.Task] = set()
        self._formats: dict[str, int] = {}  # per model: the first response format it accepted

    def _client(self, key: str, messages_api: bool) -> openai.AsyncOpenAI | anthropic.AsyncAnthropic:
        """One client (and connection pool) per key and dialect in use, the least recently used closed past a
        bound."""
        client = self._clients.pop((messages_api, key), None)
        if client is None and messages_api:
            client = anthropic.AsyncAnthropic(base_url=self.anthropic_url, api_key=key or "none", max_retries=0,
                                              timeout=self.timeout, default_headers={JUDGE_HEADER: JUDGE_TOKEN})
        elif client is None:
            client = openai.AsyncOpenAI(base_url=self.base_url, api_key=key or "none", max_retries=0,
                                        timeout=self.timeout, default_headers={JUDGE_HEADER: JUDGE_TOKEN})
        self._clients[(messages_api, key)] = client  # most recent last
        if len(self._clients) > MAX_CLIENTS:
            oldest = next(iter(self._clients))
            task = asyncio.get_running_loop().create_task(self._clients.pop(oldest).close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return client

    async def close(self) -> None:
        await asyncio.gather(*self._closing, return_exceptions=True)
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        if self._gemini_http is not None:
            await self._gemini_http.close()

    async def ask(self, model: str, client_key: str, request: str, window: list[Message],
                  provider: str = "openai") -> Answer:
        """One model's answer; never raises (a failure is an answer without confidence)."""
        shown = render(request, window)
        async with self._limit:
            try:
                async with asyncio.timeout(self.timeout):
                    if provider == GEMINI:
                        return await self._ask_gemini(self.gemini_api_key or client_key, model, shown)
                    messages_api = provider == ANTHROPIC
                    client = self._client((self.anthropic_api_key if messages_api else self.api_key) or client_key,
                                          messages_api)
                    if messages_api:
                        return await self._ask_messages(client, model, shown)
                    return await self._ask(client, model, [{"role": "system", "content": SYSTEM_PROMPT},
                                                           {"role": "user", "content": shown}])
            except Exception as exc:  # timeouts, HTTP errors, refusals: no verdict
                log.info("judge %s gave no verdict: %s", model, str(exc).splitlines()[0] if str(exc) else
                         type(exc).__name__)
                return Answer(None, "", 0)

    async def _ask(self, client: openai.AsyncOpenAI, model: str, messages: list[dict]) -> Answer:
        start = self._formats.get(model, 0)
        for index in range(start, len(_FORMATS)):
            extra = {"response_format": _FORMATS[index]} if _FORMATS[index] else {}
            try:
                completion = await client.chat.completions.create(model=model, messages=messages, temperature=0,
                                                                  **extra)
            except openai.BadRequestError:
                if index + 1 < len(_FORMATS):
                    continue  # this backend does not take that response format: try the next
                raise
            self._formats[model] = index
            text = completion.choices[0].message.content if completion.choices else None
            confidence, analysis = parse_answer(text)
            tokens = completion.usage.total_tokens if completion.usage else 0
            return Answer(confidence, analysis, tokens)
        return Answer(None, "", 0)

    @staticmethod
    async def _ask_messages(client: anthropic.AsyncAnthropic, model: str, shown: str) -> Answer:
        message = await client.messages.create(model=model, max_tokens=400, system=SYSTEM_PROMPT,
                                               messages=[{"role": "user", "content": shown}])
        text = "".join(block.text for block in message.content if block.type == "text")
        confidence, analysis = parse_answer(text)
        return Answer(confidence, analysis, message.usage.input_tokens + message.usage.output_tokens)

    async def _ask_gemini(self, key: str, model: str, shown: str) -> Answer:
        """The Gemini API's generateContent, asked for a JSON answer."""
        if self._gemini_http is None:
            self._gemini_http = aiohttp.ClientSession(headers={JUDGE_HEADER: JUDGE_TOKEN}, trust_env=True)
        root = str(self.gemini_url).rstrip("/").removesuffix("/v1beta").removesuffix("/v1")
        body = {"systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]},
                "contents": [{"role": "user", "parts": [{"text": shown}]}],
                "generationConfig": {"temperature": 0, "responseMimeType": "application/json"}}
        async with self._gemini_http.post(f"{root}/v1beta/models/{quote(model, safe='')}:generateContent",
                                          data=orjson.dumps(body), headers={"x-goog-api-key": key,
                                                                            "Content-Type": "application/json"}
                                          ) as answer:
            if answer.status != 200:
                raise RuntimeError(f"the Gemini API answered HTTP {answer.status}")
            data = orjson.loads(await answer.read())
        candidates = data.get("candidates") or [{}]
        parts = (candidates[0].get("content") or {}).get("parts") or []
        text = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and not p.get("thought"))
        confidence, analysis = parse_answer(text)
        return Answer(confidence, analysis, (data.get("usageMetadata") or {}).get("totalTokenCount", 0))

    async def check(self, question: Question, model: str, confirm_model: str | None,
                    provider: str = "openai") -> tuple[JudgeCheck, int]:
        first = await self.ask(model, question.client_key, question.request, question.window, provider)
        tokens = first.tokens
        confirm = None
        if confirm_model and first.confidence is not None and first.confidence >= LOOP_CONFIDENCE:
            second = await self.ask(confirm_model, question.client_key, question.request, question.window, provider)
            tokens += second.tokens
            confirm = second.confidence
        return JudgeCheck(question.task, question.turn, first.confidence, confirm, first.analysis), tokens
