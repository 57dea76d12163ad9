"""The detection log as users see it: the HTTP API, the console script, replicas, and key hygiene."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.agent import Agent
from tests.fake_upstream import Turn

CONTENT = "def main():\n    return 1\n"
ROOT = Path(__file__).resolve().parents[1]


async def same_calls(agent: Agent, upstream, count: int) -> None:
    for _ in range(count):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "a.py"})]))
        await agent.turn()
        agent.answer(CONTENT)


async def loop_until_stopped(agent: Agent, upstream) -> None:
    """Seven identical calls: the 6th and 7th requests carry the warnings, the 8th is refused."""
    import openai

    await same_calls(agent, upstream, 7)
    with pytest.raises(openai.BadRequestError):
        await agent.turn()


async def wait_for(predicate, timeout: float = 10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await predicate()
        if result or asyncio.get_running_loop().time() > deadline:
            return result
        await asyncio.sleep(0.1)


async def api(method: str, url: str, token: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, headers=headers) as response:
            return response.status, await response.json()


async def test_detections_reach_the_api_with_filters_and_paging(upstream, proxy_factory, database_url):
    running = await proxy_factory(upstream.url, database_url=database_url, admin_token="admin-secret")
    agent = Agent(running.url, headers={"X-Loopwarden-Session": "run-1"})
    await loop_until_stopped(agent, upstream)
    await agent.close()
    base = f"{running.root}/loopwarden/api"

    async def logged():
        status, body = await api("GET", f"{base}/detections?session=run-1", "admin-secret")
        return body["data"] if status == 200 and len(body["data"]) == 3 else None

    data = await wait_for(logged)
    assert [(d["episode"], d["action"], d["type"]) for d in data] == [
        (3, "stopped", "tool_call"), (2, "warned", "tool_call"), (1, "warned", "tool_call")]
    assert data[0]["tokens_saved_estimate"] > 0
    assert data[2]["detail"]["tool"] == "read_file"
    assert data[2]["request_id"].startswith("req-")

    status, page = await api("GET", f"{base}/detections?limit=2", "admin-secret")
    assert status == 200 and len(page["data"]) == 2 and page["next_cursor"]
    status, rest = await api("GET", f"{base}/detections?limit=2&cursor={page['next_cursor']}", "admin-secret")
    assert [d["episode"] for d in rest["data"]] == [1] and rest["next_cursor"] is None
    status, body = await api("GET", f"{base}/detections?since=soon", "admin-secret")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = await api("GET", f"{base}/detections?type=bogus", "admin-secret")
    assert status == 400

    status, stats = await api("GET", f"{base}/stats", "admin-secret")
    assert stats["by_action"] == {"warned": 2, "stopped": 1, "cut": 0} and stats["sessions_affected"] == 1
    status, session = await api("GET", f"{base}/sessions/run-1", "admin-secret")
    assert status == 200 and len(session["data"][0]["timeline"]) == 3
    # The session names the agent that sent it (here the openai SDK) and its first prompt.
    assert session["data"][0]["agent"].startswith("OpenAI SDK (Python) ")
    assert session["data"][0]["title"] == "Fix the failing test."
    status, listed = await api("GET", f"{base}/sessions", "admin-secret")
    assert [(s["session_id"], s["title"]) for s in listed["data"]] == [("run-1", "Fix the failing test.")]

    # Auth: no token is refused; a client key sees only its own sessions.
    assert (await api("GET", f"{base}/detections"))[0] == 401
    status, own = await api("GET", f"{base}/detections", "sk-agent-key-123")
    assert status == 200 and len(own["data"]) == 3
    # A token that is neither the admin token nor a key with sessions is refused, not shown an empty log.
    status, other = await api("GET", f"{base}/detections", "sk-someone-else")
    assert status == 401 and other["error"]["type"] == "authentication_error"
    assert (await api("POST", f"{base}/sessions/run-1/disable", "sk-someone-else"))[0] == 401
    # Another agent's key that has sessions of its own sees none of this one's.
    stranger = Agent(running.url, api_key="sk-stranger", headers={"X-Loopwarden-Session": "theirs"})
    upstream.script.append(Turn(content="hi"))
    await stranger.turn()
    await stranger.close()
    status, other = await api("GET", f"{base}/detections", "sk-stranger")
    assert status == 200 and other["data"] == []
    assert (await api("POST", f"{base}/sessions/run-1/disable", "sk-stranger"))[0] == 404


async def test_reset_and_disable_take_effect_on_the_next_request(upstream, proxy):
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "ops"})
    await loop_until_stopped(agent, upstream)
    base = f"{proxy.root}/loopwarden/api/sessions/ops"
    status, body = await api("POST", f"{base}/reset")  # loopback, no token configured
    # Everything up to the last request the proxy saw (the refused one) is forgiven.
    assert status == 200 and body["data"][0]["reset_at_message"] == len(agent.messages)
    upstream.script.append(Turn(content="Starting over."))
    await agent.turn()  # not stopped: a fresh task from the reset
    assert not any(str(m.get("content", "")).startswith("[loopwarden]") for m in upstream.chat_requests[-1]["messages"])

    status, _ = await api("POST", f"{base}/disable")
    assert status == 200
    before = len(upstream.chat_requests)
    await same_calls(agent, upstream, 8)
    upstream.script.append(Turn(content="still going"))
    await agent.turn()
    assert all(not str(m.get("content", "")).startswith("[loopwarden]")
               for body in upstream.chat_requests[before:] for m in body["messages"])
    await agent.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _serve(database_url: str, upstream_url: str, log_level: str = "warning", *flags: str
                 ) -> tuple[subprocess.Popen, int]:
    """`loopwarden serve` as a process (with more `flags`), once it is ready: (process, port)."""
    port = _free_port()
    if not any(flag in ("--preset", "--tool-call-threshold") for flag in flags):
        flags = ("--tool-call-threshold", "5", *flags)  # the suite's ladder (tests/conftest.py)
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream", upstream_url,
         "--database-url", database_url, "--log-level", log_level, *flags],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                    if response.status == 200:
                        return process, port
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    process.kill()
    raise AssertionError(f"proxy did not start: {process.communicate()[1].decode()[-2000:]}")


async def test_two_proxy_processes_share_controls(upstream, postgres_url):
    database_url = postgres_url
    processes = [await _serve(database_url, upstream.url) for _ in range(2)]
    try:
        (_, port_a), (_, port_b) = processes
        first = Agent(f"http://127.0.0.1:{port_a}/v1", headers={"X-Loopwarden-Session": "replicated"})
        upstream.script.append(Turn(content="hello"))
        await first.turn()
        status, _ = await wait_for(lambda: api("POST", f"http://127.0.0.1:{port_a}/loopwarden/api/sessions/replicated"
                                                       "/disable"))
        assert status == 200
        second = Agent(f"http://127.0.0.1:{port_b}/v1", headers={"X-Loopwarden-Session": "replicated"})
        await asyncio.sleep(1.5)  # the other replica's poll interval
        await same_calls(second, upstream, 8)
        upstream.script.append(Turn(content="x"))
        await second.turn()  # a stop would raise: detection is off for this session on replica B too
        assert all(not str(m.get("content", "")).startswith("[loopwarden]")
                   for m in upstream.chat_requests[-1]["messages"])
        await first.close()
        await second.close()
    finally:
        for process, _ in processes:
            process.terminate()
            process.communicate(timeout=20)
            assert process.returncode == 0


async def test_api_keys_never_reach_the_database_or_the_logs(upstream, proxy_factory, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    secret = "sk-live-SECRET-do-not-store-4242"
    database = tmp_path / "keys.db"
    running = await proxy_factory(upstream.url, database_url=f"sqlite+aiosqlite:///{database}")
    agent = Agent(running.url, api_key=secret)
    await loop_until_stopped(agent, upstream)
    await agent.close()
    await running.runner.cleanup()  # flushes the log
    raw = b"".join(path.read_bytes() for path in tmp_path.glob("keys.db*"))
    assert b"read_file" in raw  # the log was written...
    assert secret.encode() not in raw  # ...without the key
    assert secret not in caplog.text


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


async def test_cli_queries_formats_and_errors(upstream, proxy_factory, tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/cli.db"
    running = await proxy_factory(upstream.url, database_url=url)
    agent = Agent(running.url, headers={"X-Loopwarden-Session": "cli-run"})
    await loop_until_stopped(agent, upstream)
    await agent.close()
    await running.runner.cleanup()

    table = await asyncio.to_thread(run_cli, "detections", "--database-url", url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.strip().splitlines()
    assert lines[0].split()[:4] == ["ID", "CREATED_AT", "SESSION_ID", "MODEL"]
    assert len(lines) == 4 and "read_file" in table.stdout  # header, two warnings, the stop

    as_json = await asyncio.to_thread(run_cli, "detections", "--format", "json", "--action", "warned",
                                      "--database-url", url)
    rows = orjson.loads(as_json.stdout)
    assert [r["episode"] for r in rows] == [2, 1] and rows[0]["created_at"].endswith("Z")
    as_csv = await asyncio.to_thread(run_cli, "detections", "--format", "csv", "--session", "cli-run",
                                     env={"LOOPWARDEN_DATABASE_URL": url})
    assert as_csv.stdout.splitlines()[0].startswith("id,created_at,session_id")
    assert len(as_csv.stdout.splitlines()) == 4
    none = await asyncio.to_thread(run_cli, "detections", "--session", "nope", "--database-url", url)
    assert none.stdout.strip() == "no detections"

    stats = await asyncio.to_thread(run_cli, "stats", "--format", "json", "--since", "1h", "--database-url", url)
    assert orjson.loads(stats.stdout)["by_type"]["tool_call"] == 3
    sessions = await asyncio.to_thread(run_cli, "sessions", "--database-url", url)
    assert "cli-run" in sessions.stdout
    header, row = sessions.stdout.splitlines()
    assert header.split()[-2:] == ["AGENT", "TITLE"]
    assert "OpenAI SDK (Python) " in row and row.endswith("Fix the failing test.")
    timeline = await asyncio.to_thread(run_cli, "session", "cli-run", "--database-url", url)
    assert "warned" in timeline.stdout and timeline.returncode == 0
    assert "  OpenAI SDK (Python) " in timeline.stdout and ": Fix the failing test." in timeline.stdout

    bad_since = await asyncio.to_thread(run_cli, "detections", "--since", "last tuesday", "--database-url", url)
    assert bad_since.returncode == 2
    assert bad_since.stderr.strip().count("\n") == 0 and "--since" in bad_since.stderr
    unreachable = await asyncio.to_thread(run_cli, "stats", "--database-url",
                                          f"postgresql+asyncpg://postgres@127.0.0.1:{_free_port()}/x")
    assert unreachable.returncode == 1
    assert unreachable.stderr.strip().count("\n") == 0 and "cannot use the database" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
    bad_flag = await asyncio.to_thread(run_cli, "serve", "--preset", "reckless")
    assert bad_flag.returncode == 2 and "preset" in bad_flag.stderr and "Traceback" not in bad_flag.stderr
