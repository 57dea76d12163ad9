"""The web page in a real headless Chromium (Debian's, driven by Playwright), over a log seeded through the
proxy: a tool loop to the stop, a cut chanting stream, a judge warning, and a session full of markup."""

from __future__ import annotations

import asyncio
import os
import shutil

import aiohttp
import openai
import pytest

from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.test_judge import ask, judged, verdict
from tests.test_log_api import wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
XSS_SESSION = '<img src=x onerror="window.__pwned=1">'
XSS_ARGS = {"path": "<script>window.__pwned=2</script>", "html": "<b onmouseover=alert(1)>x</b>"}


@pytest.fixture
async def browser():
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI") or os.environ.get("LOOPWARDEN_REQUIRE_BROWSER") == "1":  # `.ci/run` sets it
            pytest.fail(f"no Chromium at {CHROMIUM}: make test installs Debian's chromium package")
        pytest.skip("no Chromium installed (apt-get install chromium) for the page tests")
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        await browser.close()


class Watched:
    """A page with everything worth failing on recorded: console errors, page errors, dialogs, requests."""

    def __init__(self, page, origin: str) -> None:
        self.page = page
        self.origin = origin
        self.errors: list[str] = []
        self.foreign: list[str] = []
        self.dialogs: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), asyncio.ensure_future(d.dismiss())))
        page.on("request", lambda r: None if r.url.startswith(origin) or r.url.startswith("data:")
                else self.foreign.append(r.url))

    def clean(self) -> None:
        assert self.errors == [] and self.foreign == [] and self.dialogs == []


async def until(probe, expected, timeout: float = 5.0) -> None:
    """Wait for an async probe to return `expected` (the page's CSP forbids evaluating strings)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (value := await probe()) != expected:
        assert asyncio.get_running_loop().time() < deadline, f"{value!r} != {expected!r}"
        await asyncio.sleep(0.05)


async def seed(upstream, proxy) -> None:
    looping = Agent(proxy.url, headers={"X-Loopwarden-Session": "looping"})
    for _ in range(7):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await looping.turn()
        looping.answer("def main():\n    return 1\n")
    with pytest.raises(openai.BadRequestError):
        await looping.turn()
    chanting = Agent(proxy.url, stream=True, headers={"X-Loopwarden-Session": "chanting"})
    upstream.script.append(Turn(content="I will check the configuration file once more. " * 100, chunk_chars=8))
    await chanting.turn()
    markup = Agent(proxy.url, headers={"X-Loopwarden-Session": XSS_SESSION})
    for _ in range(6):
        upstream.script.append(Turn(tool_calls=[("read_file", XSS_ARGS)]))
        await markup.turn()
        markup.answer("<iframe src=javascript:alert(3)></iframe> same result")
    upstream.judge = lambda body: verdict(0.95, "<svg onload=alert(4)> it re-reads the same file")
    await ask(proxy.url, 30, session="judged")
    assert await judged(upstream, 1)
    await ask(proxy.url, 31, session="judged")
    for agent in (looping, chanting, markup):
        await agent.close()
    async with aiohttp.ClientSession() as http:  # the log is written in batches
        for _ in range(100):
            async with http.get(f"{proxy.root}/loopwarden/api/detections?limit=100") as response:
                if len((await response.json())["data"]) >= 6:
                    return
            await asyncio.sleep(0.05)


async def test_overview_timeline_controls_and_markup_as_text(upstream, proxy_factory, browser):
    proxy = await proxy_factory(upstream.url, llm_check=True)  # a judge's verdict is among what it shows
    await seed(upstream, proxy)
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    watched = Watched(page, proxy.root)
    response = await page.goto(f"{proxy.root}/loopwarden/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp

    # The overview: counts, the chart, the recent detections with their evidence.
    await page.wait_for_selector("#recent tbody tr td.evidence")
    cards = await page.inner_text("#cards")
    assert "detections\n6" in cards, cards
    drawn = {await rect.get_attribute("data-type") for rect in await page.query_selector_all("#chart rect")}
    assert drawn == {"tool_call", "content", "llm"}
    recent = await page.inner_text("#recent")
    assert 'read_file {"path":"src/app.py"}' in recent and "I will check the configuration file" in recent
    assert "it re-reads the same file" in recent
    # Markup from the model and the agent is shown as text, and nothing of it runs.
    assert XSS_SESSION in recent and "<script>window.__pwned=2</script>" in recent
    assert await page.evaluate("window.__pwned === undefined")
    assert await page.query_selector_all("#recent img, #recent script, #recent b, #recent iframe") == []

    # Filters narrow the table.
    await page.select_option("#type", "content")
    await until(lambda: page.locator("#recent tbody tr").count(), 1)
    assert "I will check the configuration file" in await page.inner_text("#recent tbody")
    await page.select_option("#type", "")
    await until(lambda: page.locator("#recent tbody tr").count(), 6)

    # One session's timeline: its episodes in order, with their evidence and what loopwarden said.
    await page.click("#tabs button[data-view=sessions]")
    await page.click("#session-list tbody tr:has-text('looping')")
    await page.wait_for_selector("#timeline .entry")
    entries = await page.locator("#timeline .entry .head").all_inner_texts()
    assert [e.split(" · ")[:3] for e in entries] == [
        ["warned", "tool_call", "1/2"], ["warned", "tool_call", "2/2"], ["stopped", "tool_call", "stop"]]
    messages = await page.locator("#timeline .entry pre.message").all_inner_texts()
    assert messages[0].startswith("[loopwarden] Loop detected (1/2): you called `read_file`")
    assert "The task was stopped after 2 warnings" in messages[2]

    # The controls work from the page.
    async def state() -> dict:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proxy.root}/loopwarden/api/sessions/looping") as answer:
                return (await answer.json())["data"][0]

    assert await page.inner_text("#session-list tbody tr:has-text('looping') td.status") == "stopped"
    await page.wait_for_selector("#detail-summary:has-text('stopped: its current task is refused')")
    await page.click("#disable")
    await page.wait_for_selector("#detail-summary:has-text('off: detection disabled')")
    assert (await state())["disabled"] is True and (await state())["status"] == "off"
    await page.click("#enable")
    await page.wait_for_selector("#detail-summary:has-text('stopped: ')")  # enabled again, the stop stands
    assert (await state())["disabled"] is False
    await page.click("#reset")
    await page.wait_for_selector("#status:has-text('reset: done')")
    assert (await state())["reset_at_message"] == 16
    await page.wait_for_selector("#detail-summary:has-text('ok: no loop in its current task')")

    # The judge's verdict and the markup session's timeline.
    await page.click("#session-list tbody tr:has-text('judged')")
    await page.wait_for_selector("#timeline .entry.judge")
    assert "<svg onload=alert(4)> it re-reads the same file" in await page.inner_text("#timeline")
    await page.locator("#session-list tbody tr", has_text=XSS_SESSION).click()
    await until(lambda: page.inner_text("#detail-id"), XSS_SESSION)
    await until(lambda: page.locator("#timeline .entry.detection").count(), 1)
    assert "<script>window.__pwned=2</script>" in await page.inner_text("#timeline")
    assert await page.evaluate("window.__pwned === undefined")
    watched.clean()


async def test_with_an_admin_token_nothing_shows_before_it_is_given(upstream, proxy_factory, browser):
    running = await proxy_factory(upstream.url, admin_token="admin-secret")
    agent = Agent(running.url, headers={"X-Loopwarden-Session": "guarded"})
    for _ in range(6):
        upstream.script.append(Turn(tool_calls=[("ls", {})]))
        await agent.turn()
        agent.answer("a.py")
    await agent.close()
    async with aiohttp.ClientSession() as http:
        for token, status in ((None, 401), ("wrong-token", 401), ("admin-secret", 200)):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with http.get(f"{running.root}/loopwarden/api/stats", headers=headers) as response:
                assert response.status == status
        async with http.get(f"{running.root}/loopwarden/api/detections",
                            headers={"Authorization": "Bearer sk-agent-key-123"}) as response:
            assert response.status == 200  # an agent's own key: its own sessions

    page = await browser.new_page()
    watched = Watched(page, running.root)
    await page.goto(f"{running.root}/loopwarden/")
    await page.wait_for_selector("#login:not([hidden])")
    assert await page.is_hidden("#overview") and await page.is_hidden("#tabs")
    assert await page.inner_text("#recent tbody") == ""
    await page.fill("#token", "wrong-token")
    await page.click("#login-form button")
    await page.wait_for_selector("#login-error:has-text('That token was refused.')")
    assert await page.is_hidden("#overview")
    await page.fill("#token", "admin-secret")
    await page.click("#login-form button")
    await page.wait_for_selector("#recent tbody tr td.evidence")
    assert "guarded" in await page.inner_text("#recent")
    # The refused token's 401s are the only console errors (the browser logs failed fetches).
    watched.errors = [e for e in watched.errors if "401" not in e]
    watched.clean()


async def test_an_alerts_link_opens_the_sessions_timeline(upstream, proxy, browser):
    looping = Agent(proxy.url, headers={"X-Loopwarden-Session": "night run/7"})
    for _ in range(6):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await looping.turn()
        looping.answer("def main():\n    return 1\n")
    await looping.close()

    async def warned_in_the_log():  # as when an alert is sent: the episode is in the log
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proxy.root}/loopwarden/api/detections?session=night%20run%2F7") as answer:
                return (await answer.json())["data"] or None

    await wait_for(warned_in_the_log)
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    watched = Watched(page, proxy.root)
    await page.goto(f"{proxy.root}/loopwarden/#open=night%20run%2F7")  # as the alert's `url` gives it
    await page.wait_for_selector("#session-detail:not([hidden])")
    assert await page.inner_text("#detail-id") == "night run/7"

    async def warning_shown() -> bool:
        return "[loopwarden] Loop detected (1/2)" in await page.inner_text("#session-detail")

    await until(warning_shown, True)
    watched.clean()
    await page.close()


async def test_the_actions_card_counts_a_chant_found_too_late_only_when_there_is_one(upstream, proxy, browser):
    from tests.test_late_chants import ANSWER, NEXT, TASK

    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await page.goto(f"{proxy.root}/loopwarden/")
    await page.wait_for_selector("#cards .card")
    assert "too late" not in await page.inner_text("#cards")  # none yet: the card reads as it always did
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "late"}, task=TASK)
    upstream.script.append(Turn(content=ANSWER))  # a whole answer that chants, then the person writes next
    await agent.turn()
    agent.say(NEXT)
    upstream.script.append(Turn(content="Here is the diff."))
    await agent.turn()
    await agent.close()
    assert await wait_for(lambda: _late_logged(proxy))
    await page.reload()
    await page.wait_for_selector("#cards .card")
    assert "warned / stopped / cut · 1 found too late to act on" in await page.inner_text("#cards")


async def _late_logged(proxy) -> bool:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/loopwarden/api/detections", params={"action": "late"}) as response:
            return len((await response.json())["data"]) == 1
