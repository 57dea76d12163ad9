"""Building chat conversations for tests, the way agents send them."""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from proxy.detect import engine
from proxy.wire.chat import ChatDialect

_ids = itertools.count(1)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str | None = None) -> dict:
    return {"role": "assistant", "content": text}


def step(name: str, arguments: Any, result: str | None, *, text: str | None = None,
         is_error: bool = False) -> list[dict]:
    """One assistant turn calling one tool, and the tool's answer (omitted when result is None)."""
    return steps([(name, arguments, result)], text=text, is_error=is_error)


def steps(calls: list[tuple[str, Any, str | None]], *, text: str | None = None, is_error: bool = False) -> list[dict]:
    """One assistant turn with parallel tool calls, and their answers."""
    raw_calls = []
    answers = []
    for name, arguments, result in calls:
        call_id = f"call_{next(_ids)}"
        raw_calls.append({"id": call_id, "type": "function", "function": {
            "name": name, "arguments": arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()}})
        if result is not None:
            answer = {"role": "tool", "tool_call_id": call_id, "content": result}
            if is_error:
                answer["is_error"] = True
            answers.append(answer)
    return [{"role": "assistant", "content": text, "tool_calls": raw_calls}, *answers]


def conversation(*parts: dict | list[dict]) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
    for part in parts:
        messages.extend(part if isinstance(part, list) else [part])
    return messages


def neutral(messages: list[dict]) -> list:
    """Chat messages as the proxy reads them: through the chat dialect, into the neutral conversation."""
    return ChatDialect.read({"messages": messages}).messages


def analyze(config, messages: list[dict], *args, **kwargs):
    """The engine's fold over chat messages, read as the proxy reads them."""
    return engine.analyze(config, neutral(messages), *args, **kwargs)
