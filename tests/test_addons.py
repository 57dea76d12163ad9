"""The add-ons of a watched request, without a server: each point calls only the add-ons that define its hook,
in the order they were given, and each add-on reads what the exchange has come to."""

from __future__ import annotations

from types import SimpleNamespace

from proxy.server.addons import Addon, Addons, Exchange, JudgeAddon, TimingAddon
from proxy.wire import OPENAI


class Recording(Addon):
    def __init__(self, name: str, seen: list) -> None:
        self.name, self.seen = name, seen

    def request(self, exchange: Exchange) -> None:
        self.seen.append((self.name, "request", exchange.payload))

    def response(self, exchange: Exchange) -> None:
        self.seen.append((self.name, "response", exchange.status))


class OnlyDone(Addon):
    def __init__(self, seen: list) -> None:
        self.seen = seen

    def done(self, exchange: Exchange) -> None:
        self.seen.append(("only-done", "done", exchange.status))


def test_each_point_calls_the_addons_that_define_its_hook_in_order():
    seen: list = []
    addons = Addons([Recording("first", seen), OnlyDone(seen), Recording("second", seen)])
    assert (len(addons.request), len(addons.response), len(addons.done), addons.forwarded) == (2, 2, 1, ())
    exchange = Exchange({}, OPENAI, "/v1/chat/completions")
    exchange.payload = {"model": "m"}
    for hook in addons.request:
        hook(exchange)
    exchange.status = 200
    for hook in addons.response + addons.done:
        hook(exchange)
    assert seen == [("first", "request", {"model": "m"}), ("second", "request", {"model": "m"}),
                    ("first", "response", 200), ("second", "response", 200), ("only-done", "done", 200)]


def test_the_judge_starts_only_for_a_verdict_that_made_a_check_due_and_the_timing_is_observed():
    started = []
    judges = SimpleNamespace(start=lambda due, dialect: started.append((due, dialect.name)))
    observed = {"overhead": [], "upstream_latency": []}
    metrics = SimpleNamespace(**{name: SimpleNamespace(observe=values.append) for name, values in observed.items()})
    addons = Addons([TimingAddon(metrics), JudgeAddon(judges)])
    for due in (None, "check at turn 30"):
        exchange = Exchange({}, OPENAI, "/v1/chat/completions", began=1.0)
        exchange.sent, exchange.verdict = 1.25, SimpleNamespace(judge=due, headers={})
        for hook in addons.forwarded:
            hook(exchange)
    assert started == [("check at turn 30", "chat")]
    assert observed["overhead"] == [0.25, 0.25] and all(latency >= 0 for latency in observed["upstream_latency"])
