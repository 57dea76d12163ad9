"""The way back after a stop: the stop's message carries a one-time link; the person opens it, confirms, and the
agent's next request goes through. The link unlocks nothing else, and the agent, which was handed the link too,
cannot use it: the resume needs the admin token where one is set, and a loopback client where none is."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import aiohttp
import openai
import pytest

from proxy.server.app import GUARD
from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.test_alerts import loop_to_the_stop
from tests.test_log_api import ROOT, wait_for
from tests.test_page import browser  # noqa: F401 (the page tests' Chromium, as a fixture)

LINK = re.compile(r"open (http://\S+/loopwarden/resume/[\w-]+)")


async def stopped(agent: Agent, upstream) -> str:
    """Loop the agent to its stop (the ladder of five); the link its message names."""
    refused = await loop_to_the_stop(agent, upstream)
    assert refused.code == "loop_detected"
    found = LINK.search(refused.message)
    assert found, refused.message
    return found.group(1)


async def fetch(method: str, url: str, **form) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, data=form or None) as answer:
            return answer.status, await answer.text()


def confirmation_in(page: str) -> str:
    return re.search(r"name=confirm value=([\w-]+)", page).group(1)


async def test_the_link_resumes_the_stopped_session_once(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, admin_token="admin-only")
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "night run"})
    link = await stopped(agent, upstream)
    assert link.startswith(proxy.root)
    # Nothing of the link went to the model: not in any request the upstream got.
    assert all("/loopwarden/resume/" not in str(body) for body in upstream.chat_requests)

    status, page = await fetch("GET", link)  # shown without the admin token, which the page asks for
    assert status == 200 and "night run" in page and "read_file" in page and "Resume the session" in page
    assert "name=admin_token" in page
    with pytest.raises(openai.BadRequestError):
        await agent.turn()  # opening the link resumes nothing
    confirm = confirmation_in(page)
    status, page = await fetch("POST", link, confirm=confirm)  # what an agent with the link could do: refused
    assert status == 401 and "admin token" in page
    status, _ = await fetch("POST", link, admin_token="admin-only")  # nor a POST without the page's value
    assert status == 400
    status, _ = await fetch("POST", link, confirm=confirm, admin_token="not-the-token")
    assert status == 401
    with pytest.raises(openai.BadRequestError):
        await agent.turn()

    status, page = await fetch("POST", link, confirm=confirm, admin_token="admin-only")
    assert status == 200 and "Resumed" in page
    upstream.script.append(Turn(content="I will read the tests instead."))
    answer = await agent.turn()
    assert answer["content"] == "I will read the tests instead."  # forwarded, with a fresh warning budget
    assert "[loopwarden]" not in str(upstream.chat_requests[-1]["messages"][-3:])

    status, page = await fetch("POST", link, confirm=confirm, admin_token="admin-only")
    assert status == 410 and "Already resumed" in page  # spent
    status, _ = await fetch("GET", link.rsplit("/", 1)[0] + "/forged-token-123")
    assert status == 404
    await agent.close()

    async def timeline():
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proxy.root}/loopwarden/api/sessions/night%20run",
                                headers={"Authorization": "Bearer admin-only"}) as answer:
                entries = (await answer.json())["data"][0]["timeline"]
        return entries if any(e["kind"] == "resume" for e in entries) else None

    assert [e["kind"] for e in await wait_for(timeline)][-1] == "resume"


async def test_a_link_resumes_its_own_session_and_nothing_else(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url)
    first = Agent(proxy.url, headers={"X-Loopwarden-Session": "first"})
    second = Agent(proxy.url, headers={"X-Loopwarden-Session": "second"})
    link = await stopped(first, upstream)
    other = await stopped(second, upstream)
    assert link != other
    _, page = await fetch("GET", link)
    status, _ = await fetch("POST", link, confirm=confirmation_in(page))
    assert status == 200
    with pytest.raises(openai.BadRequestError):
        await second.turn()  # the other session stays stopped
    status, _ = await fetch("POST", other, confirm=confirmation_in(page))  # another link's confirmation
    assert status == 400
    await first.close()
    await second.close()


async def test_the_cli_resumes_a_session_as_the_link_does(upstream, proxy_factory, tmp_path):
    database = f"sqlite+aiosqlite:///{tmp_path}/resume.db"
    proxy = await proxy_factory(upstream.url, database_url=database)
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "cli run"})
    await stopped(agent, upstream)
    await asyncio.sleep(0.3)  # the session's row is written
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "proxy", "resume", "cli run",
                                                    "--database-url", database],
                                   cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "session cli run" in done.stdout and "resumed" in done.stdout
    upstream.script.append(Turn(content="going on"))

    async def forwarded():
        try:
            return await agent.turn()
        except openai.BadRequestError:
            return None  # this replica takes the stored reset within a second

    assert (await wait_for(forwarded))["content"] == "going on"
    missing = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "proxy", "resume", "no such run",
                                                       "--database-url", database],
                                      cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no session 'no such run'" in missing.stderr
    await agent.close()


async def test_the_page_button_resumes_in_a_browser(upstream, proxy_factory, browser, tmp_path):
    proxy = await proxy_factory(upstream.url)
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "browser run"})
    link = await stopped(agent, upstream)
    page = await browser.new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    await page.goto(link)
    assert "browser run" in await page.inner_text("main")
    await page.screenshot(path=str(tmp_path / "resume.png"))
    await page.click("text=Resume the session")
    await page.wait_for_selector("text=goes on")
    assert await page.title() == "Resumed · loopwarden" and errors == []
    # What happens next: the agent waiting for its person, a loop warned and stopped again, the session's page.
    said = await page.inner_text("main")
    assert "What happens next" in said and "give it its next instruction" in said and "stopped again" in said
    await page.click("text=Follow the session on the page")
    await page.wait_for_selector("#detail-id:has-text('browser run')")
    await page.close()
    upstream.script.append(Turn(content="going on"))
    assert (await agent.turn())["content"] == "going on"
    await agent.close()


async def test_a_link_one_replica_names_is_opened_on_another(upstream, proxy_factory, tmp_path):
    """The link goes to the log with the stop (not awaited by the stop's answer): a replica sharing the log
    finds it once it is written."""
    database = f"sqlite+aiosqlite:///{tmp_path}/shared.db"
    first = await proxy_factory(upstream.url, database_url=database)
    second = await proxy_factory(upstream.url, database_url=database)
    agent = Agent(first.url, headers={"X-Loopwarden-Session": "two replicas"})
    link = (await stopped(agent, upstream)).replace(first.root, second.root)

    async def shown():
        status, page = await fetch("GET", link)
        return page if status == 200 else None

    page = await wait_for(shown)
    assert page and "two replicas" in page
    status, _ = await fetch("POST", link, confirm=confirmation_in(page))
    assert status == 200
    await agent.close()


async def test_a_link_for_a_long_unusual_session_id_lands_in_either_database(upstream, proxy_factory, database_url):
    proxy = await proxy_factory(upstream.url, database_url=database_url)
    session = "<night run> & 'quotes' " + "x" * 300  # cut to its column, shown escaped
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": session})
    link = await stopped(agent, upstream)
    status, page = await fetch("GET", link)
    assert status == 200 and "&lt;night run&gt; &amp; &#x27;quotes&#x27;" in page and "<night run>" not in page
    status, _ = await fetch("POST", link, confirm=confirmation_in(page))
    assert status == 200
    await agent.close()


async def test_the_pages_value_is_drawn_by_the_server_once_per_showing(upstream, proxy_factory):
    """The value the button sends is not derived from the link: each showing draws a new one, only the latest
    counts, and it is spent with the link."""
    proxy = await proxy_factory(upstream.url)
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "drawn"})
    link = await stopped(agent, upstream)
    _, first = await fetch("GET", link)
    _, second = await fetch("GET", link)
    assert confirmation_in(first) != confirmation_in(second)
    status, _ = await fetch("POST", link, confirm=confirmation_in(first))  # replaced by the later showing
    assert status == 400
    status, _ = await fetch("POST", link, confirm=confirmation_in(second))
    assert status == 200
    await agent.close()


async def test_a_link_expires_and_retention_forgets_it(upstream, proxy_factory, tmp_path):
    database = f"sqlite+aiosqlite:///{tmp_path}/expiry.db"
    proxy = await proxy_factory(upstream.url, database_url=database, resume_link_ttl=1 / 3600)  # one second
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "left overnight"})
    link = await stopped(agent, upstream)
    status, page = await fetch("GET", link)
    assert status == 200
    await asyncio.sleep(1.2)
    status, expired = await fetch("GET", link)
    assert status == 410 and "expired" in expired
    status, _ = await fetch("POST", link, confirm=confirmation_in(page))
    assert status == 410
    with pytest.raises(openai.BadRequestError):
        await agent.turn()  # still stopped
    store = proxy.runner.app[GUARD].store
    assert await store.prune_resume_links() == 1
    status, _ = await fetch("GET", link)
    assert status == 404
    await agent.close()


async def test_alerts_link_to_the_public_url_only_whatever_host_the_client_names(upstream, proxy_factory):
    from tests.test_alerts import Receiver

    receiver = Receiver()
    hook = await receiver.start()
    try:
        for public_url in (None, "https://lw.example.com"):
            proxy = await proxy_factory(upstream.url, webhook_url=hook, public_url=public_url)
            agent = Agent(proxy.url, headers={"X-Loopwarden-Session": f"host {public_url}",
                                              "Host": "evil.example"})
            refused = await loop_to_the_stop(agent, upstream)
            link = LINK.search(refused.message)
            (alert,) = await receiver.until(1)
            receiver.received.clear()
            assert "evil.example" not in str(alert)
            if public_url is None:  # no link for operators without PUBLIC_URL
                assert alert["resume_url"] is None and "/loopwarden/resume/" not in alert["text"]
                assert link and "evil.example" in link.group(1)  # the client is told the address it used
            else:
                assert alert["resume_url"].startswith("https://lw.example.com/loopwarden/resume/")
                assert "https://lw.example.com/loopwarden/resume/" in refused.message
            await agent.close()
    finally:
        await receiver.runner.cleanup()
