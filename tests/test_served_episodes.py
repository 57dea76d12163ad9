"""What real agents showed: every episode served is logged once, reruns and twins included; the stop
names the loop its warnings named; the recovery rate counts only models that moved on; session headers."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import openai
import orjson
import pytest

from tests.agent import Agent
from tests.fake_upstream import Turn

CONTENT = "def main():\n    return load_config('settings.toml')\n"


def warnings_in(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if str(m.get("content") or "").startswith("[loopwarden]")]


async def logged(proxy, session: str, count: int, timeout: float = 10.0) -> list[dict]:
    """The session's detections, oldest first, once `count` of them are in the log."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(f"{proxy.root}/loopwarden/api/detections",
                                params={"session": session, "limit": 100}) as response:
                rows = (await response.json())["data"]
            if len(rows) >= count or asyncio.get_running_loop().time() > deadline:
                return rows[::-1]
            await asyncio.sleep(0.05)


async def stats(proxy) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/loopwarden/api/stats") as response:
            return await response.json()


async def detections_metric(proxy) -> dict[tuple[str, str], float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/metrics") as response:
            text = await response.text()
    counts = {}
    for line in text.splitlines():
        if line.startswith("loopwarden_detections_total{"):
            labels, value = line[len("loopwarden_detections_total{"):].split("} ")
            parts = dict(item.split("=") for item in labels.split(","))
            if parts["mode"].strip('"') == "enforce":
                counts[(parts["type"].strip('"'), parts["action"].strip('"'))] = float(value)
    return counts


async def run_to_the_stop(agent: Agent, upstream, result=CONTENT) -> None:
    """Seven identical calls (warned in the 6th and 7th requests), the 8th request refused."""
    for _ in range(7):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await agent.turn()
        agent.answer(result)
    with pytest.raises(openai.BadRequestError):
        await agent.turn()


async def test_a_rerun_and_two_twins_each_log_their_own_episodes_and_a_resend_logs_nothing(upstream, proxy):
    # The same prompt, no session header: every run has the same fingerprint session.
    first = Agent(proxy.url)
    await run_to_the_stop(first, upstream)
    session = first.last_headers["x-loopwarden-session"]
    assert session.startswith("fp-")
    rows = await logged(proxy, session, 3)
    assert [(r["episode"], r["action"]) for r in rows] == [(1, "warned"), (2, "warned"), (3, "stopped")]

    # A resend of the refused request, and of a request that carried a warning: nothing new.
    with pytest.raises(openai.BadRequestError):
        await first.turn()
    resend = Agent(proxy.url)
    resend.messages = first.messages[:14]  # the 6th request, with its first warning
    upstream.script.append(Turn(content="ok"))
    await resend.turn()
    await asyncio.sleep(0.5)
    assert len(await logged(proxy, session, 4, timeout=0.5)) == 3

    # The same prompt run again, then two twins started at once: each run is its own task.
    rerun = Agent(proxy.url)
    await run_to_the_stop(rerun, upstream)
    twins = [Agent(proxy.url), Agent(proxy.url)]
    await asyncio.gather(*(run_to_the_stop(twin, upstream) for twin in twins))
    rows = await logged(proxy, session, 12)
    assert len(rows) == 12 and len({r["task"] for r in rows}) == 4
    assert sorted(r["action"] for r in rows) == ["stopped"] * 4 + ["warned"] * 8
    assert await detections_metric(proxy) == {("tool_call", "warned"): 8.0, ("tool_call", "stopped"): 4.0}
    for agent in (first, resend, rerun, *twins):
        await agent.close()


async def test_a_failing_call_is_warned_and_stopped_as_tool_error(upstream, proxy):
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "failing"})
    failure = "Error: ENOENT: no such file or directory, open '/repo/src/app.py'"
    for _ in range(4):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await agent.turn()
        agent.answer(failure)
    assert [w[:34] for w in warnings_in(upstream.chat_requests[-1])] == ["[loopwarden] Loop detected (1/2): "]
    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
    await agent.turn()
    agent.answer(failure)
    assert "failed 4 times with the same error" in warnings_in(upstream.chat_requests[-1])[1]
    with pytest.raises(openai.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.response.headers["x-loopwarden-loop"] == "tool_error"
    assert "`read_file` with {\"path\":\"src/app.py\"} failed 5 times with the same error" in caught.value.message
    assert "same result each time" not in caught.value.message
    rows = await logged(proxy, "failing", 3)
    assert [(r["type"], r["action"]) for r in rows] == [("tool_error", "warned")] * 2 + [("tool_error", "stopped")]
    await agent.close()


async def test_the_recovery_rate_counts_only_models_that_moved_on(upstream, proxy):

    async def run(agent, turns: list[Turn]) -> None:
        for _ in range(5):  # stuck on one call: the 5th completes the episode, warned in the next request
            upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
            await agent.turn()
            agent.answer(CONTENT)
        for turn in turns:
            upstream.script.append(turn)
            await agent.turn()
            if turn.tool_calls:
                agent.answer(f"done: {turn.tool_calls[0][1]}")

    def edit(line: int) -> Turn:
        return Turn(tool_calls=[("edit_file", {"path": "src/app.py", "line": line})])

    agents = {name: Agent(proxy.url, headers={"X-Loopwarden-Session": name}, stream=name == "answered")
              for name in ("answered", "went-on", "broke-off", "came-back", "quitter", "repeater")}
    # Warned; it edited the file and ended the task with its answer: recovered.
    await run(agents["answered"], [edit(3), Turn(content="Fixed: the file reads the new setting now.")])
    # Warned; five turns of other work, no further episode: recovered.
    await run(agents["went-on"], [edit(n) for n in range(5)] + [edit(9)])
    # Warned; one other call, then the agent broke off (its own guard, a person's Ctrl-C): not yet recovered.
    await run(agents["broke-off"], [edit(3)])
    # Warned; one other call, then the loop's call again, then an answer: the loop came back.
    await run(agents["came-back"], [edit(3), Turn(tool_calls=[("read_file", {"path": "src/app.py"})]),
                                    Turn(content="Done.")])
    # Looped to the 5th call, then the agent quit before any request carried the warning: nothing logged.
    quitter = agents["quitter"]
    for _ in range(5):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await quitter.turn()
        quitter.answer(CONTENT)
    # Warned, and the model answered with the same call again, then the run ended: no recovery.
    await run(agents["repeater"], [Turn(tool_calls=[("read_file", {"path": "src/app.py"})])])
    # Stopped: no recovery either.
    stopped = Agent(proxy.url, headers={"X-Loopwarden-Session": "stopped"})
    await run_to_the_stop(stopped, upstream)

    assert await logged(proxy, "quitter", 1, timeout=0.5) == []  # and the log has caught up with the rest
    for name, recovered in (("answered", True), ("went-on", True), ("broke-off", False), ("came-back", False)):
        rows = await logged(proxy, name, 1)
        assert [(r["action"], r["recovered"]) for r in rows] == [("warned", recovered)], name
    result = await stats(proxy)
    assert (result["warned_tasks"], result["recovered_tasks"]) == (6, 2)
    for agent in (*agents.values(), stopped):
        await agent.close()


@pytest.mark.parametrize("header", ["session-id", "thread-id", "X-Session-Affinity", "X-Litellm-Session-Id"])
async def test_session_headers_agents_send(upstream, proxy, header):
    agent = Agent(proxy.url, headers={header: "run-77"})
    upstream.script.append(Turn(content="hi"))
    await agent.turn()
    assert agent.last_headers["x-loopwarden-session"] == "run-77"
    await agent.close()


async def test_codex_headers_prefer_the_session_over_the_thread(upstream, proxy):
    agent = Agent(proxy.url, headers={"thread-id": "thread-1", "session-id": "session-1"})
    upstream.script.append(Turn(content="hi"))
    await agent.turn()
    assert agent.last_headers["x-loopwarden-session"] == "session-1"
    await agent.close()


async def test_a_client_leaving_after_the_last_event_leaves_no_traceback(upstream, proxy, caplog):
    caplog.set_level(logging.DEBUG)
    for _ in range(5):
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{proxy.url}/chat/completions", json={
                    "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as response:
                await response.content.readuntil(b"data: [DONE]\n\n")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proxy.url}/files/file-1/content") as response:
                await response.content.readuntil(b'{"line":19}\n')
    await asyncio.sleep(0.2)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], \
        [r.getMessage() for r in caplog.records if r.exc_info]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/healthz") as response:
            assert orjson.loads(await response.read()) == {"status": "ok"}
