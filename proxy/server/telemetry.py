"""OpenTelemetry: one span per proxied model request, following the GenAI semantic conventions, and one event
per loop episode on it. On only when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or its traces variant) is
set; the OTLP/HTTP exporter then reads the other `OTEL_*` variables itself. Off, nothing is imported and no
request pays anything: every call site holds a span of None."""

from __future__ import annotations

import asyncio
from typing import Mapping

from proxy.detect.engine import Episode
from proxy.detect.ladder import shown
from proxy.wire.dialect import Summary


class Telemetry:
    def __init__(self, environ: Mapping[str, str]) -> None:
        self.tracer = None
        self._provider = None
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if not endpoint or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, when set, name the service instead.
        named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        self._provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "loopwarden"}))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # exports off the event loop
        self.tracer = self._provider.get_tracer("loopwarden")
        self._propagator = TraceContextTextMapPropagator()

    def start(self, headers: Mapping[str, str], dialect):
        """A span for one model request, a child of the client's trace when it sent `traceparent`."""
        from opentelemetry.trace import SpanKind

        return self.tracer.start_span("chat", context=self._propagator.extract(headers), kind=SpanKind.CLIENT,
                                      attributes={"gen_ai.operation.name": "chat",
                                                  "gen_ai.provider.name": dialect.provider,
                                                  "loopwarden.api": dialect.name})

    @staticmethod
    def request(span, payload: dict, dialect, raw_path: str) -> None:
        model = dialect.model(payload, raw_path)
        if model is not None:
            model = model[:256]
            span.update_name(f"chat {model}")
            span.set_attribute("gen_ai.request.model", model)
        limit = dialect.max_output_tokens(payload)
        if limit is not None:
            span.set_attribute("gen_ai.request.max_tokens", limit)

    @staticmethod
    def answered(span, answer_headers: Mapping[str, str], request_id: str | None, status: int,
                 summary: Summary | None = None) -> None:
        """What the request came to: the session, the status, the upstream's ids and what its answer says of
        itself (a JSON answer, or what a finished stream said), in any dialect."""
        session = answer_headers.get("X-Loopwarden-Session")
        if session:
            span.set_attribute("gen_ai.conversation.id", session)
        span.set_attribute("http.response.status_code", status)
        if request_id:
            span.set_attribute("loopwarden.upstream.request_id", request_id)
        if summary is None:
            return
        for name, value in (("gen_ai.response.id", summary.response_id), ("gen_ai.response.model", summary.model),
                            ("gen_ai.usage.input_tokens", summary.input_tokens),
                            ("gen_ai.usage.output_tokens", summary.output_tokens)):
            if value is not None:
                span.set_attribute(name, value)

    @staticmethod
    def episode(span, episode: Episode, action: str, enforced: bool, key: str) -> None:
        """One event per loop episode served on this request, with the key its detection is found by (the
        detection's id is drawn by the log later: `/loopwarden/api/detections?episode_key=...` gives it)."""
        span.add_event("loopwarden.loop", {"loopwarden.type": episode.type, "loopwarden.action": action,
                                           "loopwarden.episode": shown(episode.number, episode.limit, episode.is_stop),
                                           "loopwarden.evidence": episode.evidence.gist()[:300],
                                           "loopwarden.enforced": enforced, "loopwarden.episode_key": key})

    async def close(self) -> None:
        if self._provider is not None:
            await asyncio.to_thread(self._provider.shutdown)  # the last spans are sent before the process ends
