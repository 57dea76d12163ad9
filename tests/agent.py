"""A minimal coding agent on the real openai client, as agents talk to an OpenAI endpoint."""

from __future__ import annotations

from typing import Any

import openai

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("read_file", "run_build", "job_status", "ls", "edit_file", "debugger_next")
]


class Agent:
    def __init__(self, base_url: str, *, api_key: str = "sk-agent-key-123", stream: bool = False,
                 headers: dict[str, str] | None = None, task: str = "Fix the failing test.") -> None:
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                         default_headers=headers or {})
        self.stream = stream
        self.model = "gpt-test"
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": task},
        ]
        self.last_headers: dict[str, str] = {}
        self.finish_reason: str | None = None
        self.extras: list[dict] = []  # top-level fields of streamed chunks beyond the OpenAI ones

    async def close(self) -> None:
        await self.client.close()

    async def turn(self, **extra_headers: str) -> dict[str, Any]:
        """Ask the model once; the assistant message is appended to the history and returned."""
        kwargs = dict(model=self.model, messages=self.messages, tools=TOOLS,
                      extra_headers=extra_headers or None)
        if self.stream:
            raw = await self.client.chat.completions.with_raw_response.create(
                stream=True, stream_options={"include_usage": True}, **kwargs)
            self.last_headers = dict(raw.headers)
            message = await self._assemble(raw.parse())
        else:
            raw = await self.client.chat.completions.with_raw_response.create(**kwargs)
            self.last_headers = dict(raw.headers)
            completion = raw.parse()
            self.finish_reason = completion.choices[0].finish_reason
            message = completion.choices[0].message.model_dump(exclude_none=True, exclude={"refusal", "annotations"})
        self.messages.append(message)
        return message

    async def _assemble(self, stream) -> dict[str, Any]:
        text: list[str] = []
        calls: dict[int, dict] = {}
        self.extras = []
        async for chunk in stream:
            extra = {k: v for k, v in chunk.to_dict().items()
                     if k not in ("id", "object", "created", "model", "choices", "usage", "system_fingerprint",
                                  "service_tier", "obfuscation")}
            if extra:
                self.extras.append(extra)
            for choice in chunk.choices:
                if choice.delta.content:
                    text.append(choice.delta.content)
                for call in choice.delta.tool_calls or []:
                    entry = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
                    entry["function"]["name"] += call.function.name or ""
                    entry["function"]["arguments"] += call.function.arguments or ""
                self.finish_reason = choice.finish_reason or self.finish_reason
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message

    def answer(self, result: str) -> None:
        """Run the last message's tool calls: each gets `result`."""
        for call in self.messages[-1].get("tool_calls") or []:
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})

    def say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
