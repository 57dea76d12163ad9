"""The add-ons of a watched request, without a server: each point calls only the add-ons that define its hook,
in the order they were given, and each add-on reads what the exchange has come to."""

from __future__ import annotations

from types import SimpleNamespace

from proxy.detect.actions import Action
from proxy.detect.engine import Episode
from proxy.detect.evidence import RepeatedCall
from proxy.inspection import Context
from proxy.server.addons import Addon, Addons, Exchange, JudgeAddon, TimingAddon
from proxy.server.episodes import EpisodeLog
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
        exchange.sent, exchange.judge = 1.25, due
        for hook in addons.forwarded:
            hook(exchange)
    assert started == [("check at turn 30", "chat")]
    assert observed["overhead"] == [0.25, 0.25] and all(latency >= 0 for latency in observed["upstream_latency"])


class Writer:
    def __init__(self) -> None:
        self.detections: list[dict] = []
        self.recoveries: list[dict] = []

    def add_detection(self, values: dict) -> None:
        self.detections.append(values)

    def add_recovery(self, values: dict) -> None:
        self.recoveries.append(values)


class Span:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def add_event(self, name: str, attributes: dict) -> None:
        self.events.append((name, attributes))


def test_the_episode_log_records_each_episode_a_request_serves_once_with_its_trace_event():
    writer = Writer()
    log = EpisodeLog(SimpleNamespace(writer=writer))
    addons = Addons([log])
    exchange = Exchange({}, OPENAI, "/v1/chat/completions")
    exchange.span = Span()
    sink = addons.sink(exchange)
    context = Context("tenant", "s1", "task", "gpt-test", "chat")
    warning = Episode(1, 2, RepeatedCall("read_file", '{"path":"a"}', 3, None), 6, 7, 3)
    sink.episode(context, warning, Action.WARNED, "req-1", 0)
    sink.episode(context, warning, Action.WARNED, "req-2", 0)  # the same request resent: the same episode
    sink.recovery(context, warning)
    [row] = writer.detections
    assert (row["session_id"], row["type"], row["action"], row["episode"], row["request_id"]) == \
        ("s1", "tool_call", "warned", 1, "req-1")
    assert row["detail"] == {"tool": "read_file", "arguments": '{"path":"a"}', "repeats": 3, "same_result": True,
                             "strength": "strong", "api": "chat"}
    assert writer.recoveries == [{"b_tenant": "tenant", "b_session_id": "s1", "b_task": "task", "b_episode": 1}]
    assert exchange.span.events == [("loopwarden.loop", {
        "loopwarden.type": "tool_call", "loopwarden.action": "warned", "loopwarden.episode": "1/2",
        "loopwarden.evidence": '{"path":"a"}', "loopwarden.enforced": True,
        "loopwarden.episode_key": row["episode_key"]})]
