"""Reasoning loops cut in front of real clients: the Vercel AI SDK (`streamText`, `generateText`), OpenCode
(`opencode run`), Qwen Code (`qwen -p`) and Codex CLI (`codex exec`), pinned in the Makefile, each pointed at
loopwarden in front of a scripted model whose reasoning says the same sentence over and over. What the person
at the client sees: the turn ends at once with loopwarden's notice as the answer, the finish reason is a
plain stop, nothing is retried (the upstream is asked once) and no error shows; the operator sees the
detection logged with `channel: reasoning`. They run with the other real-agent checks (`make agents-check`),
which install the clients with npm; in CI (or with LOOPWARDEN_REQUIRE_AGENTS=1) a missing client fails."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Callable

import aiohttp
import orjson
import pytest

from tests.agents import REQUIRE_AGENTS
from tests.fake_upstream import Turn

ROOT = Path(__file__).parents[2]
NODE_DIR = ROOT / ".venv-agents" / "node"
BIN = NODE_DIR / "node_modules" / ".bin"
AI_SDK_SCRIPT = Path(__file__).parent / "ai_sdk_reasoning.mjs"

SENTENCE = "Hmm, the second column adds up to nine, let me add it once more. "
NOTICE = "\n\n[loopwarden] Output cut: the same text repeated 10 times in the reasoning."
PROMPT = "Add the first two columns of the table in notes.md."
RUN_TIMEOUT = 60


def needs(*paths: Path, what: str) -> None:
    """Skip (fail where the clients are required) when node or a client is missing."""
    missing = [str(path) for path in paths if not path.exists()]
    if shutil.which("node") is None:
        missing.insert(0, "node")
    if missing:
        message = f"{what} is not installed ({', '.join(missing)} missing): make agents-check installs it with npm"
        if REQUIRE_AGENTS:
            pytest.fail(message)
        pytest.skip(message)


def chanting(field: str = "reasoning_content") -> Turn:
    """A model thinking the same sentence until it runs out of tokens, paced as a model streams."""
    return Turn(content="The total is 42.", thinking=SENTENCE * 300, thinking_chars=8, delay=0.002,
                reasoning_field=field)


def assert_cut_at_once(upstream) -> None:
    record = upstream.streams[0]  # the chanting stream was dropped early
    assert not record.completed and record.sent < record.planned // 4


async def detections(proxy, count: int = 1) -> list[dict]:
    """The proxy's log, once it holds `count` detections (each test has its own log)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            async with http.get(f"{proxy.root}/loopwarden/api/detections", params={"limit": 100}) as response:
                rows = (await response.json())["data"]
            if len(rows) >= count:
                return rows
            await asyncio.sleep(0.05)
    return rows


async def assert_logged_in_the_reasoning(proxy, api: str) -> None:
    (row,) = await detections(proxy)
    assert (row["type"], row["action"], row["enforced"]) == ("content", "cut", True)
    assert row["detail"]["channel"] == "reasoning" and row["detail"]["api"] == api
    assert row["detail"]["repeated"] in SENTENCE * 2 and row["detail"]["occurrences"] == 10


async def run(command: list[str], cwd: Path, env: dict[str, str], stdin: bytes = b"") -> tuple[int, str, str]:
    """A client's exit status, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env={"PATH": os.environ["PATH"], **env}, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        output, errors = await asyncio.wait_for(process.communicate(stdin), timeout=RUN_TIMEOUT)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode, output.decode(), errors.decode()


# The Vercel AI SDK.


async def ai_sdk(api: str, call: str, base_url: str, session: str) -> dict:
    """What the AI SDK gave back (see ai_sdk_reasoning.mjs). The script is read from stdin beside the installed
    packages, so that its imports resolve there."""
    needs(NODE_DIR / "node_modules" / "ai", NODE_DIR / "node_modules" / "@ai-sdk" / "openai-compatible",
          NODE_DIR / "node_modules" / "@ai-sdk" / "anthropic", what="The Vercel AI SDK")
    status, output, errors = await run(["node", "--input-type=module", "-", api, call, base_url, session],
                                       NODE_DIR, {"HOME": str(NODE_DIR)}, AI_SDK_SCRIPT.read_bytes())
    assert status == 0, errors
    result = orjson.loads(output)
    assert "thrown" not in result, result
    return result


def chants_then_answers(field: str = "reasoning_content") -> Callable[[dict], Turn]:
    """The model chants in its reasoning on the first turn, and answers the next one (the user's "Try again.")."""
    return lambda body: Turn(content="The total is 42.") if len(body["messages"]) > 1 else chanting(field)


def assert_turn_cut_cleanly(turn: dict, finish: str) -> None:
    assert turn["text"] == NOTICE  # the answer is the notice, not an empty turn
    assert (turn["finishReason"], turn["rawFinishReason"], turn["errors"]) == ("stop", finish, [])
    assert SENTENCE * 9 in turn["reasoning"] and len(turn["reasoning"]) < len(SENTENCE) * 12
    assert "error" not in turn["parts"] and turn["parts"]["finish"] == 1


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_ai_sdk_stream_text_over_chat_ends_with_the_notice_and_the_chat_goes_on(upstream, proxy, field):
    upstream.responder = chants_then_answers(field)
    result = await ai_sdk("chat", "conversation", proxy.url, f"ai-sdk-chat-{field}")
    assert_turn_cut_cleanly(result, "stop")
    assert_cut_at_once(upstream)
    await assert_logged_in_the_reasoning(proxy, "chat")
    # The next turn: the cut one is sent back with the notice as its text (and the reasoning the user saw, which
    # this SDK sends back); the user's new message is a new task, so no warning goes with it.
    assert (result["next"]["text"], result["next"]["finishReason"], result["next"]["errors"]) == \
        ("The total is 42.", "stop", [])
    first, second = upstream.chat_requests  # one request a turn: nothing was retried
    _, cut, retry = second["messages"]
    assert cut["content"] == NOTICE and cut.get("reasoning_content", result["reasoning"]) == result["reasoning"]
    assert retry == {"role": "user", "content": "Try again."}


async def test_ai_sdk_stream_text_over_anthropic_ends_with_the_notice_and_the_chat_goes_on(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.root)
    upstream.responder = chants_then_answers()  # in a thinking block
    result = await ai_sdk("anthropic", "conversation", proxy.url, "ai-sdk-anthropic")
    assert_turn_cut_cleanly(result, "end_turn")
    assert b"event: error" not in bytes(upstream.streams[0].body)
    assert_cut_at_once(upstream)
    await assert_logged_in_the_reasoning(proxy, "messages")
    # The SDK leaves the unsigned thinking block out of the next request itself ("unsupported reasoning
    # metadata"); the upstream, which refuses one, answers.
    assert (result["next"]["text"], result["next"]["finishReason"], result["next"]["errors"]) == \
        ("The total is 42.", "stop", [])
    first, second = upstream.messages_requests
    assert second["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": NOTICE}]}


@pytest.mark.parametrize("api", ["chat", "anthropic"])
async def test_ai_sdk_generate_text_asks_for_a_whole_answer_which_passes_as_it_came(upstream, proxy_factory, api):
    """`generateText` does not stream: the upstream has finished (and billed) the reasoning before anything
    reaches the proxy, so there is nothing to cut, and the answer is relayed whole."""
    proxy = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.root)
    upstream.responder = lambda body: chanting()
    result = await ai_sdk(api, "generateText", proxy.url, f"ai-sdk-generate-{api}")
    assert (result["text"], result["finishReason"], result["reasoning"]) == ("The total is 42.", "stop",
                                                                            SENTENCE * 300)
    (request,) = upstream.requests
    assert not request.json.get("stream") and not upstream.streams


# OpenCode and Qwen Code: coding agents over an OpenAI-compatible provider that streams `reasoning_content`.


def reasoning_model(agent_turn: Callable[[dict], bool]) -> Callable[[dict], Turn]:
    """The scripted model: it chants in its reasoning when it is the agent's turn; the client's side requests
    (a session title, a memory summary) get a short answer."""
    return lambda body: chanting("reasoning_content") if agent_turn(body) else Turn(content="Adding columns")


def system_prompt(body: dict) -> str:
    first = (body.get("messages") or [{}])[0]
    return first.get("content") if first.get("role") == "system" and isinstance(first.get("content"), str) else ""


async def test_opencode_run_ends_with_the_notice_and_does_not_retry(upstream, proxy, tmp_path):
    opencode = BIN / "opencode"
    needs(opencode, what="OpenCode")
    config = {"$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
              "model": "local/qwen3", "small_model": "local/qwen3",
              "provider": {"local": {"npm": "@ai-sdk/openai-compatible", "name": "Local",
                                     "options": {"baseURL": proxy.url, "apiKey": "sk-local-1"},
                                     "models": {"qwen3": {"name": "Qwen3", "reasoning": True}}}}}
    (tmp_path / "opencode.json").write_bytes(orjson.dumps(config))
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()

    def agent_turn(body: dict) -> bool:
        return bool(body.get("tools"))  # the session-title request carries none

    upstream.responder = reasoning_model(agent_turn)
    status, output, errors = await run(
        [str(opencode), "run", PROMPT], tmp_path / "project",
        {"HOME": str(tmp_path / "home"), "OPENCODE_CONFIG": str(tmp_path / "opencode.json"),
         "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"})
    assert status == 0, errors
    assert output.strip() == NOTICE.strip()
    assert "error" not in errors.lower()
    assert [agent_turn(request.json) for request in upstream.requests if request.path == "/v1/chat/completions"
            ].count(True) == 1  # the turn was not retried
    await assert_logged_in_the_reasoning(proxy, "chat")


async def test_qwen_code_ends_with_the_notice_and_does_not_retry(upstream, proxy, tmp_path):
    qwen = BIN / "qwen"
    needs(qwen, what="Qwen Code")
    home = tmp_path / "home"
    (home / ".qwen").mkdir(parents=True)
    (home / ".qwen" / "settings.json").write_text('{"security": {"auth": {"selectedType": "openai"}}}')
    (tmp_path / "project").mkdir()

    def agent_turn(body: dict) -> bool:
        return system_prompt(body).startswith("You are Qwen Code")  # not its memory-keeping side agent

    upstream.responder = reasoning_model(agent_turn)
    status, output, errors = await run(
        [str(qwen), "-p", PROMPT], tmp_path / "project",
        {"HOME": str(home), "TERM": "dumb", "OPENAI_BASE_URL": proxy.url, "OPENAI_API_KEY": "sk-local-1",
         "OPENAI_MODEL": "qwen3"})
    assert status == 0, errors
    assert output.strip() == NOTICE.strip()
    assert [agent_turn(request.json) for request in upstream.requests].count(True) == 1
    await assert_logged_in_the_reasoning(proxy, "chat")


# Codex CLI over the Responses API: gpt-oss's raw reasoning (`response.reasoning_text.delta`), and reasoning
# summaries. Codex retries a stream that ends without `response.completed`, up to 5 times.


@pytest.mark.parametrize("kind", ["reasoning_text", "summary"])
async def test_codex_exec_ends_with_the_notice_and_does_not_retry(upstream, proxy, tmp_path, kind):
    codex = BIN / "codex"
    needs(codex, what="Codex CLI")
    codex_home, project = tmp_path / "codex-home", tmp_path / "project"
    codex_home.mkdir()
    project.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "gpt-oss-120b"\nmodel_provider = "local"\n\n[model_providers.local]\nname = "Local"\n'
        f'base_url = "{proxy.url}"\nwire_api = "responses"\nenv_key = "LOCAL_API_KEY"\n')
    upstream.responder = lambda body: chanting(kind)
    status, output, errors = await run(
        [str(codex), "exec", "--skip-git-repo-check", PROMPT], project,
        {"HOME": str(tmp_path), "CODEX_HOME": str(codex_home), "LOCAL_API_KEY": "sk-local-1"})
    assert status == 0, errors
    assert output.strip() == NOTICE.strip()  # Codex prints the turn's last message
    assert "ERROR" not in errors and "Reconnecting" not in errors and "stream disconnected" not in errors
    assert len(upstream.responses_requests) == 1  # not retried
    assert_cut_at_once(upstream)
    await assert_logged_in_the_reasoning(proxy, "responses")


async def test_qwen_code_stuck_on_one_read_gets_the_default_warning_before_its_own_guard(
        upstream, proxy_factory, tmp_path):
    """Qwen Code halts on 5 identical calls and answers a re-read with `[File … unchanged since last read …]`:
    that answer is the read's result, and the default ladder warns after the 3rd read."""
    qwen = BIN / "qwen"
    needs(qwen, what="Qwen Code")
    proxy = await proxy_factory(upstream.url, preset="default")
    home, project = tmp_path / "home", tmp_path / "project"
    (home / ".qwen").mkdir(parents=True)
    (home / ".qwen" / "settings.json").write_text('{"security": {"auth": {"selectedType": "openai"}}}')
    project.mkdir()
    (project / "notes.md").write_text("| a | b |\n|---|---|\n| 4 | 5 |\n")

    def agent_turn(body: dict) -> bool:
        return system_prompt(body).startswith("You are Qwen Code")

    read = ("read_file", {"file_path": str(project / "notes.md")})
    upstream.responder = lambda body: Turn(tool_calls=[read]) if agent_turn(body) else Turn(content="Notes")
    await run([str(qwen), "-p", PROMPT], project,
              {"HOME": str(home), "TERM": "dumb", "OPENAI_BASE_URL": proxy.url, "OPENAI_API_KEY": "sk-local-1",
               "OPENAI_MODEL": "qwen3"})
    turns = [r.json for r in upstream.requests if r.path == "/v1/chat/completions" and agent_turn(r.json)]
    results = [[m for m in body["messages"] if m["role"] == "tool"] for body in turns]
    warned = next(k for k, body in enumerate(turns) if b"[loopwarden] Loop detected (1/2)" in orjson.dumps(body))
    assert len(results[warned]) == 3  # the answer to the third read carried the first warning
    assert "unchanged since last read" in str(results[warned][-1]["content"])
    rows = await detections(proxy)
    assert min((r["episode"], r["type"], r["action"]) for r in rows) == (1, "tool_call", "warned")
