"""A fake upstream speaking Chat Completions, the Responses API and Anthropic's Messages API: a real aiohttp
server that plays scripted turns.

It streams the way providers do: a role chunk first, content in small deltas,
tool-call arguments split mid-token, several tool calls per response, a usage
chunk with empty `choices`, `: keep-alive` comments (Anthropic's `ping` events), optional slow chunks,
error statuses, connections dropped mid-stream, and whole streams sent in one burst.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
from aiohttp import web
from multidict import CIMultiDict


@dataclass
class Turn:
    """One scripted answer to a chat completion request."""

    content: str | None = None
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, arguments dict or raw str)
    status: int = 200
    error: dict | None = None  # body for a non-200 answer
    raw_body: bytes | None = None  # answer with these bytes instead (non-JSON answers)
    headers: dict[str, str] = field(default_factory=dict)
    chunk_chars: int = 4  # characters of content per delta
    delay: float = 0.0  # seconds between chunks
    drop_after: int | None = None  # close the connection after this many chunks
    drop_mid_line: bool = False  # with drop_after: send half of the next chunk first (a line broken off)
    hang: bool = False  # never answer
    latency: float = 0.0  # seconds before answering
    reject_response_format: tuple[str, ...] = ()  # answer 400 to these response_format types
    keepalive: bool = True
    burst: bool = False  # the whole stream in one write, as fast local models and buffering gateways send it
    thinking: str | None = None  # the model's reasoning before its answer, as each server streams it: Messages a
    #   thinking block (signed once whole), Gemini `thought` parts, chat `reasoning_field` deltas, Responses a
    #   reasoning item
    thinking_chars: int | None = None  # characters per reasoning delta (None: all of it in one)
    # chat: reasoning_content (DeepSeek, llama.cpp, SGLang), reasoning (vLLM), openrouter (`reasoning` beside
    # `reasoning_details`), think (`<think>…</think>` inside `content`); Responses: summary (OpenAI's
    # reasoning summaries) or reasoning_text (vLLM's and Ollama's gpt-oss)
    reasoning_field: str = "reasoning_content"

    def thinking_pieces(self) -> list[str]:
        text = self.thinking or ""
        step = self.thinking_chars or max(1, len(text))
        return [text[i:i + step] for i in range(0, len(text), step)]


@dataclass
class StreamRecord:
    planned: int
    sent: int = 0
    completed: bool = False
    body: bytearray = field(default_factory=bytearray)


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: CIMultiDict[str]  # case-insensitive, as HTTP header names are
    body: bytes
    target: str = ""  # the path and query as sent, still percent-encoded

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


@web.middleware
async def _validates(request: web.Request, handler):
    """A body the service would refuse (a field of the wrong type) gets its 400, as the service answers."""
    try:
        return await handler(request)
    except (TypeError, AttributeError, ValueError) as exc:
        return web.json_response({"error": {"message": f"Invalid request: {exc}", "type": "invalid_request_error",
                                            "param": None, "code": None}}, status=400)


class FakeUpstream:
    def __init__(self) -> None:
        self.script: list[Turn] = []
        self.responder: Callable[[dict], Turn] | None = None
        self.judge: Callable[[dict], Turn] | None = None  # answers requests the judge sends
        self.requests: list[Received] = []
        self.streams: list[StreamRecord] = []
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0
        app = web.Application(client_max_size=1024**3, middlewares=[_validates])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        self.stored: dict[str, dict] = {}  # responses kept (store on), by id
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/files/{file_id}/content", self._file_content)
        app.router.add_route("*", "/v1beta/models/{target}", self._gemini)
        app.router.add_route("*", "/v1beta/tunedModels/{target}", self._gemini)
        app.router.add_route("*", "/v1/models/{target:[^/]*:[^/]*}", self._gemini)
        app.router.add_get("/v1beta/models", self._gemini_models)
        app.router.add_route("*", "/v1/{tail:.*}", self._echo)
        self.app = app

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self, port: int = 0, ssl_context=None) -> "FakeUpstream":
        self._runner = web.AppRunner(self.app, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def chat_requests(self) -> list[dict]:
        """The agent's chat requests (not the judge's)."""
        return [r.json for r in self.requests if r.path == "/v1/chat/completions"
                and "X-Loopwarden-Judge" not in r.headers]

    @property
    def responses_requests(self) -> list[dict]:
        return [r.json for r in self.requests if r.path == "/v1/responses"]

    @property
    def responses_raw(self) -> list[bytes]:
        return [r.body for r in self.requests if r.path == "/v1/responses"]

    @property
    def messages_requests(self) -> list[dict]:
        """The agent's Messages requests (not the judge's)."""
        return [r.json for r in self.requests if r.path == "/v1/messages" and "X-Loopwarden-Judge" not in r.headers]

    @property
    def messages_raw(self) -> list[bytes]:
        return [r.body for r in self.requests if r.path == "/v1/messages"]

    @property
    def judge_requests(self) -> list[dict]:
        return [r.json for r in self.requests if "X-Loopwarden-Judge" in r.headers]

    async def _record(self, request: web.Request) -> Received:
        received = Received(request.method, request.path, request.query_string, CIMultiDict(request.headers), b"",
                            request.raw_path)
        self.requests.append(received)  # before the body: one it cannot read (bad gzip) fails here, as upstreams do
        received.body = await request.read()
        return received

    def _next_turn(self, body: dict) -> Turn:
        if self.responder is not None:
            return self.responder(body)
        if self.script:
            return self.script.pop(0)
        return Turn(content="ok")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        received = await self._record(request)
        body = received.json
        if "X-Loopwarden-Judge" in received.headers and self.judge is not None:
            turn = self.judge(body)
        else:
            turn = self._next_turn(body)
        if turn.hang:
            await asyncio.sleep(3600)
        if turn.latency:
            await asyncio.sleep(turn.latency)
        requested_format = (body.get("response_format") or {}).get("type")
        if requested_format in turn.reject_response_format:
            return web.json_response({"error": {"message": f"response_format {requested_format} is not supported",
                                                "type": "invalid_request_error", "param": "response_format",
                                                "code": None}}, status=400)
        if turn.raw_body is not None:
            return web.Response(status=turn.status, body=turn.raw_body, headers=turn.headers)
        if turn.status != 200:
            return web.json_response(turn.error or {"error": {"message": "upstream failure", "type": "server_error",
                                                              "param": None, "code": None}},
                                     status=turn.status, headers=turn.headers)
        completion_id = f"chatcmpl-{next(self._ids)}"
        model = body.get("model", "fake-model")
        calls = [
            {"id": f"call_{completion_id}_{i}", "type": "function",
             "function": {"name": name, "arguments": args if isinstance(args, str) else orjson.dumps(args).decode()}}
            for i, (name, args) in enumerate(turn.tool_calls)
        ]
        usage = {"prompt_tokens": len(received.body) // 4, "completion_tokens": len(turn.content or "") // 4 + 1,
                 "total_tokens": len(received.body) // 4 + len(turn.content or "") // 4 + 1}
        headers = {"x-request-id": f"req-{completion_id}", **turn.headers}
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": turn.content}
            if turn.thinking is not None:
                if turn.reasoning_field == "think":
                    message["content"] = f"<think>{turn.thinking}</think>{turn.content or ''}"
                else:
                    message["reasoning_content" if turn.reasoning_field == "reasoning_content" else "reasoning"] = \
                        turn.thinking
            if calls:
                message["tool_calls"] = calls
            return web.json_response(
                {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
                 "choices": [{"index": 0, "message": message, "logprobs": None,
                              "finish_reason": "tool_calls" if calls else "stop"}],
                 "usage": usage},
                headers=headers,
            )
        chunks = list(self._stream_chunks(completion_id, model, turn, calls, body, usage))
        return await self._stream(request, chunks, turn, headers)

    async def _stream(self, request: web.Request, chunks: list[bytes], turn: Turn, headers: dict
                      ) -> web.StreamResponse:
        """Send SSE chunks as the turn says: paced, in one burst, or dropped part way."""
        record = StreamRecord(planned=len(chunks))
        self.streams.append(record)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               **headers})
        await response.prepare(request)
        if turn.burst:
            chunks = [b"".join(chunks)]
            record.planned = 1
        try:
            for number, chunk in enumerate(chunks):
                if turn.drop_after is not None and number >= turn.drop_after:
                    if turn.drop_mid_line:
                        await response.write(chunk[:len(chunk) // 2])
                    request.transport.close()  # type: ignore[union-attr]
                    return response
                if turn.delay:
                    await asyncio.sleep(turn.delay)
                await response.write(chunk)
                record.sent += 1
                record.body += chunk
            record.completed = True
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response

    def _stream_chunks(self, completion_id: str, model: str, turn: Turn, calls: list[dict], body: dict,
                       usage: dict):
        created = int(time.time())

        def chunk(delta: dict, finish: str | None = None) -> bytes:
            data = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return b"data: " + orjson.dumps(data) + b"\n\n"

        yield chunk({"role": "assistant", "content": ""})
        if turn.keepalive:
            yield b": keep-alive\n\n"
        field_name = turn.reasoning_field
        if turn.thinking is not None and field_name == "think":
            yield chunk({"content": "<think>"})
        for piece in turn.thinking_pieces():
            if field_name == "think":
                yield chunk({"content": piece})
            elif field_name == "openrouter":
                yield chunk({"content": "", "reasoning": piece, "reasoning_details": [
                    {"type": "reasoning.text", "text": piece, "format": "unknown", "index": 0}]})
            else:
                yield chunk({"content": None, field_name: piece})
        if turn.thinking is not None and field_name == "think":
            yield chunk({"content": "</think>"})
        text = turn.content or ""
        step = max(1, turn.chunk_chars)
        for start in range(0, len(text), step):
            yield chunk({"content": text[start:start + step]})
        for index, call in enumerate(calls):
            arguments = call["function"]["arguments"]
            yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                         "function": {"name": call["function"]["name"], "arguments": ""}}]})
            # Split the argument JSON at awkward places: mid key, mid value, mid escape.
            for start in range(0, len(arguments), 7):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[start:start + 7]}}]})
        yield chunk({}, "tool_calls" if calls else "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            data = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [], "usage": usage}
            yield b"data: " + orjson.dumps(data) + b"\n\n"
        yield b"data: [DONE]\n\n"

    @property
    def root(self) -> str:
        """The Gemini API's base URL: its paths carry their version (`/v1beta/models/...`)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def gemini_requests(self) -> list[Received]:
        return [r for r in self.requests if r.path.startswith(("/v1beta/", "/v1/models/")) and ":" in r.path
                and "Content" in r.path]

    async def _gemini_models(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"models": [{"name": "models/gemini-test", "displayName": "Gemini Test"}]})

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        """The Gemini API as Google speaks it: `candidates` with `parts`, a function call whole in one chunk with
        its `thoughtSignature`, text split across `?alt=sse` chunks, `usageMetadata` on the last."""
        received = await self._record(request)
        model, _, method = request.match_info["target"].partition(":")
        if request.method == "GET":
            return web.json_response({"name": f"models/{model}"})
        body = received.json
        if method == "countTokens":
            return web.json_response({"totalTokens": 42})
        if method not in ("generateContent", "streamGenerateContent"):
            return web.json_response({"error": {"code": 404, "message": "no such method", "status": "NOT_FOUND"}},
                                     status=404)
        if not isinstance(body.get("contents"), list):
            raise TypeError("contents must be a list")
        judged = "X-Loopwarden-Judge" in received.headers and self.judge is not None
        turn = self.judge(body) if judged else self._next_turn(body)
        if turn.status != 200:
            return web.json_response(turn.error or {"error": {"code": turn.status, "message": "failed",
                                                              "status": "UNAVAILABLE"}}, status=turn.status)
        response_id = f"gem-{next(self._ids)}"
        usage = {"promptTokenCount": 12, "candidatesTokenCount": 5, "totalTokenCount": 17}
        calls = [{"functionCall": {"name": name, "args": args if isinstance(args, dict) else orjson.loads(args)},
                  "thoughtSignature": base64.b64encode(f"sig-{response_id}-{index}".encode()).decode()}
                 for index, (name, args) in enumerate(turn.tool_calls)]
        thought = [{"text": piece, "thought": True} for piece in turn.thinking_pieces()]

        def chunk(parts: list[dict], finish: str | None = None) -> dict:
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            if finish:
                candidate["finishReason"] = finish
            data: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": response_id}
            if finish:
                data["usageMetadata"] = usage
            return data

        text = turn.content or ""
        if method == "generateContent":
            parts = ([{"text": turn.thinking, "thought": True}] if turn.thinking else []) + \
                ([{"text": text}] if text else []) + calls
            return web.json_response(chunk(parts, "STOP"))
        step = max(1, turn.chunk_chars)
        pieces = [chunk([part]) for part in thought] + [chunk([{"text": text[i:i + step]}])
                                                        for i in range(0, len(text), step)]
        pieces.append(chunk(calls, "STOP"))
        return await self._stream(request, [b"data: " + orjson.dumps(p) + b"\r\n\r\n" for p in pieces], turn, {})

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API as the service speaks it: output items, `response.*` events with sequence
        numbers, arguments split mid-token, and `previous_response_id` refused when it is not kept."""
        received = await self._record(request)
        body = received.json
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            return web.json_response({"error": {"message": f"Previous response with id '{previous}' not found.",
                                                "type": "invalid_request_error", "param": "previous_response_id",
                                                "code": "previous_response_not_found"}}, status=400)
        turn = self._next_turn(body)
        if turn.latency:
            await asyncio.sleep(turn.latency)
        if turn.raw_body is not None:
            return web.Response(status=turn.status, body=turn.raw_body, headers=turn.headers)
        if turn.status != 200:
            return web.json_response(turn.error or {"error": {"message": "upstream failure", "type": "server_error",
                                                              "param": None, "code": None}}, status=turn.status)
        number = next(self._ids)
        response_id = f"resp_{number:04d}"
        output: list[dict] = []
        if turn.thinking is not None:
            reasoning: dict[str, Any] = {"id": f"rs_{number}", "type": "reasoning", "summary": []}
            if turn.reasoning_field == "reasoning_text":
                reasoning["content"] = [{"type": "reasoning_text", "text": turn.thinking}]
            else:
                reasoning["summary"] = [{"type": "summary_text", "text": turn.thinking}]
                reasoning["encrypted_content"] = f"gAAAA-enc-{number}"
            output.append(reasoning)
        if turn.content is not None:
            output.append({"id": f"msg_{number}", "type": "message", "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": turn.content, "annotations": [],
                                        "logprobs": []}]})
        for i, (name, args) in enumerate(turn.tool_calls):
            arguments = args if isinstance(args, str) else orjson.dumps(args).decode()
            output.append({"id": f"fc_{number}_{i}", "type": "function_call", "status": "completed",
                           "call_id": f"call_{number}_{i}", "name": name, "arguments": arguments})
        response = {"id": response_id, "object": "response", "created_at": int(time.time()), "status": "completed",
                    "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
                    "model": body.get("model", "fake-model"), "output": output, "parallel_tool_calls": True,
                    "previous_response_id": previous, "store": body.get("store", True),
                    "temperature": 1.0, "tool_choice": "auto", "tools": body.get("tools") or [], "top_p": 1.0,
                    "metadata": {}, "text": {"format": {"type": "text"}}, "truncation": "disabled",
                    "usage": {"input_tokens": len(received.body) // 4, "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                              "total_tokens": len(received.body) // 4 + 5}}
        if body.get("store", True) is not False:
            self.stored[response_id] = response
        headers = {"x-request-id": f"req-{response_id}", **turn.headers}
        if not body.get("stream"):
            return web.json_response(response, headers=headers)
        return await self._stream(request, list(self._response_events(response, turn)), turn, headers)

    @staticmethod
    def _response_events(response: dict, turn: Turn):
        sequence = itertools.count()

        def event(kind: str, **data) -> bytes:
            return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(
                {"type": kind, **data, "sequence_number": next(sequence)}) + b"\n\n"

        started = {**response, "status": "in_progress", "output": [], "usage": None}
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        if turn.keepalive:
            yield b": keep-alive\n\n"
        for index, item in enumerate(response["output"]):
            if item["type"] == "reasoning":
                yield event("response.output_item.added", output_index=index,
                            item={"id": item["id"], "type": "reasoning", "summary": []})
                if item.get("content"):  # gpt-oss on vLLM and Ollama: the raw reasoning as reasoning_text
                    yield event("response.content_part.added", item_id=item["id"], output_index=index,
                                content_index=0, part={"type": "reasoning_text", "text": ""})
                    for piece in turn.thinking_pieces():
                        yield event("response.reasoning_text.delta", item_id=item["id"], output_index=index,
                                    content_index=0, delta=piece)
                    yield event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                content_index=0, text=turn.thinking)
                    yield event("response.content_part.done", item_id=item["id"], output_index=index,
                                content_index=0, part=item["content"][0])
                else:
                    yield event("response.reasoning_summary_part.added", item_id=item["id"], output_index=index,
                                summary_index=0, part={"type": "summary_text", "text": ""})
                    for piece in turn.thinking_pieces():
                        yield event("response.reasoning_summary_text.delta", item_id=item["id"],
                                    output_index=index, summary_index=0, delta=piece)
                    yield event("response.reasoning_summary_text.done", item_id=item["id"], output_index=index,
                                summary_index=0, text=turn.thinking)
                    yield event("response.reasoning_summary_part.done", item_id=item["id"], output_index=index,
                                summary_index=0, part=item["summary"][0])
            elif item["type"] == "message":
                text = item["content"][0]["text"]
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "content": []})
                yield event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                            part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
                step = max(1, turn.chunk_chars)
                for start in range(0, len(text), step):
                    yield event("response.output_text.delta", item_id=item["id"], output_index=index,
                                content_index=0, delta=text[start:start + step], logprobs=[])
                yield event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=text, logprobs=[])
                yield event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                            part=item["content"][0])
            else:
                arguments = item["arguments"]
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "arguments": ""})
                for start in range(0, len(arguments), 7):  # split mid key, mid value, mid escape
                    yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                delta=arguments[start:start + 7])
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            arguments=arguments)
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.completed", response=response)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's Messages API: content blocks, and `message_start`, `content_block_*`, `ping`,
        `message_delta` with usage and `message_stop` events, `input_json_delta` split mid-token."""
        received = await self._record(request)
        body = received.json
        if not isinstance(body.get("max_tokens"), int):
            return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                                 "message": "max_tokens: Field required"}}, status=400)
        for m_index, sent in enumerate(body.get("messages") or []):
            blocks = sent.get("content") if sent.get("role") == "assistant" else None
            for b_index, block in enumerate(blocks if isinstance(blocks, list) else []):
                if block.get("type") == "thinking" and not block.get("signature"):  # as Anthropic refuses it
                    return web.json_response({"type": "error", "error": {
                        "type": "invalid_request_error",
                        "message": f"messages.{m_index}.content.{b_index}.thinking.signature: Field required"}},
                        status=400)
        if "X-Loopwarden-Judge" in received.headers and self.judge is not None:
            turn = self.judge(body)
        else:
            turn = self._next_turn(body)
        if turn.latency:
            await asyncio.sleep(turn.latency)
        if turn.status != 200:
            return web.json_response(turn.error or {"type": "error", "error": {"type": "overloaded_error",
                                                                               "message": "Overloaded"}},
                                     status=turn.status)
        number = next(self._ids)
        content: list[dict] = []
        if turn.thinking is not None:
            content.append({"type": "thinking", "thinking": turn.thinking, "signature": f"sig-{number}-EqQBCkgIARAB"})
        if turn.content is not None:
            content.append({"type": "text", "text": turn.content})
        for i, (name, args) in enumerate(turn.tool_calls):
            content.append({"type": "tool_use", "id": f"toolu_{number:04d}_{i}", "name": name,
                            "input": orjson.loads(args) if isinstance(args, str) else args})
        message = {"id": f"msg_{number:04d}", "type": "message", "role": "assistant", "model": body.get("model"),
                   "content": content, "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
                   "stop_sequence": None,
                   "usage": {"input_tokens": len(received.body) // 4, "output_tokens": 5,
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        headers = {"request-id": f"req_{number:04d}", **turn.headers}
        if not body.get("stream"):
            return web.json_response(message, headers=headers)
        return await self._stream(request, list(self._message_events(message, turn)), turn, headers)

    @staticmethod
    def _message_events(message: dict, turn: Turn):
        def event(kind: str, **data) -> bytes:
            return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"

        yield event("message_start", message={**message, "content": [], "stop_reason": None,
                                              "usage": {**message["usage"], "output_tokens": 1}})
        if turn.keepalive:
            yield event("ping")
        step = max(1, turn.chunk_chars)
        for index, block in enumerate(message["content"]):
            if block["type"] == "thinking":
                yield event("content_block_start", index=index,
                            content_block={"type": "thinking", "thinking": "", "signature": ""})
                for piece in turn.thinking_pieces():
                    yield event("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": piece})
                yield event("content_block_delta", index=index,
                            delta={"type": "signature_delta", "signature": block["signature"]})
            elif block["type"] == "text":
                yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
                for start in range(0, len(block["text"]), step):
                    yield event("content_block_delta", index=index,
                                delta={"type": "text_delta", "text": block["text"][start:start + step]})
            else:
                yield event("content_block_start", index=index,
                            content_block={"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}})
                arguments = orjson.dumps(block["input"]).decode()
                for start in range(0, len(arguments), 7):  # split mid key, mid value, mid escape
                    yield event("content_block_delta", index=index,
                                delta={"type": "input_json_delta", "partial_json": arguments[start:start + 7]})
            yield event("content_block_stop", index=index)
        yield event("message_delta", delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
                    usage={"output_tokens": message["usage"]["output_tokens"]})
        yield event("message_stop")

    async def _models(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model",
                                                               "created": 0, "owned_by": "test"}]})

    async def _embeddings(self, request: web.Request) -> web.Response:
        received = await self._record(request)
        inputs = received.json.get("input")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        return web.json_response({"object": "list", "model": received.json.get("model"),
                                  "data": [{"object": "embedding", "index": i, "embedding": [0.1 * i, 0.2, 0.3]}
                                           for i in range(len(inputs))],
                                  "usage": {"prompt_tokens": 3, "total_tokens": 3}})

    async def _file_content(self, request: web.Request) -> web.StreamResponse:
        """A file's content, streamed in lines, with a pause before the end of the body."""
        await self._record(request)
        response = web.StreamResponse(headers={"Content-Type": "application/jsonl"})
        await response.prepare(request)
        try:
            for i in range(20):
                await response.write(orjson.dumps({"line": i}) + b"\n")
            await asyncio.sleep(0.2)
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response

    async def _echo(self, request: web.Request) -> web.Response:
        received = await self._record(request)
        return web.json_response(
            {"method": received.method, "path": received.path, "query": received.query,
             "body": received.body.decode("utf-8", "replace"),
             "headers": {k.lower(): v for k, v in received.headers.items()}},
            status=201 if request.method == "PUT" else 200,
            headers={"x-upstream-echo": "1"},
        )
