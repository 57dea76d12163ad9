"""Processes the overhead benchmark runs beside loopwarden: a lean upstream, a bare relay, and a sink for
OpenTelemetry spans (to measure loopwarden with tracing on).

    python bench/servers.py upstream PORT
    python bench/servers.py relay PORT UPSTREAM_URL
    python bench/servers.py relay-uvloop PORT UPSTREAM_URL
    python bench/servers.py collector PORT      # then OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:PORT
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time

import aiohttp
import orjson
from aiohttp import web

STREAM_CHUNKS = 200


def _completion() -> bytes:
    return orjson.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()), "model": "bench",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "All done: the tests pass now."}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18},
    })


STREAMING = [0]  # chat streams being written now (a stream whose client left ends at its next write)
CHANT = "I will read the configuration file again to be sure. "


def _chunk(i: int, chant: bool = False, reasoning: str | None = None) -> bytes:
    """One chunk; with `reasoning` ("yes" or "no"), a stream of the same size either way: the token as
    `reasoning_content` beside a null `content` (as DeepSeek and vLLM send it) for the first three quarters of
    the stream when "yes", else as `content` beside a null `reasoning_content`."""
    content = CHANT if chant else f"token{i} "
    delta: dict = {"content": content}
    if reasoning is not None:
        thinking = reasoning == "yes" and i < STREAM_CHUNKS * 3 // 4
        delta = {"content": None, "reasoning_content": content} if thinking else \
            {"content": content, "reasoning_content": None}
    data = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def upstream_chat(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if b'"stream":true' not in body.replace(b" ", b""):
        answer_mb = int(request.headers.get("X-Bench-Answer-MB", "0"))  # an answer this large, in one piece
        if answer_mb:
            text = "".join(f"{i:08d} " for i in range(answer_mb * 1024 * 1024 // 9))
            return web.Response(body=orjson.dumps({"id": "chatcmpl-big", "object": "chat.completion", "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}),
                content_type="application/json")
        return web.Response(body=_completion(), content_type="application/json")
    pace = float(request.headers.get("X-Bench-Pace-Ms", "0")) / 1000  # seconds between chunks
    chant = "X-Bench-Chant" in request.headers  # the same sentence in every chunk: a stream to be cut
    reasoning = request.headers.get("X-Bench-Reasoning")  # reasoning deltas in the stream, or the same size without
    endless = int(request.headers.get("X-Bench-Endless-MB", "0"))  # one `data:` line this long, then the end
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    STREAMING[0] += 1
    try:
        if endless:
            await response.write(b"data: ")
            piece = b"x" * 65536
            for _ in range(endless * 16):
                await response.write(piece)
            await response.write(b"\n\n")
        for i in range(STREAM_CHUNKS):
            if pace:
                await asyncio.sleep(pace)
            await response.write(_chunk(i, chant, reasoning))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:  # the client (the proxy, when its own client left) closed the connection
        pass
    finally:
        STREAMING[0] -= 1
    return response


RESPONSE_IDS = itertools.count()


def _response(output_text: str) -> dict:
    return {"id": f"resp_bench_{next(RESPONSE_IDS)}", "object": "response", "created_at": int(time.time()),
            "status": "completed",
            "model": "bench", "output": [{"id": "msg_bench", "type": "message", "status": "completed",
                                          "role": "assistant", "content": [{"type": "output_text",
                                                                            "text": output_text, "annotations": []}]}],
            "usage": {"input_tokens": 10, "output_tokens": 8, "total_tokens": 18}}


def _event(kind: str, **data) -> bytes:
    """One SSE event whose data names its own type, as both the Responses and the Messages APIs send."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


async def upstream_responses(request: web.Request) -> web.StreamResponse:
    """The Responses API: a JSON response, or 200 `response.output_text.delta` events between the others."""
    body = await request.read()
    if b'"stream":true' not in body.replace(b" ", b""):
        return web.Response(body=orjson.dumps(_response("All done: the tests pass now.")),
                            content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    started = {**_response(""), "status": "in_progress", "output": []}
    await response.write(_event("response.created", response=started, sequence_number=0))
    await response.write(_event("response.output_item.added", sequence_number=1, output_index=0,
                                item={"id": "msg_bench", "type": "message", "status": "in_progress",
                                      "role": "assistant", "content": []}))
    for i in range(STREAM_CHUNKS):
        await response.write(_event("response.output_text.delta", sequence_number=i + 2, item_id="msg_bench",
                                    output_index=0, content_index=0, delta=f"token{i} "))
    text = "".join(f"token{i} " for i in range(STREAM_CHUNKS))
    await response.write(_event("response.completed", sequence_number=STREAM_CHUNKS + 2, response=_response(text)))
    await response.write_eof()
    return response


def _message(text: str) -> dict:
    return {"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 8}}


async def upstream_messages(request: web.Request) -> web.StreamResponse:
    """The Messages API: a JSON message, or 200 `text_delta` events between the others."""
    body = await request.read()
    if b'"stream":true' not in body.replace(b" ", b""):
        return web.Response(body=orjson.dumps(_message("All done: the tests pass now.")),
                            content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_event("message_start", message={**_message(""), "content": []}))
    await response.write(_event("content_block_start", index=0, content_block={"type": "text", "text": ""}))
    for i in range(STREAM_CHUNKS):
        await response.write(_event("content_block_delta", index=0,
                                              delta={"type": "text_delta", "text": f"token{i} "}))
    await response.write(_event("content_block_stop", index=0))
    await response.write(_event("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None},
                                          usage={"output_tokens": STREAM_CHUNKS}))
    await response.write(_event("message_stop"))
    await response.write_eof()
    return response


async def upstream_gemini(request: web.Request) -> web.Response:
    """The Gemini API's generateContent: a JSON answer."""
    await request.read()
    return web.Response(body=orjson.dumps({
        "candidates": [{"content": {"role": "model", "parts": [{"text": "All done: the tests pass now."}]},
                        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 8, "totalTokenCount": 18},
        "modelVersion": "bench", "responseId": f"gem_bench_{next(RESPONSE_IDS)}"}), content_type="application/json")


def upstream_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", upstream_chat)
    app.router.add_post("/v1/responses", upstream_responses)
    app.router.add_post("/v1/messages", upstream_messages)
    app.router.add_post("/v1beta/models/{target}", upstream_gemini)
    app.router.add_get("/bench/streaming", lambda _: web.json_response(STREAMING[0]))
    return app


def relay_app(upstream: str) -> web.Application:
    """The least a forwarding proxy can do: the baseline for loopwarden's own cost."""
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def start(app: web.Application):
        app["client"] = aiohttp.ClientSession(auto_decompress=False)
        yield
        await app["client"].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        async with request.app["client"].post(upstream.removesuffix("/v1") + request.path, data=await request.read(),
                                              headers={"Content-Type": "application/json",
                                                       **{k: v for k, v in request.headers.items()
                                                          if k.lower() == "x-bench-pace-ms"}}) as up:
            response = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers["Content-Type"]})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.cleanup_ctx.append(start)
    app.router.add_post("/v1/chat/completions", relay)
    app.router.add_post("/v1/responses", relay)
    app.router.add_post("/v1/messages", relay)
    app.router.add_post("/v1beta/models/{target}", relay)
    return app


def collector_app() -> web.Application:
    """An OTLP/HTTP endpoint that takes every export and keeps nothing."""
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def traces(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app.router.add_post("/v1/traces", traces)
    return app


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    # `relay-uvloop`: the same bare relay on uvloop, the loop loopwarden runs on where it installs.
    app = {"upstream": upstream_app, "collector": collector_app}[kind]() if not kind.startswith("relay") \
        else relay_app(sys.argv[3])
    loop_factory = None
    if kind == "relay-uvloop":
        import uvloop
        loop_factory = uvloop.new_event_loop
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=loop_factory and loop_factory())
