"""The Anthropic Messages API (Claude Code, agents on the Anthropic SDKs) through loopwarden, with the real
`anthropic` client against a scripted upstream that streams the way Anthropic does."""

from __future__ import annotations

import asyncio

import aiohttp
import anthropic
import orjson
import pytest

from proxy.detect.engine import DetectConfig
from proxy.replay import read_records, replay
from tests.claude_agent import ClaudeAgent
from tests.fake_upstream import Turn
from tests.test_served_episodes import logged

LISTING = "src/app.py\nsrc/util.py\ntests/test_app.py\n"
SENTENCE = "I will now check the configuration file once more. "


def warnings_in(body: dict) -> list[tuple[int, int, str]]:
    """(message, block, text) of every warning block in an upstream request."""
    return [(i, j, block["text"]) for i, message in enumerate(body["messages"]) if isinstance(message["content"], list)
            for j, block in enumerate(message["content"])
            if block.get("type") == "text" and block.get("text", "").startswith("[loopwarden]")]


@pytest.fixture
async def messages_proxy(upstream, proxy_factory):
    return await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url.removesuffix("/v1"))


async def call_loop(agent: ClaudeAgent, upstream, count: int, result: str = LISTING, name: str = "Bash",
                    args: dict | None = None, is_error: bool = False) -> None:
    for _ in range(count):
        upstream.script.append(Turn(content="Let me look.", tool_calls=[(name, args or {"command": "ls src"})]))
        await agent.turn()
        agent.answer(result, is_error=is_error)


@pytest.mark.parametrize("stream", [False, True])
async def test_identical_calls_warn_twice_then_stop_and_every_fallback_resend_is_refused(upstream, messages_proxy,
                                                                                      stream):
    agent = ClaudeAgent(messages_proxy.root, stream=stream, headers={"X-Claude-Code-Session-Id": "cc-1"})
    await call_loop(agent, upstream, 5)
    assert all(warnings_in(body) == [] for body in upstream.messages_requests)
    assert agent.last_headers["x-loopwarden-session"] == "cc-1"

    await call_loop(agent, upstream, 1)
    sixth = upstream.messages_requests[5]
    (position, block, text), = warnings_in(sixth)
    # A text block after the tool_result blocks of the user message answering the 5th call.
    assert position == len(sixth["messages"]) - 1 and block == 1
    assert sixth["messages"][position]["content"][0]["type"] == "tool_result"
    assert text.startswith("[loopwarden] Loop detected (1/2): ") and "`Bash`" in text
    assert agent.last_headers["x-loopwarden-warning"] == "1/2 tool_call"
    # Nothing else changed: the system prompt with its cache_control, the tools, every other block.
    assert sixth["system"] == [{"type": "text", "text": "You are a careful coding agent.",
                                "cache_control": {"type": "ephemeral"}}]
    without = [dict(m, content=[b for b in m["content"] if not b.get("text", "").startswith("[loopwarden]")])
               for m in sixth["messages"]]
    assert without == orjson.loads(orjson.dumps(agent.messages[:11]))

    await call_loop(agent, upstream, 1)
    seventh = upstream.messages_requests[6]
    found = warnings_in(seventh)
    assert [t[:len("[loopwarden] Loop detected (1/2)")] for *_, t in found] == [
        "[loopwarden] Loop detected (1/2)", "[loopwarden] Loop detected (2/2)"]
    assert found[0] == (position, block, text)  # re-created at its place, the same text
    sent = len(upstream.messages_requests)

    with pytest.raises(anthropic.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.body["error"]["type"] == "loop_detected"
    assert caught.value.body["type"] == "error"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert caught.value.response.headers["x-loopwarden-loop"] == "tool_call"
    # Claude Code re-sends a refused request with features switched off: each is refused the same way.
    agent.stream = not stream
    resends = [{}, {"extra_headers": {"anthropic-beta": ""}},
               {"system": SYSTEM_NOTICE, "extra_body": {}},
               {"extra_body": {"messages": agent.messages + [{"role": "system", "content": "Tools were reloaded."}]}}]
    for extra in resends:
        with pytest.raises(anthropic.BadRequestError) as again:
            await agent.turn(**extra)
        assert again.value.body["error"]["type"] == "loop_detected"
    assert len(upstream.messages_requests) == sent  # nothing after the stop reached the upstream
    await agent.close()


SYSTEM_NOTICE = "You are a careful coding agent. All tools are loaded."


async def test_a_request_without_a_warning_goes_upstream_byte_for_byte(upstream, messages_proxy):
    agent = ClaudeAgent(messages_proxy.root)
    upstream.script.append(Turn(content="Reading.", tool_calls=[("Read", {"file_path": "src/app.py"})],
                                thinking="The test imports app; read it first."))
    await agent.turn()
    assert agent.messages[-1]["content"][0]["type"] == "thinking"  # the signed block, as the model sent it
    agent.answer("def main(): ...")
    upstream.script.append(Turn(content="Done."))
    await agent.client.messages.with_raw_response.create(
        model=agent.model, max_tokens=1024, messages=agent.messages, extra_query={"beta": "true"},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    received = upstream.requests[-1]
    assert received.query == "beta=true" and received.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    # The current SDKs send the key as `Authorization: Bearer` with `anthropic-version: 2026-10-21`.
    assert received.headers["authorization"] == "Bearer sk-ant-agent-key-1"
    assert received.headers["anthropic-version"] == "2026-10-21"
    assert orjson.loads(received.body)["messages"][1]["content"][0]["signature"].startswith("sig-")
    # Bytes as a client wrote them (indented, keys in its order) reach the upstream unchanged.
    raw = orjson.dumps({"model": agent.model, "max_tokens": 1024, "system": "Be brief.", "messages": agent.messages,
                        "tools": [{"name": "Read", "input_schema": {"type": "object"},
                                   "cache_control": {"type": "ephemeral"}}],
                        "thinking": {"type": "enabled", "budget_tokens": 2048}}, option=orjson.OPT_INDENT_2)
    upstream.script.append(Turn(content="Done."))
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{messages_proxy.root}/v1/messages", data=raw,
                                headers={"content-type": "application/json", "x-api-key": "sk-ant-claude-code",
                                         "anthropic-version": "2023-06-01"}) as answer:  # as Claude Code sends
            assert answer.status == 200
    assert upstream.requests[-1].body == raw and upstream.requests[-1].headers["x-api-key"] == "sk-ant-claude-code"
    await agent.close()


async def test_the_warning_keeps_thinking_blocks_and_cache_control_as_they_came(upstream, messages_proxy):
    agent = ClaudeAgent(messages_proxy.root, stream=True)
    for _ in range(6):
        upstream.script.append(Turn(content="Again.", tool_calls=[("Bash", {"command": "pytest -x"})],
                                    thinking="Run the tests once more."))
        await agent.turn()
        agent.answer("1 passed in 0.01s")
    agent.messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    upstream.script.append(Turn(content="ok"))
    await agent.turn()
    last = upstream.messages_requests[-1]
    (_, _, first), (position, block, second) = warnings_in(last)
    assert second.startswith("[loopwarden] Loop detected (2/2)")
    thinking = [b for m in last["messages"] for b in m["content"] if b["type"] == "thinking"]
    assert len(thinking) == 6 and all(b["signature"].startswith("sig-") for b in thinking)
    assert last["messages"][position]["content"][block - 1]["cache_control"] == {"type": "ephemeral"}
    assert last["system"][0]["cache_control"] == {"type": "ephemeral"}
    await agent.close()


async def test_a_cycle_and_the_same_failing_call_are_found(upstream, messages_proxy):
    cycle = ClaudeAgent(messages_proxy.root, headers={"X-Claude-Code-Session-Id": "cycle"})
    for _ in range(5):
        await call_loop(cycle, upstream, 1, "listing", name="Bash", args={"command": "ls"})
        await call_loop(cycle, upstream, 1, "contents", name="Read", args={"file_path": "a.py"})
    upstream.script.append(Turn(content="Hmm."))
    await cycle.turn()
    (*_, text), = warnings_in(upstream.messages_requests[-1])
    assert "cycle of tool calls (`Bash` with" in text

    failing = ClaudeAgent(messages_proxy.root, headers={"X-Claude-Code-Session-Id": "failing"})
    for i in range(3):
        await call_loop(failing, upstream, 1, "Exit code 1\nnpm ERR! missing script: tset",
                        args={"command": "npm run tset"}, is_error=True)
        await call_loop(failing, upstream, 1, f"edited {i}", name="Edit", args={"file_path": "package.json", "n": i})
    (*_, text), = warnings_in(upstream.messages_requests[-1])
    assert "`Bash` with" in text and "failed 3 times with the same error" in text
    await cycle.close()
    await failing.close()


async def test_chanting_is_cut_cleanly_and_the_sdk_stream_ends_normally(upstream, messages_proxy):
    agent = ClaudeAgent(messages_proxy.root, stream=True)
    upstream.script.append(Turn(content=SENTENCE * 400, chunk_chars=9, delay=0.0005))
    await agent.turn()
    assert agent.last.stop_reason == "end_turn"
    text = agent.text()
    assert text.endswith("\n\n[loopwarden] Output cut: the same text repeated 10 times.")
    assert len(text) < len(SENTENCE) * 20
    record = upstream.streams[-1]
    assert not record.completed and record.sent < record.planned // 5
    events = [line for line in record.body.split(b"\n") if line.startswith(b"event: ")]
    assert b"event: error" not in events

    # The next turn carries the warning; the cut text is the proxy's and is not counted again.
    agent.messages.append({"role": "user", "content": [{"type": "text", "text": "<system-reminder>todo list is empty"
                                                                                  "</system-reminder>"}]})
    upstream.script.append(Turn(content="Sorry."))
    await agent.turn()
    (*_, text), = warnings_in(upstream.messages_requests[-1])
    assert "keeps repeating the same text" in text  # a reminder block starts no task
    await agent.close()


async def test_a_chant_that_would_be_the_stop_is_cut_and_the_next_request_refused(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url, max_warnings=0)
    agent = ClaudeAgent(running.root, stream=True, headers={"X-Claude-Code-Session-Id": "chant"})
    upstream.script.append(Turn(content=SENTENCE * 400, chunk_chars=9))
    await agent.turn()
    assert agent.last.stop_reason == "end_turn" and "[loopwarden] Output cut" in agent.text()
    assert b"event: error" not in bytes(upstream.streams[-1].body)
    agent.messages.append({"role": "user", "content": [{"type": "text", "text": "<system-reminder>go on"
                                                                                  "</system-reminder>"}]})
    with pytest.raises(anthropic.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.body["error"]["type"] == "loop_detected"
    rows = await logged(running, "chant", 1)
    assert [(r["type"], r["action"], r["detail"]["api"]) for r in rows] == [("content", "stopped", "messages")]
    await agent.close()


async def test_a_persons_prompt_after_the_stop_starts_a_new_task(upstream, messages_proxy):
    agent = ClaudeAgent(messages_proxy.root, headers={"X-Claude-Code-Session-Id": "interactive"})
    await call_loop(agent, upstream, 7)
    with pytest.raises(anthropic.BadRequestError):
        await agent.turn()
    # Claude Code's interactive mode: the next prompt is appended after the tool results of the same message.
    agent.messages[-1]["content"].append({"type": "text", "text": "Stop listing; open src/app.py instead."})
    upstream.script.append(Turn(content="Opening it.", tool_calls=[("Read", {"file_path": "src/app.py"})]))
    await agent.turn()
    assert warnings_in(upstream.messages_requests[-1]) == []
    await agent.close()


async def test_subagents_and_side_requests_are_conversations_of_their_own(upstream, messages_proxy):
    main = ClaudeAgent(messages_proxy.root, headers={"X-Claude-Code-Session-Id": "s1"})
    await call_loop(main, upstream, 1)
    sub = ClaudeAgent(messages_proxy.root, headers={"X-Claude-Code-Session-Id": "s1", "x-claude-code-agent-id": "a7"})
    await call_loop(sub, upstream, 1)
    assert sub.last_headers["x-loopwarden-session"] == "s1/agent-a7"
    upstream.script.append(Turn(content='{"title": "Fix the test"}'))
    title = await main.client.messages.with_raw_response.create(
        model=main.model, max_tokens=64, messages=[{"role": "user", "content": "Title for: fix the test"}])
    assert title.headers["x-loopwarden-session"] == "s1/side"
    assert main.last_headers["x-loopwarden-session"] == "s1"
    await main.close()
    await sub.close()


async def test_count_tokens_and_models_pass_through_untouched_with_either_auth_style(upstream, messages_proxy):
    bearer = ClaudeAgent(messages_proxy.root, auth_token="sk-ant-oat-token",
                         headers={"anthropic-version": "2026-10-21"})
    counted = await bearer.client.messages.count_tokens(model=bearer.model, messages=bearer.messages)
    received = upstream.requests[-1]
    assert received.path == "/v1/messages/count_tokens"
    assert received.headers["authorization"] == "Bearer sk-ant-oat-token"
    assert received.headers["anthropic-version"] == "2026-10-21"
    assert counted is not None
    await bearer.client.get("/v1/models", cast_to=object)
    assert upstream.requests[-1].path == "/v1/models" and "anthropic-version" in upstream.requests[-1].headers
    assert upstream.messages_requests == []  # neither is a turn
    await bearer.close()


async def test_the_anthropic_key_setting_replaces_either_auth_style(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url,
                                  anthropic_upstream_api_key="sk-ant-proxy", upstream_api_key="sk-openai")
    for agent in (ClaudeAgent(running.root), ClaudeAgent(running.root, auth_token="t")):
        upstream.script.append(Turn(content="hi"))
        await agent.turn()
        headers = upstream.requests[-1].headers
        assert headers["x-api-key"] == "sk-ant-proxy" and "authorization" not in headers
        await agent.close()


async def test_a_bad_body_is_refused_in_anthropics_shape(messages_proxy):
    agent = ClaudeAgent(messages_proxy.root)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await agent.client.post("/v1/messages", body={"model": "m", "max_tokens": 5, "messages": "hello"},
                                cast_to=object)
    assert caught.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                            "message": "'messages' must be an array of objects"}}
    await agent.close()


async def test_replay_reads_the_messages_bodies_claude_code_sends(upstream, messages_proxy, tmp_path):
    agent = ClaudeAgent(messages_proxy.root, headers={"X-Claude-Code-Session-Id": "recorded"})
    await call_loop(agent, upstream, 7)
    body = {"model": agent.model, "max_tokens": 1024, "system": SYSTEM_NOTICE, "messages": agent.messages}
    (record,), errors = read_records([str(_write(tmp_path / "claude.json", body))])
    found = replay(DetectConfig(tool_call_threshold=5), record).episodes
    assert errors == [] and [(e["turn"], e["type"], e["action"]) for e in found] == [
        (5, "tool_call", "warned"), (6, "tool_call", "warned"), (7, "tool_call", "stopped")]
    await agent.close()


async def test_observe_mode_and_a_model_policy_on_claude_model_names(upstream, proxy_factory, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[models."claude-sonnet-*"]\ntool_call_threshold = 3\n')
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url, config=str(policy), mode="observe")
    agent = ClaudeAgent(running.root)
    await call_loop(agent, upstream, 3)
    upstream.script.append(Turn(content="Again."))
    await agent.turn()
    assert agent.last_headers["x-loopwarden-observed"] == "1/2 tool_call"  # the policy's threshold: 3
    assert warnings_in(upstream.messages_requests[-1]) == []  # observed, not changed
    await agent.close()


def _write(path, body: dict):
    path.write_bytes(orjson.dumps(body))
    return path


async def test_the_judge_asks_the_messages_upstream_in_its_own_dialect(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url, llm_check=True,
                                  llm_check_after_turns=3)
    upstream.judge = lambda body: Turn(content='{"analysis": "it re-reads files without using them", '
                                              '"confidence": 0.95}')
    agent = ClaudeAgent(running.root, headers={"X-Claude-Code-Session-Id": "judged"})
    for i in range(3):
        await call_loop(agent, upstream, 1, f"file {i}", name="Read", args={"file_path": f"src/f{i}.py"})
    await call_loop(agent, upstream, 1, "file 3", name="Read", args={"file_path": "src/f3.py"})  # the check's turn
    for _ in range(100):
        if any("X-Loopwarden-Judge" in r.headers for r in upstream.requests):
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    (asked,) = [r for r in upstream.requests if "X-Loopwarden-Judge" in r.headers]
    assert asked.path == "/v1/messages" and asked.json["model"] == agent.model
    assert asked.json["system"].startswith("You review the work of an autonomous AI agent")
    assert asked.headers["authorization"] == "Bearer sk-ant-agent-key-1"  # the client's own key
    await call_loop(agent, upstream, 1, "file 4", name="Read", args={"file_path": "src/f4.py"})
    (*_, text), = warnings_in(upstream.messages_requests[-1])
    assert text.startswith("[loopwarden] Loop detected (1/2)") and "re-reads files" in text
    await agent.close()
