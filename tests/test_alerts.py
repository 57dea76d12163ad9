"""Alerts to a webhook, against a real HTTP receiver: one per episode, in the background, never in an agent's way."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from aiohttp import web

from proxy.server import alerts
from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.test_detection_e2e import CONTENT


class Receiver:
    """A webhook endpoint: records what it is sent; can be slow, or refuse with a status."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        self.status, self.delay = status, delay
        self.received: list[dict] = []
        self.attempts = 0
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)

    async def _hook(self, request: web.Request) -> web.Response:
        self.attempts += 1
        body = await request.json()
        await asyncio.sleep(self.delay)
        if self.status == 200:
            self.received.append(body)
        return web.Response(status=self.status, text="ok")

    async def start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"  # type: ignore[union-attr]

    async def until(self, count: int, timeout: float = 5.0) -> list[dict]:
        deadline = asyncio.get_running_loop().time() + timeout
        while len(self.received) < count and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        return self.received


@pytest.fixture
async def receiver():
    hook = Receiver()
    yield hook
    await hook.runner.cleanup()


async def loop_to_the_stop(agent: Agent, upstream) -> openai.BadRequestError:
    for _ in range(7):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await agent.turn()
        agent.answer(CONTENT)
    with pytest.raises(openai.BadRequestError) as caught:
        await agent.turn()
    return caught.value


async def deliveries(proxy) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/metrics") as response:
            text = await response.text()
    return {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
            if line.startswith("loopwarden_webhook_deliveries_total{")}


async def test_a_stop_is_sent_once_and_a_resend_sends_nothing_new(upstream, proxy_factory, receiver):
    url = await receiver.start()
    running = await proxy_factory(upstream.url, webhook_url=url, public_url="https://lw.example.com/")
    agent = Agent(running.url, headers={"X-Loopwarden-Session": "night run/7"})
    await loop_to_the_stop(agent, upstream)
    (alert,) = await receiver.until(1)
    assert {k: alert[k] for k in ("event", "session_id", "type", "action", "episode", "turn", "api", "enforced")} == {
        "event": "loop.stopped", "session_id": "night run/7", "type": "tool_call", "action": "stopped",
        "episode": "3/2", "turn": 7, "api": "chat", "enforced": True}
    assert alert["model"] == "gpt-test" and len(alert["tenant"]) == 16 and alert["tokens_saved_estimate"] > 0
    assert alert["url"] == "https://lw.example.com/loopwarden/#open=night%20run%2F7"
    # the link that lets the session go on, as the stop's message names it
    assert alert["resume_url"].startswith("https://lw.example.com/loopwarden/resume/")
    assert alert["text"].endswith(f"to let it go on: {alert['resume_url']}")
    assert isinstance(alert["detection_id"], int)  # what `loopwarden mark` and the page's buttons take
    assert alert["text"].startswith(
        f"loopwarden stopped a tool_call loop (`read_file`, detection {alert['detection_id']}, episode 3/2, turn 7) "
        "in session night run/7") and f"— {alert['url']} —" in alert["text"]
    with pytest.raises(openai.BadRequestError):
        await agent.turn()  # the same request again
    await asyncio.sleep(0.3)
    assert len(receiver.received) == 1
    assert await deliveries(running) == {"sent": 1.0}
    await agent.close()


async def test_with_all_events_the_two_warnings_come_first(upstream, proxy_factory, receiver):
    url = await receiver.start()
    running = await proxy_factory(upstream.url, webhook_url=url, webhook_events="all")
    agent = Agent(running.url)
    await loop_to_the_stop(agent, upstream)
    sent = await receiver.until(3)
    assert [(a["event"], a["episode"]) for a in sent] == [("loop.warned", "1/2"), ("loop.warned", "2/2"),
                                                          ("loop.stopped", "3/2")]
    assert sent[0]["url"] is None  # no PUBLIC_URL: no link
    await agent.close()


@pytest.mark.parametrize("hook", ["dead", "slow", "refusing"])
async def test_a_dead_slow_or_refusing_hook_changes_nothing_for_the_agent(upstream, proxy_factory, monkeypatch, hook):
    monkeypatch.setattr(alerts, "RETRY_DELAY", 0.05)
    receiver = Receiver(status=503 if hook == "refusing" else 200, delay=3.0 if hook == "slow" else 0.0)
    url = await receiver.start()
    if hook == "dead":
        await receiver.runner.cleanup()  # nothing listens there any more
    running = await proxy_factory(upstream.url, webhook_url=url, webhook_events="all")
    agent = Agent(running.url)
    started = asyncio.get_running_loop().time()
    stop = await loop_to_the_stop(agent, upstream)
    assert stop.code == "loop_detected"
    assert asyncio.get_running_loop().time() - started < 2.5  # not one request waited for the hook
    if hook != "slow":
        for _ in range(100):
            if (await deliveries(running)).get("failed") == 3.0:
                break
            await asyncio.sleep(0.05)
        assert await deliveries(running) == {"failed": 3.0}
    if hook == "refusing":
        assert receiver.attempts == 3 * alerts.ATTEMPTS  # a 503 is retried
    await agent.close()
    if hook != "dead":
        await receiver.runner.cleanup()


async def test_a_stop_resent_to_another_replica_sends_no_second_alert(upstream, proxy_factory, receiver,
                                                                     postgres_url):
    """Alerts follow the log's first insert of an episode: two replicas on one PostgreSQL log, the refused request
    resent to the other replica, one alert."""
    url = await receiver.start()
    first = await proxy_factory(upstream.url, webhook_url=url, database_url=postgres_url)
    second = await proxy_factory(upstream.url, webhook_url=url, database_url=postgres_url)
    agent = Agent(first.url, headers={"X-Loopwarden-Session": "twin"})
    stopped = await loop_to_the_stop(agent, upstream)
    assert stopped.body["code"] == "loop_detected"
    (alert,) = await receiver.until(1)
    assert alert["event"] == "loop.stopped" and alert["session_id"] == "twin"
    resent = Agent(second.url, headers={"X-Loopwarden-Session": "twin"})
    resent.messages = list(agent.messages)
    with pytest.raises(openai.BadRequestError) as again:
        await resent.turn()  # the same conversation, refused by the other replica too
    assert again.value.body["code"] == "loop_detected"
    await asyncio.sleep(2.5)  # both writers have flushed (every second) by now
    assert len(receiver.received) == 1
    assert await deliveries(first) == {"sent": 1.0} and await deliveries(second) == {}
    await agent.close()
    await resent.close()
