"""The captured agents' requests sent through loopwarden in front of the fake upstream, in the order the real
agents sent them, and loops of the shapes real agents make, through the proxy."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.agent import Agent
from tests.fake_upstream import Turn

AGENTS = Path(__file__).parent / "fixtures" / "agents"
# The headers each agent sent with every request of its run (credentials and the connection's own left out):
# as installed, and with the setting that names it (README: Agents it reads).
HEADERS = json.loads((AGENTS / "headers.json").read_text())


def warnings_in(body: dict) -> list[str]:
    return [m["content"][:34] for m in body["messages"]
            if isinstance(m.get("content"), str) and m["content"].startswith("[loopwarden]")]


async def send_run(proxy, agent: str, headers: dict | None = None) -> list[tuple[int, str]]:
    """Every captured request of the run, in order: (status, session id) of each answer."""
    answers = []
    async with aiohttp.ClientSession() as client:
        for line in (AGENTS / f"{agent}.jsonl").read_bytes().splitlines():
            async with client.post(f"{proxy.url}/chat/completions", data=line,
                                   headers={**(headers or {}), "Authorization": "Bearer k",
                                            "Content-Type": "application/json"}) as r:
                await r.read()
                answers.append((r.status, r.headers.get("X-Loopwarden-Session", "")))
    return answers


async def logged(proxy, detections: int) -> tuple[list[tuple], list[tuple]]:
    """The sessions (id, agent, title) and detections (type, action, episode, turn) the client's key sees, once
    the expected detections are written."""
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer k"}) as client:
        for _ in range(100):
            async with client.get(f"{proxy.root}/loopwarden/api/detections") as r:
                found = (await r.json())["data"] if r.status == 200 else []
            if len(found) >= detections:
                break
            await asyncio.sleep(0.1)
        async with client.get(f"{proxy.root}/loopwarden/api/sessions") as r:
            sessions = (await r.json())["data"]
    return ([(s["session_id"], s["agent"], s["title"]) for s in sessions],
            [(d["type"], d["action"], d["episode"], d["turn"]) for d in reversed(found)])


async def test_aider_run_is_one_session_and_its_third_failed_edit_is_warned(upstream, proxy):
    answers = await send_run(proxy, "aider")
    assert [status for status, _ in answers] == [200] * 4
    assert len({session for _, session in answers}) == 1
    assert [warnings_in(body) for body in upstream.chat_requests] == [[], [], [], ["[loopwarden] Loop detected (1/2): "]]
    last = upstream.chat_requests[-1]["messages"]
    at = next(i for i, m in enumerate(last) if str(m.get("content")).startswith("[loopwarden]"))
    assert last[at - 1]["content"].startswith("# 1 SEARCH/REPLACE block failed to match!")


@pytest.mark.parametrize(("headers", "agent"),
                         [("aider", "Aider"), ("aider-named", "Aider 0.86.2")])
async def test_aider_run_in_a_git_repository_is_one_session_named_and_warned(upstream, proxy, headers, agent):
    # Aider 0.86.2 in a git repository, its edit failing to match three times. Aider sends only its SDK's
    # headers; its `aider/extra_params` setting with a User-Agent names it.
    answers = await send_run(proxy, "aider-git", HEADERS[headers])
    assert [status for status, _ in answers] == [200] * 4
    sessions, detections = await logged(proxy, 1)
    assert sessions == [(answers[0][1], agent, "fix the bug in calc.py")]
    assert detections == [("tool_error", "warned", 1, 3)]
    assert [len(warnings_in(body)) for body in upstream.chat_requests] == [0, 0, 0, 1]


async def test_aider_run_with_its_examples_and_reminder_is_one_session_titled_by_the_prompt(upstream, proxy):
    # A model Aider has no settings for: its example conversation opens every request, and its reminder is
    # appended to the newest message only.
    answers = await send_run(proxy, "aider-examples", HEADERS["aider"])
    sessions, detections = await logged(proxy, 1)
    assert len({session for _, session in answers}) == 1
    assert [title for _, _, title in sessions] == ["fix the bug in calc.py"]
    assert detections == [("tool_error", "warned", 1, 3)]


async def test_aider_under_the_strict_preset_is_warned_at_its_last_request(upstream, proxy_factory):
    # Aider's own limit (3 reflections) ends the run at the request that carries the warning, whatever the preset.
    proxy = await proxy_factory(upstream.url, preset="strict")
    answers = await send_run(proxy, "aider-git", HEADERS["aider"])
    assert [status for status, _ in answers] == [200] * 4
    _, detections = await logged(proxy, 1)
    assert detections == [("tool_call", "warned", 1, 3)]


@pytest.mark.parametrize(("headers", "agent"), [("cline", "Cline"), ("cline-named", "Cline 3.0.65")])
async def test_cline_run_is_one_session_named_and_warned_as_tool_error(upstream, proxy, headers, agent):
    # Cline CLI 3.0.65 sends no version of its own; its provider's `headers` setting with a User-Agent names it.
    answers = await send_run(proxy, "cline", HEADERS[headers])
    assert [status for status, _ in answers] == [200] * 5
    sessions, detections = await logged(proxy, 2)
    assert sessions == [(answers[0][1], agent, "read the settings in config/settings.json and summarise them")]
    assert detections == [("tool_error", "warned", 1, 3), ("tool_error", "warned", 2, 4)]


async def test_cline_under_the_strict_preset_is_stopped_before_its_own_guard(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, preset="strict")
    answers = await send_run(proxy, "cline", HEADERS["cline"])
    assert [status for status, _ in answers] == [200, 200, 200, 200, 400]
    _, detections = await logged(proxy, 2)
    assert detections == [("tool_call", "warned", 1, 3), ("tool_call", "stopped", 2, 4)]


async def test_cline_error_array_is_warned(upstream, proxy):
    answers = await send_run(proxy, "cline")
    assert [status for status, _ in answers] == [200] * 5
    assert [len(warnings_in(body)) for body in upstream.chat_requests] == [0, 0, 0, 1, 2]
    assert "failed 3 times with the same error" in next(
        m["content"] for m in upstream.chat_requests[3]["messages"] if str(m.get("content")).startswith("[loop"))


async def test_mastra_one_message_history_is_warned_twice_then_stopped(upstream, proxy):
    answers = await send_run(proxy, "mastra")
    assert [status for status, _ in answers] == [200, 200, 200, 200, 200, 400]
    assert [len(warnings_in(body)) for body in upstream.chat_requests] == [0, 0, 0, 1, 2]
    fifth = upstream.chat_requests[4]["messages"]
    # Both warnings after the results that answer the one assistant message, in order.
    assert [m["role"] for m in fifth[-2:]] == ["system", "system"] and fifth[-3]["role"] == "tool"


async def test_a_response_of_identical_parallel_calls_is_a_loop(upstream, proxy):
    agent = Agent(proxy.url)
    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "a.py"})] * 5))
    await agent.turn()
    agent.answer("contents of a.py")
    await agent.turn()
    assert warnings_in(upstream.chat_requests[1]) == ["[loopwarden] Loop detected (1/2): "]
    await agent.close()
    # Seven in one response are the 5th, 6th and 7th repeat: two warnings and the stop, at once.
    agent = Agent(proxy.url, task="Read a.py seven times.")
    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "a.py"})] * 7))
    await agent.turn()
    agent.answer("contents of a.py")
    with pytest.raises(openai.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.response.headers["x-loopwarden-loop"] == "tool_call"
    await agent.close()


async def test_the_same_edit_five_times_with_changing_results_is_warned(upstream, proxy):
    agent = Agent(proxy.url)
    edit = {"path": "src/app.py", "old_str": "x - y", "new_str": "x + y"}
    for i in range(5):
        upstream.script.append(Turn(tool_calls=[("edit_file", edit)]))
        await agent.turn()
        agent.answer(f"Edited src/app.py ({100 + i} lines)")
    await agent.turn()
    (text,) = [m["content"] for m in upstream.chat_requests[5]["messages"]
               if str(m.get("content")).startswith("[loopwarden]")]
    assert "`edit_file`" in text and "its result changed" in text
    await agent.close()


NPM = ("npm ERR! code E404\nnpm ERR! 404 Not Found - GET https://registry.npmjs.org/left-padd - Not found\n\n"
       "npm ERR! A complete log of this run can be found in: /root/.npm/_logs/2026-11-24T01_05_{:02d}_{:03d}Z-debug-0.log")


async def test_a_repeated_npm_failure_is_warned_after_the_third(upstream, proxy):
    agent = Agent(proxy.url)
    for i in range(3):
        upstream.script.append(Turn(tool_calls=[("run_build", {"command": "npm install left-padd"})]))
        await agent.turn()
        agent.answer(NPM.format(i * 7, i * 111))
    await agent.turn()
    assert [len(warnings_in(body)) for body in upstream.chat_requests] == [0, 0, 0, 1]
    await agent.close()


async def test_two_edits_in_turn_are_warned_by_round_fifteen(upstream, proxy):
    agent = Agent(proxy.url)
    first = {"path": "a.py", "old_str": "x - y", "new_str": "x + y"}
    second = {"path": "a.py", "old_str": "x + y", "new_str": "x - y"}
    for i in range(15):
        for edit in (first, second):
            upstream.script.append(Turn(tool_calls=[("edit_file", edit)]))
            await agent.turn()
            agent.answer(f"Edited a.py, revision {len(agent.messages)}")
    await agent.turn()
    counts = [len(warnings_in(body)) for body in upstream.chat_requests]
    assert counts[:30] == [0] * 30 and counts[30] == 1
    await agent.close()


@pytest.mark.parametrize("count", [3])
async def test_a_usage_message_three_times_is_warned(upstream, proxy, count):
    agent = Agent(proxy.url)
    for i in range(count):
        upstream.script.append(Turn(tool_calls=[("edit_file", {"command": f"edit {10 + i}"})]))
        await agent.turn()
        agent.answer("Usage: edit <start_line>:<end_line>")
    await agent.turn()
    assert [len(warnings_in(body)) for body in upstream.chat_requests] == [0, 0, 0, 1]
    await agent.close()


async def test_a_harness_format_error_with_a_changing_count_is_warned_after_three_and_is_no_new_task(upstream, proxy):
    agent = Agent(proxy.url)
    error = ("Format error:\n\n<error>\nFound {n} actions.\n</error>\n\nPlease always provide EXACTLY ONE action "
             "in triple backticks, found {n} actions.")
    for n in (3, 2, 4):
        upstream.script.append(Turn(content="THOUGHT: both.\n\n```bash\nls\n```\n\n```bash\npwd\n```"))
        await agent.turn()
        agent.messages.append({"role": "user", "content": error.format(n=n)})
    await agent.turn()
    assert [len(warnings_in(body)) for body in upstream.chat_requests] == [0, 0, 0, 1]
    await agent.close()
