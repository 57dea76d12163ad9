"""A person says whether a detection was a loop: through the API, the CLI and the page, on SQLite and
PostgreSQL. A stop said not to be a loop resumes its task; the marks are counted per type and per agent."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import openai
import pytest
from sqlalchemy import text

from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.test_alerts import loop_to_the_stop
from tests.test_log_api import ROOT, wait_for
from tests.test_page import Watched, browser, until  # noqa: F401 (the page tests' Chromium, as a fixture)

ADMIN = {"Authorization": "Bearer admin-only"}


async def detections(proxy, headers=ADMIN, **query) -> list[dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/loopwarden/api/detections", params=query, headers=headers) as answer:
            assert answer.status == 200, await answer.text()
            return (await answer.json())["data"]


async def mark(proxy, detection_id, body, headers=ADMIN) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}/loopwarden/api/detections/{detection_id}/mark", headers=headers,
                             **({"data": body} if isinstance(body, (str, bytes)) else {"json": body})) as answer:
            return answer.status, await answer.json()


async def stopped_run(proxy_factory, upstream, database_url: str, session: str = "marked run"):
    proxy = await proxy_factory(upstream.url, database_url=database_url, admin_token="admin-only")
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": session})
    assert (await loop_to_the_stop(agent, upstream)).code == "loop_detected"
    found = await wait_for(lambda: _three(proxy))
    assert [d["action"] for d in found] == ["stopped", "warned", "warned"]  # newest first
    return proxy, agent, found


async def _three(proxy, headers=ADMIN):
    found = await detections(proxy, headers)
    return found if len(found) == 3 else None


async def test_a_detection_is_marked_and_the_marks_are_counted(upstream, proxy_factory, database_url):
    proxy, agent, (stop, second, first) = await stopped_run(proxy_factory, upstream, database_url)
    assert stop["mark"] is None and stop["marked_at"] is None

    status, body = await mark(proxy, first["id"], {"verdict": "not_a_loop", "note": "it was polling a build"})
    assert status == 200 and body["data"]["mark"] == "not_a_loop"
    assert body["data"]["mark_note"] == "it was polling a build" and body["data"]["marked_at"]
    status, body = await mark(proxy, second["id"], {"verdict": "loop"})
    assert status == 200 and body["data"]["mark"] == "loop" and body["data"]["mark_note"] is None
    status, body = await mark(proxy, second["id"], {"verdict": "not_a_loop"})  # a later word replaces it
    assert status == 200 and body["data"]["mark"] == "not_a_loop"
    status, _ = await mark(proxy, second["id"], {"verdict": "loop"})

    assert [d["id"] for d in await detections(proxy, mark="not_a_loop")] == [first["id"]]
    assert [d["id"] for d in await detections(proxy, mark="loop")] == [second["id"]]
    assert [d["id"] for d in await detections(proxy, mark="none")] == [stop["id"]]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/loopwarden/api/stats", headers=ADMIN) as answer:
            stats = await answer.json()
    assert stats["marked"]["tool_call"] == {"loop": 1, "not_a_loop": 1}
    assert stats["marked"]["content"] == {"loop": 0, "not_a_loop": 0}
    assert sum(counts["not_a_loop"] for counts in stats["marked_by_agent"].values()) == 1
    await agent.close()


async def test_marking_refuses_what_it_cannot_take(upstream, proxy_factory, database_url):
    proxy, agent, (stop, *_) = await stopped_run(proxy_factory, upstream, database_url)
    status, body = await mark(proxy, stop["id"], {"verdict": "maybe"})
    assert status == 400 and "verdict" in body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
    status, body = await mark(proxy, stop["id"], "not json")
    assert status == 400 and "JSON" in body["error"]["message"]
    status, body = await mark(proxy, stop["id"], {"verdict": "loop", "note": {"not": "text"}})
    assert status == 400
    for unknown in (stop["id"] + 1000, "abc", "9" * 19):
        status, body = await mark(proxy, unknown, {"verdict": "loop"})
        assert status == 404 and body["error"]["code"] == "not_found"
    # Another client's key sees only its own detections: this one is not there for it.
    other = Agent(proxy.url, api_key="sk-other-key", headers={"X-Loopwarden-Session": "other"})
    upstream.script.append(Turn(content="hello"))
    await other.turn()
    await asyncio.sleep(0.5)  # its session is written: the key is known
    status, _ = await mark(proxy, stop["id"], {"verdict": "not_a_loop"}, headers={
        "Authorization": "Bearer sk-other-key"})
    assert status == 404
    assert (await detections(proxy))[0]["mark"] is None
    await agent.close()
    await other.close()


async def test_a_stop_marked_not_a_loop_resumes_its_task(upstream, proxy_factory, database_url):
    proxy, agent, (stop, *_) = await stopped_run(proxy_factory, upstream, database_url)
    with pytest.raises(openai.BadRequestError):
        await agent.turn()
    status, body = await mark(proxy, stop["id"], {"verdict": "not_a_loop", "note": "the job was still running"})
    assert status == 200
    upstream.script.append(Turn(content="The build finished."))
    assert (await agent.turn())["content"] == "The build finished."  # forwarded, its warnings forgiven
    await agent.close()


async def test_the_cli_marks_a_detection(upstream, proxy_factory, tmp_path):
    database = f"sqlite+aiosqlite:///{tmp_path}/marks.db"
    proxy, agent, (stop, second, _) = await stopped_run(proxy_factory, upstream, database, "cli marked")

    def cli(*words: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "proxy", *words, "--database-url", database], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)

    done = await asyncio.to_thread(cli, "mark", str(second["id"]), "--loop", "--note", "yes, the same read")
    assert done.returncode == 0, done.stderr
    assert f"detection {second['id']}" in done.stdout and "marked loop" in done.stdout
    done = await asyncio.to_thread(cli, "mark", str(stop["id"]), "--not-a-loop")
    assert done.returncode == 0 and "goes on" in done.stdout, done.stderr
    listed = await asyncio.to_thread(cli, "detections", "--mark", "loop", "--format", "json")
    assert listed.returncode == 0 and f'"id": {second["id"]}' in listed.stdout and "yes, the same read" in listed.stdout
    missing = await asyncio.to_thread(cli, "mark", "999999", "--loop")
    assert missing.returncode == 2 and "no detection 999999" in missing.stderr
    neither = await asyncio.to_thread(cli, "mark", str(stop["id"]))
    assert neither.returncode == 2 and "--not-a-loop" in neither.stderr

    upstream.script.append(Turn(content="going on"))

    async def forwarded():
        try:
            return await agent.turn()
        except openai.BadRequestError:
            return None  # this replica takes the stored reset within a second

    assert (await wait_for(forwarded))["content"] == "going on"
    await agent.close()


async def test_the_page_marks_a_detection_and_shows_how_often_marks_said_not_a_loop(
        upstream, proxy_factory, browser, tmp_path):
    proxy = await proxy_factory(upstream.url)
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "page marked"})
    assert (await loop_to_the_stop(agent, upstream)).code == "loop_detected"
    await wait_for(lambda: _three(proxy, {}))  # no admin token: the loopback page sees every tenant
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    watched = Watched(page, proxy.root)
    await page.goto(f"{proxy.root}/loopwarden/")
    await page.wait_for_selector("#recent tbody tr td.marks")
    assert "no detection marked yet" in await page.inner_text("#cards")

    rows = page.locator("#recent tbody tr")  # newest first: the stop, the 2nd warning, the 1st
    await rows.nth(0).get_by_role("button", name="not a loop", exact=True).click()
    await page.wait_for_selector("#recent tbody tr:has-text('stopped') button.mark.chosen")
    assert "its task goes on" in await page.inner_text("#status")
    await rows.nth(2).get_by_role("button", name="loop", exact=True).click()
    await until(lambda: page.locator("#recent button.mark.chosen").count(), 2)
    cards = await page.inner_text("#cards")
    assert "marked not a loop\n50%" in cards and "tool_call 1 of 2" in cards, cards
    await page.screenshot(path=str(tmp_path / "marks.png"), full_page=True)

    async def episodes_shown() -> list[str]:
        cells = [text.split("\t") for text in await rows.all_inner_texts()]
        return [row[5] if len(row) > 5 else row[0] for row in cells]  # "no detections" while the table reloads

    await page.select_option("#mark", "not_a_loop")
    await until(episodes_shown, ["stop"])
    await page.select_option("#mark", "none")
    await until(episodes_shown, ["2/2"])
    await page.select_option("#mark", "loop")
    await until(episodes_shown, ["1/2"])
    watched.clean()
    await page.close()

    upstream.script.append(Turn(content="Back at work."))
    assert (await agent.turn())["content"] == "Back at work."  # the stop marked not a loop let its task go on
    await agent.close()


async def test_a_false_positive_is_captured_marked_exported_and_replayed(upstream, proxy_factory, tmp_path):
    """A healthy run the rules warn on: a poll whose answer never changes while the job runs. Its warned request
    is kept, a person marks it not a loop, and the export replays to the same episode; no key or header is
    kept."""
    from tests.test_alerts import Receiver

    receiver = Receiver()
    hook = await receiver.start()
    database = f"sqlite+aiosqlite:///{tmp_path}/captured.db"
    proxy = await proxy_factory(upstream.url, database_url=database, capture_flagged=True, webhook_url=hook,
                                webhook_events="all")
    agent = Agent(proxy.url, api_key="sk-secret-agent-key", headers={"X-Loopwarden-Session": "nightly build",
                                                                      "X-Private-Header": "private-value"})
    for _ in range(6):
        upstream.script.append(Turn(tool_calls=[("job_status", {"job": "nightly-1432"})]))
        await agent.turn()
        agent.answer("status: running (build step 3 of 9)")
    first = (await receiver.until(1))[0]
    assert first["action"] == "warned" and first["detection_id"] is not None
    assert f"detection {first['detection_id']}" in first["text"]  # who reads the alert can mark it

    status, body = await mark(proxy, first["detection_id"], {"verdict": "not_a_loop", "note": "a poll"}, {})
    assert status == 200

    def cli(*words: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "proxy", *words], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)

    exported = tmp_path / "false-positives.jsonl"

    async def written():
        done = await asyncio.to_thread(cli, "export", str(exported), "--marked", "not_a_loop",
                                       "--database-url", database)
        return done if done.returncode == 0 and done.stdout.startswith("1 request") else None

    done = await wait_for(written)
    assert done and f"detections: {first['detection_id']}" in done.stdout, done
    text = exported.read_text()
    assert text.count("\n") == 1 and '"job_status"' in text
    for secret in ("sk-secret-agent-key", "private-value", "X-Private-Header", "Authorization", "Bearer"):
        assert secret not in text
    replayed = await asyncio.to_thread(cli, "replay", str(exported), "--format", "json")
    assert replayed.returncode == 0, replayed.stderr
    assert '"type": "tool_call"' in replayed.stdout and '"action": "warned"' in replayed.stdout, replayed.stdout
    nothing = await asyncio.to_thread(cli, "export", str(tmp_path / "none.jsonl"), "--marked", "loop",
                                      "--database-url", database)
    assert nothing.returncode == 0 and nothing.stdout.startswith("0 requests")
    await agent.close()
    await receiver.runner.cleanup()


async def test_kept_requests_are_bounded_and_go_with_the_responses_retention(tmp_path):
    from datetime import timedelta

    from proxy.store import writer as writer_module
    from proxy.store.database import run_migrations
    from proxy.store.store import Store

    database = f"sqlite+aiosqlite:///{tmp_path}/bounded.db"
    await asyncio.to_thread(run_migrations, database)
    store = Store(database)
    await store.start()
    try:
        now = writer_module.utcnow()
        capture = {"tenant": "t", "session_id": "s", "dialect": "chat", "path": "/v1/chat/completions"}
        store.writer.add_capture({**capture, "episode_key": "huge", "created_at": now,
                                  "body": b"x" * (writer_module.CAPTURE_MAX_BYTES + 1)})
        for n in range(20):  # 20 of 4 MiB: the oldest go past the buffer's bound while the database waits
            old = timedelta(days=40 * (n % 2))  # every other one past the responses' retention (30 days)
            store.writer.add_capture({**capture, "episode_key": f"k{n}", "created_at": now - old,
                                      "body": b'{"messages": []}' + b" " * (4 * 1024 * 1024)})
        assert store.writer._captured_bytes <= writer_module.CAPTURE_BUFFER_BYTES
        await store.writer.flush()
        async with store.engine.connect() as connection:
            keys = {row[0] for row in await connection.execute(text("select episode_key from captured_requests"))}
        assert "huge" not in keys and "k19" in keys and len(keys) < 20
        assert await store.prune_responses() == len([k for k in keys if int(k[1:]) % 2])  # the old ones
    finally:
        await store.close()
