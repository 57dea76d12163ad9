"""Each session's status, read from its current task: `ok`, `warned`, `stopped` or `off`, the same in the API, the
CLI's `sessions` (a table that fits a terminal) and its `session ID` (task by task)."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.test_log_api import loop_until_stopped, run_cli, same_calls, wait_for


async def statuses(root: str) -> dict[str, str]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{root}/loopwarden/api/sessions") as response:
            return {item["session_id"]: item["status"] for item in (await response.json())["data"]}


async def test_a_sessions_status_follows_its_current_task(upstream, proxy_factory, database_url):
    url = database_url  # SQLite and PostgreSQL
    proxy = await proxy_factory(upstream.url, database_url=url)
    agents = {name: Agent(proxy.url, headers={"X-Loopwarden-Session": name})
              for name in ("calm", "warned", "stopped", "moved-on", "switched-off")}
    upstream.script.append(Turn(content="All tests pass."))
    await agents["calm"].turn()
    await same_calls(agents["warned"], upstream, 6)  # the 6th request carries the first warning
    await loop_until_stopped(agents["stopped"], upstream)
    await loop_until_stopped(agents["moved-on"], upstream)
    agents["moved-on"].say("Leave that file; update the changelog instead.")  # a person's new task
    upstream.script.append(Turn(content="Done."))
    await agents["moved-on"].turn()
    upstream.script.append(Turn(content="Hello."))
    await agents["switched-off"].turn()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}/loopwarden/api/sessions/switched-off/disable") as response:
            assert response.status == 200
    expected = {"calm": "ok", "warned": "warned", "stopped": "stopped", "moved-on": "ok", "switched-off": "off"}
    assert await wait_for(lambda: _equal(statuses(proxy.root), expected)), await statuses(proxy.root)

    # A reset (as a resume does) forgives the stop: the session is ok again, until it loops again.
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}/loopwarden/api/sessions/stopped/reset") as response:
            assert response.status == 200
    assert (await statuses(proxy.root))["stopped"] == "ok"
    for agent in agents.values():
        await agent.close()
    await proxy.runner.cleanup()

    table = await asyncio.to_thread(run_cli, "sessions", "--database-url", url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["SESSION", "STATUS", "LAST", "SEEN", "REQUESTS", "DETECTIONS", "AGENT", "TITLE"]
    rows = {line.split()[0]: line.split()[1] for line in lines[1:]}
    assert rows == {**expected, "stopped": "ok"}
    assert max(len(line) for line in lines) <= 120, table.stdout
    as_json = orjson.loads((await asyncio.to_thread(run_cli, "sessions", "--format", "json", "--database-url",
                                                    url)).stdout)
    assert {item["session_id"]: item["status"] for item in as_json} == rows

    timeline = await asyncio.to_thread(run_cli, "session", "moved-on", "--database-url", url)
    said = timeline.stdout.splitlines()
    assert said[0].startswith("session moved-on (tenant ") and ": ok, " in said[0]
    assert said[2] == "  task 1" and all(line.startswith("    ") for line in said[3:6])
    assert [line.split()[2] for line in said[3:6]] == ["warned", "warned", "stopped"]


async def _equal(found, expected) -> bool:
    return await found == expected


async def test_the_session_timeline_separates_tasks(upstream, proxy_factory, tmp_path):
    """Two loops in two tasks of one session: `session ID` shows them under task 1 and task 2."""
    url = f"sqlite+aiosqlite:///{tmp_path}/tasks.db"
    proxy = await proxy_factory(upstream.url, database_url=url)
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "two tasks"})
    await same_calls(agent, upstream, 6)
    agent.say("Now fix the other test.")
    await same_calls(agent, upstream, 6)
    await agent.close()
    await proxy.runner.cleanup()
    timeline = await asyncio.to_thread(run_cli, "session", "two tasks", "--database-url", url)
    said = timeline.stdout.splitlines()
    assert ": warned, " in said[0]
    assert [line for line in said if line.startswith("  task")] == ["  task 1", "  task 2"]
