"""The inspection step without a server: a request's verdict, the warnings placed, the stop, and the tap that
reads the answer, with the stored facts and the episode sink as plain objects."""

from __future__ import annotations

import orjson

from proxy.config import build
from proxy.inspection import Forward, Incoming, Inspector, Stop
from proxy.wire.chat import ChatDialect
from proxy.wire.messages import MessagesDialect
from tests.conftest import with_ladder_of_five
from tests.convo import assistant, conversation, step, user

HEADERS = {"Authorization": "Bearer key-1", "X-Loopwarden-Session": "s1"}


class Facts:
    def __init__(self, disabled: bool = False) -> None:
        self.disabled = disabled
        self.reset_at_message = 0
        self.seen: list[tuple] = []
        self.named: list[tuple] = []
        self.links: list[tuple] = []

    def controls(self, tenant, session_id):
        return self

    def judge_checks(self, tenant, session_id, task):
        return []

    def resume_link_issued(self, token, tenant, session_id, task):
        self.links.append((session_id, task))

    def session_seen(self, tenant, session_id, message_count, model, agent=None, title=None, task=None):
        self.seen.append((session_id, message_count, model))
        self.named.append((agent, title))


class Sink:
    def __init__(self) -> None:
        self.logged: list[tuple[str, str, int]] = []
        self.recovered: list[int] = []

    def episode(self, context, episode, action, request_id, tokens_saved, served_by=None):
        self.logged.append((episode.type, action, episode.number))

    def recovery(self, context, episode):
        self.recovered.append(episode.number)


class Inspecting:
    """An inspector whose requests all tell their episodes to one sink (the server gives each its exchange's)."""

    def __init__(self, inspector: Inspector, sink: Sink) -> None:
        self.inspector, self.sink = inspector, sink

    def inspect(self, check: Incoming):
        return self.inspector.inspect(check, self.sink)


def inspector(facts=None, sink=None, **settings) -> Inspecting:
    return Inspecting(Inspector(build(with_ladder_of_five(settings), environ={}), facts or Facts()), sink or Sink())


def looping(calls: int) -> list[dict]:
    return conversation(user("read the config"),
                        *[step("read_file", {"path": "cfg.toml"}, "[server]\nport = 1") for _ in range(calls)])


def incoming(messages: list[dict], headers=HEADERS, dialect=ChatDialect()) -> Incoming:
    payload = {"model": "gpt-test", "messages": messages}
    return Incoming(headers, orjson.dumps(payload), payload, dialect)


def test_a_conversation_below_the_threshold_is_forwarded_byte_for_byte():
    check = incoming(looping(4))
    verdict = inspector().inspect(check)
    assert isinstance(verdict, Forward) and verdict.body is check.raw
    assert verdict.headers == {"X-Loopwarden-Session": "s1"} and verdict.tap is not None


def test_the_fifth_identical_call_is_warned_after_its_result_and_logged_when_delivered():
    sink = Sink()
    facts = Facts()
    verdict = inspector(facts, sink).inspect(incoming(looping(5)))
    sent = orjson.loads(verdict.body)["messages"]
    assert sent[-1]["role"] == "system" and sent[-1]["content"].startswith("[loopwarden] Loop detected (1/2)")
    assert sent[-2]["role"] == "tool"
    assert verdict.headers["X-Loopwarden-Warning"] == "1/2 tool_call"
    assert sink.logged == []  # not before the model has it
    verdict.tap.delivered(200, "req-1")
    assert sink.logged == [("tool_call", "warned", 1)]
    assert facts.seen == [("s1", 12, "gpt-test")]


def test_the_seventh_is_stopped_in_the_dialects_error_shape_without_going_upstream():
    sink = Sink()
    verdict = inspector(sink=sink).inspect(incoming(looping(7)))
    assert isinstance(verdict, Stop) and verdict.status == 400
    assert verdict.headers["X-Loopwarden-Loop"] == "tool_call" and verdict.headers["x-should-retry"] == "false"
    assert orjson.loads(verdict.body)["error"]["code"] == "loop_detected"
    assert sink.logged == [("tool_call", "stopped", 3)]
    anthropic = inspector().inspect(incoming(
        [{"role": "user", "content": "read the config"}] + [m for _ in range(7) for m in (
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{_}", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{_}", "content": "same"}]})],
        dialect=MessagesDialect()))
    assert orjson.loads(anthropic.body)["error"]["type"] == "loop_detected"


def test_observe_mode_and_a_disabled_session_change_nothing():
    sink = Sink()
    check = incoming(looping(7), headers={**HEADERS, "X-Loopwarden-Mode": "observe"})
    observed = inspector(sink=sink).inspect(check)
    assert isinstance(observed, Forward) and observed.body is check.raw
    assert observed.headers["X-Loopwarden-Observed"] == "stop tool_call"
    assert sink.logged == [("tool_call", "stopped", 3)]
    disabled = inspector(Facts(disabled=True)).inspect(incoming(looping(7)))
    assert isinstance(disabled, Forward) and disabled.tap is None


def test_the_tap_cuts_a_chanting_stream_at_the_delta_that_completed_it():
    sink = Sink()
    verdict = inspector(sink=sink).inspect(incoming(conversation(user("tell me"))))
    sentence = "I will check the configuration file once more now. "
    chunks = [b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":' + orjson.dumps(sentence)
              + b'}}]}\n\n' for _ in range(12)]
    passed = []
    for chunk in chunks:
        passing = verdict.tap.pass_on(chunk)
        passed.append(passing)
        if passing.last:
            break
    assert len(passed) == 10 and [p.data for p in passed[:9]] == chunks[:9]  # whole events go out as they come
    last = passed[-1].data
    assert last.startswith(chunks[9]) and b'"finish_reason":"stop"' in last[len(chunks[9]):]
    assert last.endswith(b"data: [DONE]\n\n")
    assert sink.logged == [("content", "cut", 1)]


def test_a_session_is_named_once_by_its_agent_and_first_prompt():
    """The agent from the headers and the title from the first message a person wrote are read at a session's
    first request; later requests carry neither (the first seen wins)."""
    facts = Facts()
    guard = inspector(facts)
    headers = {**HEADERS, "User-Agent": "QwenCode/0.15.10 (linux; x64)"}
    messages = conversation(user("read the config at 2026-05-01T10:00:00Z"),
                            step("read_file", {"path": "cfg.toml"}, "[server]"))
    guard.inspect(incoming(messages, headers))
    guard.inspect(incoming(messages + [{"role": "user", "content": "and now the port"}], headers))
    assert facts.named == [("Qwen Code 0.15.10", "read the config at …"), (None, None)]


def test_the_fingerprint_and_the_title_read_the_same_first_prompt():
    from proxy.inspection import first_prompt, session_of
    from proxy.conversation import Message
    messages = [Message("system", "be brief"), Message("user", "fix a.py"), Message("user", "now b.py")]
    assert first_prompt(messages) == "fix a.py"
    assert session_of({}, messages, "t") == session_of({}, messages[:2], "t")


def test_a_conversation_is_named_by_its_persons_first_prompt_once_one_is_sent():
    """Until a person has written, a conversation's id is not its own for good: the request that brings the
    first prompt is named by it, as it would be read afresh."""
    from proxy.inspection import session_of, tenant_of
    guard = inspector()
    preamble = {"role": "user", "content": "I have *added these files to the chat* so you can go ahead and edit them."}
    opening = [{"role": "system", "content": "You are Aider."}, preamble]
    first = guard.inspect(incoming(opening, {}))
    prompted = opening + [{"role": "assistant", "content": "Ok."}, user("fix the bug in a.py")]
    second = guard.inspect(incoming(prompted, {}))
    again = guard.inspect(incoming(prompted + [assistant("Done."), user("and b.py")], {}))
    fresh = session_of({}, ChatDialect.read({"messages": prompted}).messages, tenant_of(""))
    assert second.headers["X-Loopwarden-Session"] == again.headers["X-Loopwarden-Session"] == fresh
    assert first.headers["X-Loopwarden-Session"] != fresh
    # Another run opening alike, on another prompt: another session.
    other = guard.inspect(incoming(opening + [{"role": "assistant", "content": "Ok."}, user("add a docstring")], {}))
    assert other.headers["X-Loopwarden-Session"] not in (fresh, first.headers["X-Loopwarden-Session"])


def test_an_answer_is_read_as_of_its_request_when_the_next_request_came_first():
    """A session's next request may be inspected before the answer to the one before it has come (a client
    retrying, a subagent): the answer is read on the task as its own request left it."""
    guard = inspector()
    first = looping(2)  # turns 1 and 2
    early = guard.inspect(incoming(first))
    second = first + step("read_file", {"path": "other.toml"}, "[client]")  # turn 3, the answer `early` awaits
    guard.inspect(incoming(second))
    chant = "I will check the configuration file once more now. " * 12
    early.tap.complete({"id": "c1", "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "", "reasoning_content": chant}}]})
    third = guard.inspect(incoming(second + step("read_file", {"path": "third.toml"}, "[db]")))
    # The chant was in turn 3's reasoning: the warning goes after turn 3's result, not after turn 4's.
    assert third.headers["X-Loopwarden-Warning"] == "1/2 content"
    sent = orjson.loads(third.body)["messages"]
    assert sent[len(second)]["content"].startswith("[loopwarden] ") and len(sent) == len(second) + 3


def test_every_stop_of_a_task_names_one_link_kept_once():
    facts = Facts()
    checking = inspector(facts)
    request = incoming(looping(7))
    stops = [checking.inspect(request) for _ in range(3)]  # the agent retrying its stopped request
    assert all(isinstance(stop, Stop) for stop in stops)
    assert len({stop.body for stop in stops}) == 1 and b"/loopwarden/resume/" in stops[0].body
    assert [session for session, _ in facts.links] == ["s1"]  # drawn and kept once
