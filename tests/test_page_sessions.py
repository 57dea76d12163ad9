"""The sessions list on the page names each session's agent and title, a search box narrows it, and an
alert's `#open=` link scrolls to the session's timeline (Debian's Chromium, driven by Playwright)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.test_page import Watched, browser, until  # noqa: F401 (browser is a fixture)

# (session, User-Agent or None for the openai SDK's own, extra headers, first prompt, agent shown)
AGENTS = [
    ("cc-1", "claude-cli/2.1.330 (external, cli)", {}, "Refactor the session store into its own module",
     "Claude Code 2.1.330"),
    ("codex-1", "codex_cli_rs/0.169.0 (Debian 12.0.0; x86_64) xterm-256color", {"originator": "codex_cli_rs"},
     "Why does the build fail on CI since 2026-05-01T09:14:03Z?", "Codex CLI 0.169.0"),
    ("gemini-1", "GeminiCLI-tui/0.61.0/gemini-3.1-pro-preview (linux; x64; terminal)", {},
     "Add a cache to the HTTP client", "Gemini CLI 0.61.0"),
    ("qwen-1", "QwenCode/0.15.10 (linux; x64)", {}, "Write tests for the parser", "Qwen Code 0.15.10"),
    ("opencode-1", "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14", {},
     "Explain this stack trace", "OpenCode 1.18.33"),
    ("kilo-1", "Kilo-Code/7.7.9 ai-sdk/provider-utils/4.0.27 runtime/bun/1.3.14", {"X-Title": "Kilo Code"},
     "Rename the config loader", "Kilo Code 7.7.9"),
    ("cline-1", "ai-sdk/openai-compatible/3.0.37 ai-sdk/provider-utils/5.0.30 runtime/bun/1.3.13", {},
     "Fix the flaky login test", "Cline"),
    ("aider-1", None, {}, "fix the bug in a.py", "OpenAI SDK (Python)"),
    ("genai-1", "google-genai-sdk/3.4.0 gl-python/3.11.7", {}, "Summarise the release notes",
     "google-genai (Python) 3.4.0"),
    ("adk-1", "google-genai-sdk/2.34.0 gl-python/3.11.7 google-adk/2.13.0 gl-python/3.11.7", {},
     "Plan a trip to Lisbon", "ADK 2.13.0"),
    ("mastra-1", "ai-sdk/openai/2.0.131 ai-sdk/provider-utils/3.0.40 runtime/node.js/v20.20.2", {},
     "What is the weather in Oslo?", "AI SDK (openai) 2.0.131"),
    ("markup-1", "<b>agent<b>/1.0", {}, '<img src=x onerror="window.__pwned=1"> title', "<b>agent<b> 1.0"),
]
LOOPING = "loop night/7"
CHANTING = "release notes"  # a streamed answer chanting, cut
SEEDED = len(AGENTS) + 2


async def seed(upstream, proxy) -> None:
    for session, user_agent, extra, prompt, _ in AGENTS:
        headers = {"X-Loopwarden-Session": session, **extra}
        if user_agent:
            headers["User-Agent"] = user_agent
        agent = Agent(proxy.url, headers=headers, task=prompt)
        upstream.script.append(Turn(content="done"))
        await agent.turn()
        await agent.close()
    looping = Agent(proxy.url, headers={"X-Loopwarden-Session": LOOPING,
                                        "User-Agent": "claude-cli/2.1.331 (external, cli)"},
                    task="Make the nightly import idempotent")
    for _ in range(7):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        await looping.turn()
        looping.answer("def main():\n    return 1\n")
    with pytest.raises(openai.BadRequestError):  # warned twice, then stopped
        await looping.turn()
    await looping.close()
    chanting = Agent(proxy.url, stream=True, headers={"X-Loopwarden-Session": CHANTING},
                     task="Draft the release notes for 2.4")
    upstream.script.append(Turn(content="I will check the configuration file once more. " * 100, chunk_chars=8))
    await chanting.turn()
    await chanting.close()
    async with aiohttp.ClientSession() as http:  # the log is written in batches
        for _ in range(100):
            async with http.get(f"{proxy.root}/loopwarden/api/sessions?limit=100") as response:
                sessions = (await response.json())["data"]
            async with http.get(f"{proxy.root}/loopwarden/api/detections?limit=100") as response:
                detections = (await response.json())["data"]
            if len(sessions) == SEEDED and len(detections) == 4:
                return
            await asyncio.sleep(0.05)


# The documentation's pictures of the page are taken here, from the seeded log: `make screenshots` saves them
# in docs/ (LOOPWARDEN_SCREENSHOTS names the folder; unset, none is taken).
PICTURES = os.environ.get("LOOPWARDEN_SCREENSHOTS")


async def picture(page, name: str, **options) -> None:
    if PICTURES:
        await page.screenshot(path=str(Path(PICTURES) / name), **options)


async def test_sessions_show_agent_and_title_search_and_open_scrolls(upstream, proxy, browser):
    await seed(upstream, proxy)
    page = await browser.new_page(viewport={"width": 1280, "height": 640})
    watched = Watched(page, proxy.root)
    await page.goto(f"{proxy.root}/loopwarden/#open={LOOPING.replace(' ', '%20').replace('/', '%2F')}")

    # `#open=` shows the session's timeline and scrolls it into view: the list above it is longer than the page.
    await page.wait_for_selector("#session-detail:not([hidden])")
    await page.wait_for_selector("#timeline .entry")
    assert await page.inner_text("#detail-id") == LOOPING
    assert await page.inner_text("#detail-agent") == "Claude Code 2.1.331: Make the nightly import idempotent"

    async def scrolled() -> bool:
        """The page is scrolled down to the timeline: its top at the top of the window."""
        top = (await page.locator("#session-detail").bounding_box())["y"]  # relative to the window
        return 0 <= top < 40

    await until(scrolled, True)
    assert await page.evaluate("window.scrollY") > 200

    # Every session's agent and title in the list, as text.
    rows = {}
    for row in await page.locator("#session-list tbody tr").all():
        cells = await row.locator("td").all_inner_texts()
        rows[cells[0]] = (cells[1], cells[2])
    for session, _, _, prompt, shown in AGENTS:
        agent, title = rows[session]
        assert agent.startswith(shown), (session, agent)
        expected = prompt.replace("2026-05-01T09:14:03Z", "…")  # the title is masked
        assert title == expected, (session, title)
    assert rows[LOOPING] == ("Claude Code 2.1.331", "Make the nightly import idempotent")
    assert await page.query_selector_all("#session-list img, #session-list b") == []
    assert await page.evaluate("window.__pwned === undefined")

    # The search box keeps the sessions whose id, agent or title holds its words.
    async def visible() -> list[str]:
        return [text.split("\t")[0] for text in await page.locator("#session-list tbody tr:visible").all_inner_texts()]

    await page.evaluate("window.scrollTo(0, 0)")
    await page.fill("#session-search", "claude")  # an agent; the list is newest first
    await until(visible, [LOOPING, "cc-1"])
    await page.fill("#session-search", "LISBON")  # a title, in any case
    await until(visible, ["adk-1"])
    await page.fill("#session-search", "codex-1")  # an id
    await until(visible, ["codex-1"])
    await page.fill("#session-search", "ai-sdk")  # nothing: the agent is shown by name, not its User-Agent
    await until(visible, [])
    await page.fill("#session-search", "google")  # ADK's name holds no "google"
    await until(visible, ["genai-1"])
    assert await page.inner_text("#session-count") == f"1 of {SEEDED} sessions"
    await page.fill("#session-search", "<img")  # markup searched as text
    await until(visible, ["markup-1"])
    await page.fill("#session-search", "")
    await until(lambda: page.locator("#session-list tbody tr:visible").count(), SEEDED)
    assert await page.inner_text(f"#session-list tbody tr:has-text('{LOOPING}') td.status") == "stopped"
    assert await page.inner_text(f"#session-list tbody tr:has-text('{CHANTING}') td.status") == "warned"  # a cut
    await picture(page, "sessions.png", full_page=True)

    # The overview of the same log.
    await page.evaluate("window.scrollTo(0, 0)")
    await page.click("#tabs button[data-view=overview]")
    await page.wait_for_selector("#recent tbody tr td.evidence")
    await page.set_viewport_size({"width": 1280, "height": 860})
    await picture(page, "overview.png")
    watched.clean()
    await page.close()
