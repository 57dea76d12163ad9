"""A minimal agent on the real openai client's Responses API: full input each turn, or chained."""

from __future__ import annotations

from typing import Any

import openai

TOOLS = [{"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
         for name in ("read_file", "ls", "run_build", "edit_file")]


class ResponsesAgent:
    """`chained`: each request sends only its new items plus `previous_response_id` (the service keeps the
    rest, `store` on). Otherwise every request carries the whole input, `store` off, as Codex does."""

    def __init__(self, base_url: str, *, chained: bool = False, stream: bool = False,
                 api_key: str = "sk-agent-key-123", headers: dict[str, str] | None = None,
                 task: str = "Fix the failing test.") -> None:
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                         default_headers=headers or {})
        self.chained = chained
        self.stream = stream
        self.input: list[dict[str, Any]] = [{"role": "user", "content": task}]  # everything so far
        self.pending: list[dict[str, Any]] = list(self.input)  # what the next chained request adds
        self.previous_id: str | None = None
        self.last_headers: dict[str, str] = {}
        self.events: list[dict] = []
        self.output: list[dict] = []

    async def close(self) -> None:
        await self.client.close()

    async def turn(self) -> dict:
        """Ask once; the response (a dict) is returned and its output joins the conversation."""
        kwargs: dict[str, Any] = dict(model="gpt-test", instructions="You are a careful coding agent.",
                                      tools=TOOLS, store=self.chained,
                                      input=self.pending if self.chained else self.input)
        if self.chained and self.previous_id:
            kwargs["previous_response_id"] = self.previous_id
        if self.stream:
            raw = await self.client.responses.with_raw_response.create(stream=True, **kwargs)
            self.last_headers = dict(raw.headers)
            self.events = []
            response = None
            async for event in raw.parse():
                data = event.to_dict()
                self.events.append(data)
                if data["type"] == "response.completed":
                    response = data["response"]
            assert response is not None, "the stream ended without response.completed"
        else:
            raw = await self.client.responses.with_raw_response.create(**kwargs)
            self.last_headers = dict(raw.headers)
            response = raw.parse().to_dict()
        self.output = [item for item in response["output"] if item.get("type") != "reasoning"]
        self.input += self.output
        self.pending = []
        self.previous_id = response["id"]
        return response

    def answer(self, result: str) -> None:
        """Run the last response's function calls: each gets `result`."""
        for item in self.output:
            if item.get("type") == "function_call":
                answer = {"type": "function_call_output", "call_id": item["call_id"], "output": result}
                self.input.append(answer)
                self.pending.append(answer)

    def say(self, text: str) -> None:
        message = {"role": "user", "content": text}
        self.input.append(message)
        self.pending.append(message)
