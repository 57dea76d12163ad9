"""Claude Code itself (`claude -p --bare`, pinned in the Makefile) pointed at loopwarden with ANTHROPIC_BASE_URL,
in front of a scripted model that repeats one Bash call forever, or chants. It runs with the other real-agent
checks (`make agents-check`), which install it with npm."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import aiohttp
import orjson
import pytest

from proxy.wire import known
from tests.agents import REQUIRE_AGENTS
from tests.agents.scripted_upstream import responder
from tests.fake_upstream import Turn

CLAUDE = Path(__file__).parents[2] / ".venv-agents" / "node" / "node_modules" / ".bin" / "claude"
pytestmark = pytest.mark.skipif(not CLAUDE.exists() and not REQUIRE_AGENTS,
                                reason="Claude Code is not installed (make agents-check installs it with npm)")


async def run_claude(root: str, prompt: str, workdir: Path, *more: str) -> tuple[int, str]:
    if not CLAUDE.exists():
        pytest.fail(f"no Claude Code at {CLAUDE}: make agents-check installs it with npm")
    env = {"PATH": os.environ["PATH"], "HOME": str(workdir), "ANTHROPIC_BASE_URL": root,
           "ANTHROPIC_API_KEY": "sk-ant-any-key", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    process = await asyncio.create_subprocess_exec(
        str(CLAUDE), "-p", prompt, "--bare", "--allowedTools", "Bash", *more, cwd=workdir, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode, output.decode()


async def overview(root: str, until_detections: int) -> tuple[dict, dict]:
    """The page's stats and timeline for the last hour, once the log holds that many detections."""
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            async with http.get(f"{root}/loopwarden/api/stats", params={"since": "1h"}) as response:
                stats = await response.json()
            if stats["detections"] >= until_detections:
                break
            await asyncio.sleep(0.05)
        async with http.get(f"{root}/loopwarden/api/timeline", params={"since": "1h"}) as response:
            return stats, await response.json()


def turns(upstream) -> list[dict]:
    """The agent's own turns (Claude Code's side requests carry no tools)."""
    return [body for body in upstream.messages_requests if body.get("tools")]


def warnings(body: dict) -> list[str]:
    return [block["text"] for message in body["messages"] if isinstance(message["content"], list)
            for block in message["content"] if block.get("type") == "text" and block["text"].startswith("[loopwarden]")]


async def test_claude_code_is_warned_twice_then_stopped(upstream, proxy_factory, tmp_path):
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url)
    (tmp_path / "a.txt").write_text("hello\n")
    upstream.responder = responder("loop", "Bash", {"command": "ls", "description": "List the files"}, None)
    status, output = await run_claude(running.root, "List the files here", tmp_path)
    assert status == 1, output
    assert "[loopwarden] Loop detected (tool_call)" in output and "`Bash`" in output
    # The person sees the way back on screen: the stop's one-time resume link, which opens its page.
    link = re.search(r"open (http://\S+/loopwarden/resume/[\w-]+)", output)
    assert link, output
    async with aiohttp.ClientSession() as http:
        async with http.get(link.group(1)) as page:
            assert page.status == 200 and "Resume the session" in await page.text()
    seen = turns(upstream)
    assert len(seen) == 7  # nothing after the stop reached the upstream
    assert [len(warnings(body)) for body in seen] == [0, 0, 0, 0, 0, 1, 2]
    # What the operator's overview says of it, from the counts kept as the log was written.
    stats, timeline = await overview(running.root, until_detections=3)
    assert (stats["by_action"], stats["by_type"]["tool_call"]) == ({"warned": 2, "stopped": 1, "cut": 0}, 3)
    assert (stats["sessions_affected"], stats["warned_tasks"], stats["recovered_tasks"]) == (1, 1, 0)
    assert sum(stats["by_model"].values()) == 3
    assert sum(timeline["series"]["tool_call"]) == 3


async def test_claude_code_stopped_goes_on_once_its_resume_link_is_used(upstream, proxy_factory, tmp_path):
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url)
    upstream.responder = responder("loop", "Bash", {"command": "ls", "description": "List the files"}, None)
    status, output = await run_claude(running.root, "List the files here", tmp_path)
    assert status == 1 and "[loopwarden] Loop detected" in output, output
    link = re.search(r"open (http://\S+/loopwarden/resume/[\w-]+)", output).group(1)
    async with aiohttp.ClientSession() as http:
        async with http.get(link) as page:  # what the person sees: the session, and the button
            text = await page.text()
            assert page.status == 200 and "Resume the session" in text
        confirm = re.search(r"name=confirm value=([\w-]+)", text).group(1)
        async with http.post(link, data={"confirm": confirm}) as page:
            assert page.status == 200 and "Resumed" in await page.text()
    # The same conversation, continued: its next request goes through, with a fresh warning budget.
    before = len(turns(upstream))
    upstream.responder = responder("answer", "Bash", {}, None, content="The folder is empty.")
    status, output = await run_claude(running.root, "Go on", tmp_path, "--continue")
    assert status == 0 and "The folder is empty." in output, output
    assert len(turns(upstream)) == before + 1 and warnings(turns(upstream)[-1]) == []


async def test_claude_code_chanting_ends_with_the_notice_and_is_not_resumed(upstream, proxy_factory, tmp_path):
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url)
    upstream.responder = responder("chant", "Bash", {}, None)
    status, output = await run_claude(running.root, "Explain the configuration", tmp_path)
    assert status == 0, output
    assert output.rstrip().endswith("[loopwarden] Output cut: the same text repeated 10 times.")
    assert len(turns(upstream)) == 1


async def test_claude_code_long_conversation_is_read_from_where_it_grew(upstream, proxy_factory, tmp_path):
    """Claude Code reading twelve 8 KB files, then one file again and again: its requests grow past 100 KB,
    each is parsed from where it differs from the one before (the bytes it shares counted as known on
    /metrics), and the loop at the end is warned twice and stopped as in a short conversation."""
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url)
    for n in range(12):
        (tmp_path / f"part{n}.txt").write_text("".join(f"part {n}, line {line}: {'data ' * 30}\n"
                                                       for line in range(50)))
    (tmp_path / "same.txt").write_text("hello\n")
    reads = iter([{"command": f"cat part{n}.txt", "description": "Read one part"} for n in range(12)])

    def answer(body: dict) -> Turn:
        if not body.get("tools"):  # a side request of its own
            return Turn(content="Reading files")
        arguments = next(reads, {"command": "cat same.txt", "description": "Read it again"})
        return Turn(tool_calls=[("Bash", arguments)], chunk_chars=5)

    upstream.responder = answer
    status, output = await run_claude(running.root, "Read every part, then same.txt", tmp_path)
    assert status == 1, output
    assert "[loopwarden] Loop detected (tool_call)" in output
    seen = [raw for raw in upstream.messages_raw if b'"tools"' in raw]
    assert len(seen[-1]) > 100_000
    assert [len(warnings(orjson.loads(raw))) for raw in seen][-3:] == [0, 1, 2]
    async with aiohttp.ClientSession() as http, http.get(f"{running.root}/metrics") as response:
        read = dict(re.findall(r'^loopwarden_request_body_bytes_total\{read="(\w+)"\} (\S+)$',
                               await response.text(), re.M))
    long_ones = sum(len(raw) for raw in seen if len(raw) >= 64 * 1024)
    if known.member is None:  # the scanner is not built (plain Python): every body is parsed whole, by design
        assert float(read["known"]) == 0, read
    else:
        assert float(read["known"]) > 0.5 * long_ones, (read, long_ones)


async def test_claude_code_editing_a_line_that_occurs_twice_with_new_text_each_time(upstream, proxy_factory,
                                                                                     tmp_path):
    """The model reads a file, then asks Claude Code's Edit to replace a line that occurs twice, with other new
    text each time: Claude Code refuses each for its `old_string` (two matches). One call failing the same way,
    whatever it would write: warned at the 3rd refusal and the 4th, stopped at the 5th (strong evidence)."""
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url)
    module = tmp_path / "match.c"
    module.write_text("int f(int t) {\n  return t;\n}\n\nint g(int t) {\n  return t;\n}\n")
    fixes = ("t = alias(t);", "t = consume(t);", "if (is_iso(t)) t = trn(t);", "t = ephemeral(t);",
             "t = unalias(t);", "t = recover(t);")
    edits = iter([("Read", {"file_path": str(module)})] + [
        ("Edit", {"file_path": str(module), "old_string": "  return t;", "new_string": f"  {fix}\n  return t;"})
        for fix in fixes])

    def answer(body: dict) -> Turn:
        if not body.get("tools"):  # a side request of its own
            return Turn(content="Editing match.c")
        return Turn(tool_calls=[next(edits)], chunk_chars=5)

    upstream.responder = answer
    status, output = await run_claude(running.root, "Fix the aliasing in match.c", tmp_path,
                                      "--allowedTools", "Read,Edit")
    assert status == 1, output
    assert "[loopwarden] Loop detected (tool_error)" in output and "`Edit`" in output
    seen = turns(upstream)
    assert len(seen) == 6  # the read, then four refused edits answered; the fifth refusal is the stop
    assert [len(warnings(body)) for body in seen] == [0, 0, 0, 0, 1, 2]
    refusals = [block for message in seen[-1]["messages"] if isinstance(message["content"], list)
                for block in message["content"] if block.get("type") == "tool_result" and block.get("is_error")]
    assert len(refusals) == 4 and all("match" in str(block["content"]).lower() for block in refusals), refusals
    assert module.read_text().count("  return t;") == 2  # nothing was written
