"""Three `loopwarden serve` processes on one database behind a round-robin balancer (each request to the next
replica, none sticky), as `deploy/compose.yaml` runs them: every loop is warned twice and stopped at the same
call as on one replica, with one log record per episode, also with a replica killed mid-loop and with a chained
Responses conversation continued the moment its answer ends."""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web

from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.responses_agent import ResponsesAgent
from tests.test_log_api import _serve

ROOT = Path(__file__).resolve().parents[1]
CONTENT = "def main():\n    return load_config('settings.toml')\n"


class Balancer:
    """Round robin over the replicas, each request to the next; a replica that refuses the connection is
    skipped (as nginx's `proxy_next_upstream error` does)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.dead: set[int] = set()
        self._next = itertools.count()
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> "Balancer":
        self._http = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def close(self) -> None:
        await self._http.close()
        await self.runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        for _ in range(len(self.ports)):
            port = self.ports[next(self._next) % len(self.ports)]
            try:
                upstream = await self._http.request(request.method, f"http://127.0.0.1:{port}{request.path_qs}",
                                                    data=body, headers=headers)
            except aiohttp.ClientConnectionError:
                self.dead.add(port)
                continue
            async with upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in ("content-length",
                                                                                   "transfer-encoding")})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        return web.json_response({"error": {"message": "no replica answered"}}, status=502)


@pytest.fixture
async def fleet(upstream, postgres_url):
    """Three replicas (processes) on one migrated PostgreSQL database, behind the balancer."""
    subprocess.run([sys.executable, "-m", "proxy", "migrate", "--database-url", postgres_url], cwd=ROOT, check=True,
                   capture_output=True, timeout=60)
    replicas = [await _serve(postgres_url, upstream.url, "warning", "--no-migrate", "--llm-check", "false")
                for _ in range(3)]
    balancer = await Balancer([port for _, port in replicas]).start()
    balancer.processes = [process for process, _ in replicas]
    yield balancer
    await balancer.close()
    for process in balancer.processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.communicate, timeout=30)


async def records(fleet: Balancer, session: str, count: int) -> list[dict]:
    """The session's detections as any replica reads them, once `count` are written."""
    rows: list[dict] = []
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            async with http.get(f"http://127.0.0.1:{fleet.port}/loopwarden/api/detections",
                                params={"session": session}) as response:
                rows = (await response.json())["data"]
            if len(rows) >= count:
                break
            await asyncio.sleep(0.05)
    return sorted((r["episode"], r["action"], r["type"]) for r in rows)


EXPECTED = [(1, "warned", "tool_call"), (2, "warned", "tool_call"), (3, "stopped", "tool_call")]


def chat_warnings(body: dict) -> int:
    return sum(1 for m in body["messages"] if str(m.get("content") or "").startswith("[loopwarden]"))


def responses_warnings(body: dict) -> int:
    items = body["input"] if isinstance(body["input"], list) else []
    return sum(1 for i in items if isinstance(i, dict) and str(i.get("content") or "").startswith("[loopwarden]"))


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_loop_across_replicas_is_stopped_where_one_replica_stops_it(upstream, fleet, stream):
    agent = Agent(f"http://127.0.0.1:{fleet.port}/v1", stream=stream, headers={"X-Loopwarden-Session": f"c{stream}"})
    for _ in range(7):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await agent.turn()
        agent.answer(CONTENT)
    assert [chat_warnings(b) for b in upstream.chat_requests] == [0, 0, 0, 0, 0, 1, 2]
    with pytest.raises(openai.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.code == "loop_detected" and len(upstream.chat_requests) == 7
    assert await records(fleet, f"c{stream}", 3) == EXPECTED
    await agent.close()


@pytest.mark.parametrize("chained", [False, True])
async def test_a_responses_loop_across_replicas_full_input_or_chained_without_a_pause(upstream, fleet, chained):
    agent = ResponsesAgent(f"http://127.0.0.1:{fleet.port}/v1", chained=chained,
                           headers={"X-Loopwarden-Session": f"r{chained}"})
    for _ in range(7):  # each request as soon as the last answer is complete, as a fast tool allows
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await agent.turn()
        agent.answer(CONTENT)
    # Full input carries every warning each time; a chained request only the new one (the service keeps it).
    expected = [0, 0, 0, 0, 0, 1, 1] if chained else [0, 0, 0, 0, 0, 1, 2]
    assert [responses_warnings(b) for b in upstream.responses_requests] == expected
    with pytest.raises(openai.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.code == "loop_detected" and len(upstream.responses_requests) == 7
    assert await records(fleet, f"r{chained}", 3) == EXPECTED
    await agent.close()


async def test_a_replica_killed_mid_loop_changes_no_verdict(upstream, fleet):
    agent = Agent(f"http://127.0.0.1:{fleet.port}/v1", headers={"X-Loopwarden-Session": "killed"})
    for call in range(7):
        if call == 3:
            fleet.processes[1].kill()  # SIGKILL: nothing flushed, nothing said
            fleet.processes[1].wait(timeout=10)
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await agent.turn()
        agent.answer(CONTENT)
    assert fleet.dead == {fleet.ports[1]}
    assert [chat_warnings(b) for b in upstream.chat_requests] == [0, 0, 0, 0, 0, 1, 2]
    with pytest.raises(openai.BadRequestError):
        await agent.turn()
    assert await records(fleet, "killed", 3) == EXPECTED
    await agent.close()
