"""OpenTelemetry, against a real OTLP/HTTP receiver decoding the exported protobuf: a span per model request with
the GenAI attributes, an event per episode, and the client's trace continued."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from aiohttp import web
from google.genai import types
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.agent import Agent
from tests.claude_agent import ClaudeAgent
from tests.fake_upstream import Turn
from tests.test_detection_e2e import CONTENT
from tests.test_gemini import ask, client_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Collector:
    """An OTLP/HTTP traces endpoint: keeps every span it is sent, as the protobuf decodes."""

    def __init__(self) -> None:
        self.spans: list = []
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.headers["Content-Type"] == "application/x-protobuf"
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource in export.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
            for scope in resource.scope_spans:
                self.spans += [(service, span) for span in scope.spans]
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


def attributes(item) -> dict:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in item.attributes}


@pytest.fixture
async def collector(monkeypatch):
    receiver = Collector()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", await receiver.start())
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    yield receiver
    await receiver.runner.cleanup()


async def spans_of(collector: Collector, count: int) -> list:
    for _ in range(200):
        if len(collector.spans) >= count:
            break
        await asyncio.sleep(0.02)
    return collector.spans


async def test_a_span_per_request_with_the_genai_attributes_and_an_event_per_episode(upstream, proxy_factory,
                                                                                     collector):
    running = await proxy_factory(upstream.url)
    agent = Agent(running.url, stream=True, headers={"X-Loopwarden-Session": "traced",
                                                     "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    for _ in range(7):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await agent.turn()
        agent.answer(CONTENT)
    with pytest.raises(openai.BadRequestError):
        await agent.turn()
    found = await spans_of(collector, 8)
    assert len(found) == 8 and {service for service, _ in found} == {"loopwarden"}
    spans = sorted((span for _, span in found), key=lambda span: span.start_time_unix_nano)
    first = attributes(spans[0])
    assert spans[0].name == "chat gpt-test" and spans[0].kind == 3  # SPAN_KIND_CLIENT
    assert {k: first[k] for k in ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
                                  "gen_ai.conversation.id", "http.response.status_code")} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-test",
        "gen_ai.conversation.id": "traced", "http.response.status_code": 200}
    assert first["gen_ai.usage.input_tokens"] > 0 and first["gen_ai.usage.output_tokens"] > 0
    assert first["gen_ai.response.id"].startswith("chatcmpl-")
    assert first["loopwarden.upstream.request_id"].startswith("req-chatcmpl-")
    # The agent's trace is continued: every span is a child of the span its traceparent named.
    assert {span.trace_id.hex() for span in spans} == {TRACE_ID}
    assert {span.parent_span_id.hex() for span in spans} == {PARENT_ID}
    events = [(i, attributes(event)) for i, span in enumerate(spans) for event in span.events]
    assert [(i, e["loopwarden.type"], e["loopwarden.action"], e["loopwarden.episode"]) for i, e in events] == [
        (5, "tool_call", "warned", "1/2"), (6, "tool_call", "warned", "2/2"), (7, "tool_call", "stopped", "3/2")]
    assert all(span.events[0].name == "loopwarden.loop" for span in spans[5:])
    assert '"path":"src/app.py"' in events[0][1]["loopwarden.evidence"]
    assert attributes(spans[7])["http.response.status_code"] == 400
    # Who reads the trace finds the detection (its id, to mark it) by the event's key.
    async with aiohttp.ClientSession() as http:
        for _ in range(50):
            async with http.get(f"{running.root}/loopwarden/api/detections",
                                params={"episode_key": events[2][1]["loopwarden.episode_key"]}) as answer:
                found = (await answer.json())["data"]
            if found:
                break
            await asyncio.sleep(0.1)
    assert [(d["action"], d["episode"]) for d in found] == [("stopped", 3)] and isinstance(found[0]["id"], int)
    await agent.close()


async def test_messages_requests_are_anthropic_spans_with_their_usage(upstream, proxy_factory, collector):
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url)
    agent = ClaudeAgent(running.root)
    upstream.script.append(Turn(content="Hello."))
    await agent.turn()
    (_, span), = await spans_of(collector, 1)
    found = attributes(span)
    assert found["gen_ai.provider.name"] == "anthropic" and found["gen_ai.request.max_tokens"] == 1024
    assert found["gen_ai.response.id"].startswith("msg_") and found["gen_ai.usage.output_tokens"] == 5
    await agent.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_gemini_requests_are_spans_with_their_tokens_response_id_and_model_version(upstream, proxy_factory,
                                                                                      collector, stream):
    """The Gemini API names them its own way (`usageMetadata`, `responseId`, `modelVersion`): the span carries
    them as the other dialects' do."""
    running = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    client = client_for(running)
    upstream.script.append(Turn(content="Hello."))
    await ask(client, [types.Content(role="user", parts=[types.Part(text="Say hello")])], stream)
    (_, span), = await spans_of(collector, 1)
    found = attributes(span)
    assert found["gen_ai.provider.name"] == "gcp.gemini" and found["gen_ai.request.model"] == "gemini-test"
    assert found["gen_ai.response.id"].startswith("gem-") and found["gen_ai.response.model"] == "gemini-test"
    assert (found["gen_ai.usage.input_tokens"], found["gen_ai.usage.output_tokens"]) == (12, 5)


async def test_off_by_default_and_nothing_is_sent(upstream, proxy_factory, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    running = await proxy_factory(upstream.url)
    from proxy.server.app import TELEMETRY

    assert running.runner.app[TELEMETRY].tracer is None
    agent = Agent(running.url)
    upstream.script.append(Turn(content="hi"))
    await agent.turn()
    await agent.close()
