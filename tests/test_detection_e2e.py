"""Loop detection on the wire: real agent loops through loopwarden in front of the fake upstream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

from tests.agent import Agent
from tests.fake_upstream import Turn

CONTENT = "def main():\n    return load_config('settings.toml')\n"
SENTENCE = "I will now check the configuration file once more. "


def warnings_in(body: dict) -> list[tuple[int, str]]:
    """(position, text) of every injected warning in an upstream request."""
    return [(i, m["content"]) for i, m in enumerate(body["messages"])
            if isinstance(m.get("content"), str) and m["content"].startswith("[loopwarden]")]


async def loop_calls(agent: Agent, upstream, count: int, result, name: str = "read_file", args=None) -> None:
    for i in range(count):
        upstream.script.append(Turn(tool_calls=[(name, args or {"path": "src/app.py"})]))
        await agent.turn()
        agent.answer(result(i) if callable(result) else result)


@pytest.mark.parametrize("stream", [False, True])
async def test_identical_calls_warn_twice_then_stop(upstream, proxy, stream):
    agent = Agent(proxy.url, stream=stream)
    await loop_calls(agent, upstream, 5, CONTENT)
    assert all(warnings_in(body) == [] for body in upstream.chat_requests)

    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
    await agent.turn()
    sixth = upstream.chat_requests[5]
    (position, text), = warnings_in(sixth)
    assert position == len(sixth["messages"]) - 1  # after the 5th call's result
    assert sixth["messages"][position]["role"] == "system"
    assert text.startswith("[loopwarden] Loop detected (1/2): ") and "`read_file`" in text
    assert agent.last_headers["x-loopwarden-warning"] == "1/2 tool_call"
    # Nothing else in the request changed.
    assert [m for i, m in enumerate(sixth["messages"]) if i != position] == agent.messages[:-1]
    agent.answer(CONTENT)

    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
    await agent.turn()
    seventh = upstream.chat_requests[6]
    found = warnings_in(seventh)
    assert [t[: len("[loopwarden] Loop detected (1/2)")] for _, t in found] == [
        "[loopwarden] Loop detected (1/2)", "[loopwarden] Loop detected (2/2)"]
    assert found[0] == (position, text)  # the first warning stays where it was given
    assert found[1][0] == len(seventh["messages"]) - 1
    agent.answer(CONTENT)

    with pytest.raises(openai.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.code == "loop_detected"
    assert caught.value.body["type"] == "loop_detected"
    assert caught.value.response.headers["x-loopwarden-loop"] == "tool_call"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(upstream.chat_requests) == 7  # the stop never reached upstream
    await agent.close()


async def test_same_error_warns_after_the_third_call(upstream, proxy):
    agent = Agent(proxy.url)
    error = "Error: Cannot find module 'left-pad' (at 2026-11-22T08:00:0{}Z)"
    await loop_calls(agent, upstream, 3, lambda i: error.format(i))
    upstream.script.append(Turn(content="Trying again."))
    await agent.turn()
    (_, text), = warnings_in(upstream.chat_requests[3])
    assert text.startswith("[loopwarden] Loop detected (1/2)") and "failed 3 times with the same error" in text
    await agent.close()


async def test_alternation_is_a_cycle_on_the_tenth_call(upstream, proxy):
    agent = Agent(proxy.url)
    for i in range(10):
        name = "ls" if i % 2 == 0 else "read_file"
        await loop_calls(agent, upstream, 1, "same listing" if name == "ls" else CONTENT, name=name)
    assert all(warnings_in(body) == [] for body in upstream.chat_requests)
    upstream.script.append(Turn(content="Let me think."))
    await agent.turn()
    (_, text), = warnings_in(upstream.chat_requests[10])
    assert 'cycle of tool calls (`ls` with {"path":"src/app.py"} → `read_file` with {"path":"src/app.py"})' in text
    await agent.close()


async def test_same_failure_with_other_calls_between_is_tool_error(upstream, proxy):
    agent = Agent(proxy.url)
    for i in range(3):
        await loop_calls(agent, upstream, 1, "FAILED: 2 tests failed in 3.2s", name="run_build", args={"all": True})
        await loop_calls(agent, upstream, 1, f"edited line {i}", name="edit_file", args={"line": i})
    upstream.script.append(Turn(content="Hmm."))
    await agent.turn()
    assert "`run_build`" in warnings_in(upstream.chat_requests[-1])[0][1]
    await agent.close()


async def test_polls_with_changing_answers_and_whitelisted_tools_are_never_loops(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, whitelisted_tools="debugger_next")
    agent = Agent(running.url)
    await loop_calls(agent, upstream, 10, lambda i: f"job 42: {i * 10}% complete", name="job_status", args={"id": 42})
    await loop_calls(agent, upstream, 10, "paused at line 7", name="debugger_next", args={})
    upstream.script.append(Turn(content="Done."))
    await agent.turn()
    assert all(warnings_in(body) == [] for body in upstream.chat_requests)
    await agent.close()


async def test_chanting_stream_is_cut_and_upstream_stops(upstream, proxy):
    agent = Agent(proxy.url, stream=True)
    upstream.script.append(Turn(content=SENTENCE * 2000, chunk_chars=12, delay=0.0005))
    message = await agent.turn()
    assert agent.finish_reason == "stop"
    assert agent.extras[-1]["loopwarden"] == {"loop": "content", "action": "cut", "episode": "1/2"}
    assert len(message["content"]) < len(SENTENCE) * 20
    record = upstream.streams[-1]
    assert not record.completed and record.sent < record.planned // 10

    # The cut text, sent back as history, is the same episode: warned once, at its place.
    agent.say("Please continue.")
    upstream.script.append(Turn(content="Fine."))
    await agent.turn()
    assert warnings_in(upstream.chat_requests[-1]) == []  # a new user message: a new task
    await agent.close()


async def test_chanting_is_followed_by_a_warning_in_the_same_task(upstream, proxy):
    agent = Agent(proxy.url, stream=True)
    upstream.script.append(Turn(content=SENTENCE * 200, chunk_chars=7))
    await agent.turn()
    upstream.script.append(Turn(content="Sorry, moving on."))
    await agent.turn()
    (position, text), = warnings_in(upstream.chat_requests[-1])
    assert position == len(upstream.chat_requests[-1]["messages"]) - 1
    assert "keeps repeating the same text" in text and "check the configuration file" in text
    await agent.close()


async def test_the_same_text_in_a_code_fence_streams_to_the_end(upstream, proxy):
    agent = Agent(proxy.url, stream=True)
    upstream.script.append(Turn(content="```text\n" + (SENTENCE + "\n") * 300 + "```\nDone.", chunk_chars=20))
    message = await agent.turn()
    assert message["content"].endswith("Done.")
    assert upstream.streams[-1].completed
    await agent.close()


async def test_plan_mode_and_disable_header(upstream, proxy):
    agent = Agent(proxy.url, stream=True)
    upstream.script.append(Turn(content=SENTENCE * 100, chunk_chars=10))
    message = await agent.turn(**{"X-Loopwarden-Mode": "plan"})
    assert message["content"] == SENTENCE * 100
    other = Agent(proxy.url, task="another task", headers={"X-Loopwarden-Disable": "1"})
    await loop_calls(other, upstream, 8, CONTENT)
    upstream.script.append(Turn(content="x"))
    await other.turn()
    assert all(warnings_in(body) == [] for body in upstream.chat_requests)
    await agent.close()
    await other.close()


async def test_stop_reached_mid_stream_ends_with_the_error_event(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, max_warnings=0)
    agent = Agent(running.url, stream=True)
    upstream.script.append(Turn(content=SENTENCE * 500, chunk_chars=10))
    with pytest.raises(openai.APIError) as caught:
        await agent.turn()
    assert "Loop detected" in caught.value.message
    await agent.close()


async def test_a_new_user_message_starts_a_fresh_task(upstream, proxy):
    agent = Agent(proxy.url)
    await loop_calls(agent, upstream, 6, CONTENT)
    agent.say("Stop reading that file; write the fix.")
    await loop_calls(agent, upstream, 2, "ok", name="edit_file", args={"line": 1})
    assert len(warnings_in(upstream.chat_requests[5])) == 1  # the old task was warned
    assert warnings_in(upstream.chat_requests[-2]) == []
    assert warnings_in(upstream.chat_requests[-1]) == []
    await agent.close()


async def test_warning_role_is_configurable(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, warning_role="user")
    agent = Agent(running.url)
    await loop_calls(agent, upstream, 6, CONTENT)
    position, _ = warnings_in(upstream.chat_requests[-1])[0]
    assert upstream.chat_requests[-1]["messages"][position]["role"] == "user"
    # A user-role warning is not the user's new task: the loop goes on to the stop.
    await loop_calls(agent, upstream, 1, CONTENT)
    with pytest.raises(openai.BadRequestError):
        await agent.turn()
    await agent.close()


async def test_a_freshly_started_proxy_reaches_the_same_verdicts(upstream, proxy, proxy_factory):
    agent = Agent(proxy.url)
    await loop_calls(agent, upstream, 6, CONTENT)
    upstream.script.append(Turn(content="x"))
    await agent.turn()
    first = upstream.chat_requests[-1]
    fresh = await proxy_factory(upstream.url)
    replay = Agent(fresh.url)
    replay.messages = agent.messages[:-1]
    upstream.script.append(Turn(content="x"))
    await replay.turn()
    assert upstream.chat_requests[-1] == first
    await agent.close()
    await replay.close()


async def test_sessions_never_share_state(upstream, proxy):
    looping = Agent(proxy.url, headers={"X-Loopwarden-Session": "run-a"})
    calm = Agent(proxy.url, headers={"X-Loopwarden-Session": "run-b"})
    for i in range(6):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await looping.turn()
        looping.answer(CONTENT)
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": f"src/m{i}.py"})]))
        await calm.turn()
        calm.answer(CONTENT)
    assert calm.last_headers["x-loopwarden-session"] == "run-b"
    assert looping.last_headers["x-loopwarden-session"] == "run-a"
    assert warnings_in(upstream.chat_requests[-1]) == []  # calm's last request
    assert len(warnings_in(upstream.chat_requests[-2])) == 1  # looping's

    # Identical conversations from two different keys are two sessions, each with its own episodes,
    # even when the agents name their sessions alike.
    one = Agent(proxy.url, api_key="sk-tenant-one")
    two = Agent(proxy.url, api_key="sk-tenant-two")
    same_name = [Agent(proxy.url, api_key=key, headers={"X-Session-Id": "shared"}) for key in ("sk-a", "sk-b")]
    for agent in same_name:
        await loop_calls(agent, upstream, 5, CONTENT)
        upstream.script.append(Turn(content="x"))
        await agent.turn()
        assert len(warnings_in(upstream.chat_requests[-1])) == 1
        await agent.close()
    for agent in (one, two):
        await loop_calls(agent, upstream, 5, CONTENT)
        upstream.script.append(Turn(content="x"))
        await agent.turn()
    assert one.last_headers["x-loopwarden-session"] != two.last_headers["x-loopwarden-session"]
    assert len(warnings_in(upstream.chat_requests[-1])) == 1
    assert len(warnings_in(upstream.chat_requests[-7])) == 1
    for agent in (looping, calm, one, two):
        await agent.close()


async def test_session_header_order_and_fingerprint(upstream, proxy):
    agent = Agent(proxy.url, headers={"X-Session-Id": "from-agent", "Helicone-Session-Id": "from-gateway"})
    upstream.script.append(Turn(content="hi"))
    await agent.turn()
    assert agent.last_headers["x-loopwarden-session"] == "from-agent"
    plain = Agent(proxy.url)
    upstream.script.append(Turn(content="hi"))
    await plain.turn()
    plain.say("more")
    upstream.script.append(Turn(content="hi"))
    await plain.turn()
    first = plain.last_headers["x-loopwarden-session"]
    assert first.startswith("fp-")
    again = Agent(proxy.url)
    upstream.script.append(Turn(content="hi"))
    await again.turn()
    assert again.last_headers["x-loopwarden-session"] == first
    assert "x-loopwarden-session" not in {k.lower() for k in upstream.requests[-1].headers}
    await agent.close()
    await plain.close()
    await again.close()


NOTICE = "\n\n[loopwarden] Output cut: the same text repeated 10 times."


async def test_a_bursty_stream_is_cut_at_the_completing_delta_with_the_notice(upstream, proxy):
    # The same answer paced and in one burst: the client gets the same text, up to the same delta.
    seen = []
    for burst in (False, True):
        agent = Agent(proxy.url, stream=True, task=f"Explain the config ({burst}).")
        upstream.script.append(Turn(content=SENTENCE * 300, chunk_chars=7, burst=burst))
        message = await agent.turn()
        assert message["content"].endswith(NOTICE)
        assert agent.finish_reason == "stop"
        assert agent.extras[-1]["loopwarden"] == {"loop": "content", "action": "cut", "episode": "1/2"}
        seen.append(message["content"])
        await agent.close()
    assert seen[0] == seen[1]
    text = seen[1][: -len(NOTICE)]
    assert (SENTENCE * 300).startswith(text) and text.count(SENTENCE.strip()) <= 10
    assert len(text) % 7 == 0  # whole deltas only


async def test_after_a_cut_the_notice_is_the_proxys_text_and_the_cut_is_logged_once(upstream, proxy):
    agent = Agent(proxy.url, stream=True, headers={"X-Loopwarden-Session": "cut-once"})
    upstream.script.append(Turn(content=SENTENCE * 300, chunk_chars=9, burst=True))
    await agent.turn()
    for answer in ("Sorry, here is the summary instead.", "And the second part of it.", "Done."):
        upstream.script.append(Turn(content=answer))
        await agent.turn()
        (warning,) = warnings_in(upstream.chat_requests[-1])  # the cut's warning, re-created in its place
        assert warning[1].startswith("[loopwarden] Loop detected (1/2)")
    await agent.close()
    import aiohttp

    async with aiohttp.ClientSession() as http:
        for _ in range(100):  # the log is written off the request path: as soon as the writer has it
            async with http.get(f"{proxy.root}/loopwarden/api/detections",
                                params={"session": "cut-once"}) as response:
                rows = (await response.json())["data"]
            if rows and rows[0]["recovered"]:
                break
            await asyncio.sleep(0.05)
    assert [(r["type"], r["action"], r["recovered"]) for r in rows] == [("content", "cut", True)]


async def test_the_notice_can_be_turned_off(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, cut_notice=False)
    agent = Agent(running.url, stream=True)
    upstream.script.append(Turn(content=SENTENCE * 300, chunk_chars=7, burst=True))
    message = await agent.turn()
    assert "[loopwarden]" not in message["content"] and (SENTENCE * 300).startswith(message["content"])
    assert agent.extras[-1]["loopwarden"]["action"] == "cut"
    await agent.close()


PYTEST_REPORT = (Path(__file__).parent / "fixtures" / "tool_output" / "pytest.fail.txt").read_text()


def pytest_run(i: int) -> str:
    """The same failing report, with the new timestamp, pid and duration every run has."""
    return (f"[2026-11-24 10:{i:02d}:17] pytest started (pid {31000 + 17 * i})\n"
            + PYTEST_REPORT.replace("in 0.84s", f"in {0.8 + i / 100:.2f}s"))


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failing_test_run_with_other_calls_between_warns_twice_then_stops(upstream, proxy, stream):
    agent = Agent(proxy.url, stream=stream)
    warned_after = []
    for i in range(4):
        await loop_calls(agent, upstream, 1, pytest_run(i), name="run_tests", args={"path": "tests"})
        await loop_calls(agent, upstream, 1, "def add(a, b):\n    return a - b\n", name="read_file")
        warned_after.append(len(warnings_in(upstream.chat_requests[-1])))
        await loop_calls(agent, upstream, 1, f"edited line {i + 2}", name="edit_file", args={"line": i + 2})
    assert warned_after == [0, 0, 1, 2]  # (1/2) after the 3rd identical failure, (2/2) after the 4th
    first, second = (text for _, text in warnings_in(upstream.chat_requests[-1]))
    assert first.startswith("[loopwarden] Loop detected (1/2): `run_tests`") and "1 failed, 1 passed" in first
    assert second.startswith("[loopwarden] Loop detected (2/2)")
    await loop_calls(agent, upstream, 1, pytest_run(4), name="run_tests", args={"path": "tests"})
    sent = len(upstream.chat_requests)
    with pytest.raises(openai.BadRequestError) as caught:  # the request after the 5th failure is never sent
        await agent.turn()
    assert caught.value.code == "loop_detected"
    assert caught.value.response.headers["x-loopwarden-loop"] == "tool_error"
    assert "`run_tests`" in caught.value.message and len(upstream.chat_requests) == sent
    await agent.close()


async def test_three_different_calls_answered_by_the_same_error_are_warned(upstream, proxy):
    agent = Agent(proxy.url)
    unknown = "Error: tool 'search_code' not found. Available tools: read_file, run_build, edit_file."
    for query in ("parser", "class Parser", "def parse("):
        await loop_calls(agent, upstream, 1, unknown, name="search_code", args={"query": query})
    upstream.script.append(Turn(content="I will read the file instead."))
    await agent.turn()
    (_, text), = warnings_in(upstream.chat_requests[-1])
    assert text.startswith("[loopwarden] Loop detected (1/2): the same error answered your last 3 calls")
    assert '`search_code` with {"query":"class Parser"}' in text and "not found" in text
    await agent.close()


async def test_a_six_call_cycle_is_warned_after_its_fourth_round(upstream, proxy):
    agent = Agent(proxy.url)
    cycle = [("read_file", {"path": "a.py"}), ("ls", {"path": "src"}), ("read_file", {"path": "b.py"}),
             ("run_build", {"target": "all"}), ("ls", {"path": "tests"}), ("job_status", {"id": 7})]
    for _ in range(4):
        for name, args in cycle:
            await loop_calls(agent, upstream, 1, f"the same answer to {name} {args}", name=name, args=args)
    assert all(warnings_in(body) == [] for body in upstream.chat_requests)  # 23 calls and their results
    upstream.script.append(Turn(content="Let me step back."))
    await agent.turn()
    assert len(upstream.chat_requests) == 25
    (_, text), = warnings_in(upstream.chat_requests[-1])
    assert "cycle of tool calls" in text and '`run_build` with {"target":"all"}' in text and "4 times" in text
    await agent.close()


async def test_a_traceback_with_caret_lines_streams_whole_and_warns_nothing(upstream, proxy):
    agent = Agent(proxy.url, stream=True)
    traceback = ("The test fails at import:\n\nTraceback (most recent call last):\n"
                 '  File "/app/tests/test_report.py", line 3, in <module>\n'
                 "    from app.report import summarise_rows_by_region_and_quarter_with_archived_rows\n"
                 "    " + "^" * 76 + "\nImportError: cannot import name 'summarise_rows_by_region'\n\n"
                 "I will rename the import.")
    upstream.script.append(Turn(content=traceback, chunk_chars=3))
    message = await agent.turn()
    assert message["content"] == traceback and upstream.streams[-1].completed
    upstream.script.append(Turn(content="Renamed."))
    await agent.turn()
    assert warnings_in(upstream.chat_requests[-1]) == []
    await agent.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_default_ladder_warns_after_the_third_and_fourth_identical_calls_and_stops_the_fifth(
        upstream, proxy_factory, stream):
    """The default settings act before an agent's own guard (most give up at the 4th or 5th identical call)."""
    proxy = await proxy_factory(upstream.url, preset="default")
    agent = Agent(proxy.url, stream=stream)
    await loop_calls(agent, upstream, 3, CONTENT)
    assert all(warnings_in(body) == [] for body in upstream.chat_requests)
    await loop_calls(agent, upstream, 1, CONTENT)
    assert [t[:33] for _, t in warnings_in(upstream.chat_requests[3])] == ["[loopwarden] Loop detected (1/2):"]
    await loop_calls(agent, upstream, 1, CONTENT)
    assert agent.last_headers["x-loopwarden-warning"] == "2/2 tool_call"
    with pytest.raises(openai.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.code == "loop_detected" and len(upstream.chat_requests) == 5
    await agent.close()


async def test_the_same_question_turn_after_turn_is_warned_as_a_reply_loop_and_logged(upstream, proxy_factory):
    from tests.test_log_api import api, wait_for

    proxy = await proxy_factory(upstream.url, preset="default")
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "asking"})
    question = "Which of the {} config files should I change first? Tell me before I go on, please."
    for n in range(4):
        upstream.script.append(Turn(content=question.format(n + 3)))
        await agent.turn()
        agent.say("continue")
    upstream.script.append(Turn(content=question.format(7)))
    await agent.turn()
    (_, text), = warnings_in(upstream.chat_requests[4])
    assert text.startswith("[loopwarden] Loop detected (1/2): you gave the same reply 3 times in a row")
    assert agent.last_headers["x-loopwarden-warning"] == "1/2 reply"
    await agent.close()

    async def logged():
        status, body = await api("GET", f"{proxy.root}/loopwarden/api/detections?type=reply")
        return body["data"] if status == 200 and body["data"] else None

    (row,) = await wait_for(logged)
    assert (row["type"], row["action"], row["episode"], row["detail"]["repeats"]) == ("reply", "warned", 1, 3)
