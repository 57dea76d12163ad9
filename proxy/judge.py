"""The judge: a model asked, in the background, whether a task has stopped making progress.

Never on a request's path: a check starts after the request that made it due
has been forwarded, and its verdict counts from the session's next request.
One check in flight per session, a limit across sessions, a timeout, and any
failure is simply "no verdict".
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import NamedTuple

import aiohttp
import orjson

from proxy.conversation import TOOL, Message
from proxy.detect.judge_policy import LOOP_CONFIDENCE, JudgeCheck
from proxy.wire import JudgeRoute
from proxy.wire.dialect import JudgeQuestion

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

# The verdict's JSON schema, for backends that take one.
VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"analysis": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["analysis", "confidence"],
    "additionalProperties": False,
}
# A judge's answer read at most: a verdict is a few hundred bytes, and an upstream answering more is not one.
JUDGE_ANSWER_BYTES = 1024 * 1024
_MESSAGE_CHARS = 1500


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
    start, end = text.find("{"), text.rfind("}")  # the object in text around it (found in linear time)
    for candidate in (text, *([text[start:end + 1]] if 0 <= start < end else [])):
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


async def _bounded(answer: aiohttp.ClientResponse) -> bytes:
    """The answer's body, refused past JUDGE_ANSWER_BYTES (as it comes: a huge one is never held whole)."""
    body = bytearray()
    async for chunk in answer.content.iter_any():
        body += chunk
        if len(body) > JUDGE_ANSWER_BYTES:
            raise RuntimeError(f"the judge's upstream answered more than {JUDGE_ANSWER_BYTES} bytes")
    return bytes(body)


class Question(NamedTuple):
    """What the judge is asked of a session's task at one of its turns: the person's request and the window of
    the conversation it reads, asked with the client's key (where the judge has none of its own)."""

    task: str
    turn: int
    client_key: str
    request: str
    window: list[Message]


class Judge:
    """Asks each session's judge route (`proxy.wire.judge_route`) in its dialect, over one HTTP client."""

    def __init__(self, timeout: float, concurrency: int) -> None:
        self.timeout = timeout
        self._limit = asyncio.Semaphore(concurrency)
        self._http: aiohttp.ClientSession | None = None
        self._attempts: dict[tuple[str, str], int] = {}  # per dialect and model: the first way of asking it took

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def ask(self, route: JudgeRoute, model: str, client_key: str, request: str, window: list[Message]
                  ) -> Answer:
        """One model's answer; never raises (a failure is an answer without confidence)."""
        question = JudgeQuestion(model, SYSTEM_PROMPT, render(request, window), VERDICT_SCHEMA)
        async with self._limit:
            try:
                async with asyncio.timeout(self.timeout):
                    return await self._ask(route, question, route.key or client_key)
            except Exception as exc:  # timeouts, HTTP errors, refusals: no verdict
                log.info("judge %s gave no verdict: %s", model, str(exc).splitlines()[0] if str(exc) else
                         type(exc).__name__)
                return Answer(None, "", 0)

    async def _ask(self, route: JudgeRoute, question: JudgeQuestion, key: str) -> Answer:
        if self._http is None:
            self._http = aiohttp.ClientSession(headers={JUDGE_HEADER: JUDGE_TOKEN}, trust_env=True)
        dialect = route.dialect
        attempt = self._attempts.get((dialect.name, question.model), 0)
        call = dialect.judge_call(question, key, attempt)
        while call is not None:
            async with self._http.post(route.url(call.path), data=orjson.dumps(call.body),
                                       headers={**call.headers, "Content-Type": "application/json"}) as answer:
                body = await _bounded(answer)
                status = answer.status
            following = dialect.judge_call(question, key, attempt + 1) if status == 400 else None
            if following is not None:  # this backend does not take that way of asking for JSON: the next
                attempt, call = attempt + 1, following
                continue
            if status != 200:
                raise RuntimeError(f"the judge's upstream answered HTTP {status}")
            self._attempts[(dialect.name, question.model)] = attempt
            text, tokens = dialect.judge_reply(orjson.loads(body))
            confidence, analysis = parse_answer(text)
            return Answer(confidence, analysis, tokens)
        return Answer(None, "", 0)

    async def check(self, route: JudgeRoute, question: Question, model: str, confirm_model: str | None
                    ) -> tuple[JudgeCheck, int]:
        first = await self.ask(route, model, question.client_key, question.request, question.window)
        tokens = first.tokens
        confirm = None
        if confirm_model and first.confidence is not None and first.confidence >= LOOP_CONFIDENCE:
            second = await self.ask(route, confirm_model, question.client_key, question.request, question.window)
            tokens += second.tokens
            confirm = second.confidence
        return JudgeCheck(question.task, question.turn, first.confidence, confirm, first.analysis), tokens
