"""The add-ons of a watched request: what only watches its exchange with the upstream.

The handler moves the bytes and asks the guard; everything that only watches a request (tracing, the
metrics of its timing, the judge started once it is forwarded) is an add-on with the hooks it needs, called in
turn at each point of the exchange. An add-on never changes what the client gets, and a hook it does not define
costs nothing: each point calls only the add-ons that define it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from proxy.detect.actions import Action
from proxy.detect.engine import Episode
from proxy.inspection import Context
from proxy.server.metrics import Metrics
from proxy.server.telemetry import Telemetry
from proxy.wire.dialect import Dialect, Summary


@dataclass(slots=True)
class Exchange:
    """What one watched request has come to so far, as the add-ons read it."""

    headers: Mapping[str, str]
    dialect: Dialect
    raw_path: str
    began: float = 0.0  # when its body was read
    payload: dict | None = None  # the request's body, once read
    raw: bytes = b""  # its bytes as the client sent them
    # From the guard's verdict, what the add-ons read of it (never the verdict itself: its tap tells this exchange's
    # sink its episodes, and a verdict kept here would make each request a reference cycle, its body alive until a
    # collection)
    answer_headers: Mapping[str, str] = field(default_factory=dict)  # the proxy's headers (the session, the episode)
    judge: Any = None  # a judge check the verdict made due
    sent: float | None = None  # when it went upstream
    status: int | None = None  # what the client was answered
    request_id: str | None = None  # the upstream's id of the request
    summary: Summary | None = None  # what the answer said of itself
    span: Any = None  # the request's trace span, when tracing is on


@dataclass(frozen=True, slots=True)
class Served:
    """One episode served on a request: for whom, what the proxy did, and what it saved."""

    context: Context
    episode: Episode
    action: Action
    request_id: str | None
    tokens_saved: int
    served_by: str | None = None  # the response a cut ended, when its notice marks it as served there


class Addon:
    """A part of the request path that only watches it. Hooks, each optional:

    `started` (the request has arrived), `request` (its body is read), `forwarded` (it went upstream and
    the upstream's head came back), `response` (what the client was answered), `error` (an exception left the
    handler), `done` (always, last); and, whenever the request serves one, `episode` (a warning delivered, a
    stop, a cut) and `recovery` (the model moved on from the warning it was given)."""


class Addons:
    """The add-ons in use, each point of the exchange calling the ones that define its hook."""

    def __init__(self, addons: list[Addon]) -> None:
        def hooked(name: str) -> tuple:
            return tuple(getattr(addon, name) for addon in addons if hasattr(addon, name))

        self.started, self.request, self.forwarded = hooked("started"), hooked("request"), hooked("forwarded")
        self.response, self.error, self.done = hooked("response"), hooked("error"), hooked("done")
        self.episode, self.recovery = hooked("episode"), hooked("recovery")

    def sink(self, exchange: Exchange) -> "ExchangeSink":
        """Where the inspection step tells the episodes this exchange serves."""
        return ExchangeSink(self, exchange)


class ExchangeSink:
    """The inspection step's EpisodeSink for one exchange: each episode it serves goes to the add-ons'
    `episode` hooks, each recovery to their `recovery` hooks."""

    __slots__ = ("addons", "exchange")

    def __init__(self, addons: Addons, exchange: Exchange) -> None:
        self.addons, self.exchange = addons, exchange

    def episode(self, context: Context, episode: Episode, action: Action, request_id: str | None,
                tokens_saved: int, served_by: str | None = None) -> None:
        served = Served(context, episode, action, request_id, tokens_saved, served_by)
        for hook in self.addons.episode:
            hook(self.exchange, served)

    def recovery(self, context: Context, episode: Episode) -> None:
        for hook in self.addons.recovery:
            hook(self.exchange, context, episode)


class TracingAddon(Addon):
    """One OpenTelemetry span per watched request (`proxy.server.telemetry`)."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry

    def started(self, exchange: Exchange) -> None:
        exchange.span = self.telemetry.start(exchange.headers, exchange.dialect)

    def request(self, exchange: Exchange) -> None:
        Telemetry.request(exchange.span, exchange.payload, exchange.dialect, exchange.raw_path)

    def response(self, exchange: Exchange) -> None:
        Telemetry.answered(exchange.span, exchange.answer_headers, exchange.request_id, exchange.status,
                           exchange.summary)

    def error(self, exchange: Exchange, exc: BaseException) -> None:
        exchange.span.record_exception(exc)

    def done(self, exchange: Exchange) -> None:
        exchange.span.end()


class TimingAddon(Addon):
    """The proxy's own time before a request goes upstream, and the upstream's until its head comes back."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def forwarded(self, exchange: Exchange) -> None:
        self.metrics.overhead.observe(exchange.sent - exchange.began)
        self.metrics.upstream_latency.observe(time.perf_counter() - exchange.sent)


class JudgeAddon(Addon):
    """A judge check the verdict made due starts once its request is forwarded: never before, never on its
    path."""

    def __init__(self, judges) -> None:
        self.judges = judges

    def forwarded(self, exchange: Exchange) -> None:
        if exchange.judge is not None:
            self.judges.start(exchange.judge, exchange.dialect)
