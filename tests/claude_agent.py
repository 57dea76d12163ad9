"""A minimal coding agent on the real `anthropic` client, as Claude Code and agents on the Anthropic SDK talk
to the Messages API."""

from __future__ import annotations

from typing import Any

import anthropic

TOOLS = [{"name": name, "description": f"The {name} tool.", "input_schema": {"type": "object"}}
         for name in ("Bash", "Read", "Edit", "Grep")]
SYSTEM = [{"type": "text", "text": "You are a careful coding agent.", "cache_control": {"type": "ephemeral"}}]


class ClaudeAgent:
    def __init__(self, root_url: str, *, api_key: str = "sk-ant-agent-key-1", stream: bool = False,
                 headers: dict[str, str] | None = None, task: str = "Fix the failing test.",
                 auth_token: str | None = None) -> None:
        if auth_token is not None:  # `Authorization: Bearer`, as the current SDKs send with an auth token
            self.client = anthropic.AsyncAnthropic(base_url=root_url, auth_token=auth_token, api_key=None,
                                                   max_retries=0, default_headers=headers or {})
        else:
            self.client = anthropic.AsyncAnthropic(base_url=root_url, api_key=api_key, max_retries=0,
                                                   default_headers=headers or {})
        self.stream = stream
        self.model = "claude-sonnet-5-5"
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task}]}]
        self.last_headers: dict[str, str] = {}
        self.last: Any = None  # the last answer as the SDK gives it

    async def close(self) -> None:
        await self.client.close()

    def _request(self, **extra: Any) -> dict[str, Any]:
        return {"model": self.model, "max_tokens": 1024, "system": SYSTEM, "tools": TOOLS,
                "messages": self.messages, **extra}

    async def turn(self, **extra: Any) -> dict[str, Any]:
        """Ask the model once; its message is appended to the history and returned."""
        if self.stream:
            async with self.client.messages.stream(**self._request(**extra)) as stream:
                async for _ in stream:
                    pass
                self.last = await stream.get_final_message()
            self.last_headers = dict(stream.response.headers)
        else:
            raw = await self.client.messages.with_raw_response.create(**self._request(**extra))
            self.last_headers = dict(raw.headers)
            self.last = await raw.parse()
        message = {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in self.last.content]}
        self.messages.append(message)
        return message

    def answer(self, result: str, *, is_error: bool = False) -> None:
        """Run the last message's tool calls: each gets `result`, in one user message."""
        blocks = [{"type": "tool_result", "tool_use_id": block["id"], "content": result,
                   **({"is_error": True} if is_error else {})}
                  for block in self.messages[-1]["content"] if block["type"] == "tool_use"]
        self.messages.append({"role": "user", "content": blocks})

    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.messages[-1]["content"] if b["type"] == "text")
