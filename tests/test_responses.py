"""The Responses API through loopwarden, with the real openai client: full input and chained, streamed and
not, warned, stopped and cut like chat completions; chained conversations followed across replicas."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import openai
import orjson
import pytest

from tests.fake_upstream import Turn
from tests.responses_agent import TOOLS, ResponsesAgent

CONTENT = "def main():\n    return load_config('settings.toml')\n"
SENTENCE = "I will now check the configuration file once more. "
MODES = [pytest.param(chained, stream, id=f"{'chained' if chained else 'full'}-{'stream' if stream else 'json'}")
         for chained in (False, True) for stream in (False, True)]


def warnings_in(body: dict) -> list[tuple[int, str, str]]:
    """(position, role, text) of every loopwarden warning among a Responses request's input items."""
    items = body.get("input")
    items = items if isinstance(items, list) else []
    return [(i, item.get("role"), item["content"]) for i, item in enumerate(items)
            if isinstance(item.get("content"), str) and item["content"].startswith("[loopwarden]")]


async def loop_calls(agent: ResponsesAgent, upstream, count: int, result, name: str = "read_file", args=None):
    for i in range(count):
        upstream.script.append(Turn(tool_calls=[(name, args or {"path": "src/app.py"})]))
        await agent.turn()
        agent.answer(result(i) if callable(result) else result)


@pytest.mark.parametrize("chained, stream", MODES)
async def test_identical_calls_warn_twice_then_stop(upstream, proxy, chained, stream):
    agent = ResponsesAgent(proxy.url, chained=chained, stream=stream)
    await loop_calls(agent, upstream, 5, CONTENT)
    assert all(warnings_in(body) == [] for body in upstream.responses_requests)

    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
    await agent.turn()
    sixth = upstream.responses_requests[5]
    ((position, role, text),) = warnings_in(sixth)
    assert position == len(sixth["input"]) - 1 and role == "system"  # right after the 5th call's output
    assert text.startswith("[loopwarden] Loop detected (1/2): ") and "`read_file`" in text
    assert agent.last_headers["x-loopwarden-warning"] == "1/2 tool_call"
    agent.answer(CONTENT)

    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
    await agent.turn()
    seventh = upstream.responses_requests[6]
    found = [text[:32] for _, _, text in warnings_in(seventh)]
    if chained:  # the service keeps the first warning: it is sent once, never again in the chain
        assert found == ["[loopwarden] Loop detected (2/2)"]
        assert seventh["previous_response_id"] == upstream.stored[seventh["previous_response_id"]]["id"]
    else:  # the whole input is resent: the first warning is re-created at its place
        assert found == ["[loopwarden] Loop detected (1/2)", "[loopwarden] Loop detected (2/2)"]
        assert warnings_in(seventh)[0][0] == position
    agent.answer(CONTENT)

    with pytest.raises(openai.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.code == "loop_detected" and caught.value.body["type"] == "loop_detected"
    assert caught.value.response.headers["x-loopwarden-loop"] == "tool_call"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(upstream.responses_requests) == 7  # the stop never reached upstream
    await agent.close()


async def test_alternating_calls_are_a_cycle(upstream, proxy):
    agent = ResponsesAgent(proxy.url, chained=True)
    for i in range(10):
        name = "ls" if i % 2 == 0 else "read_file"
        await loop_calls(agent, upstream, 1, "a.py b.py" if name == "ls" else CONTENT, name=name)
    upstream.script.append(Turn(content="Let me think."))
    await agent.turn()
    ((_, _, text),) = warnings_in(upstream.responses_requests[-1])
    assert "cycle of tool calls (`ls` with" in text and "→ `read_file` with" in text
    await agent.close()


async def test_the_same_failing_call_is_a_tool_error(upstream, proxy):
    agent = ResponsesAgent(proxy.url, stream=True)
    await loop_calls(agent, upstream, 3, lambda i: f"Error: build failed at 2026-11-23T10:00:0{i}Z",
                     name="run_build", args={"target": "all"})
    upstream.script.append(Turn(content="Hmm."))
    await agent.turn()
    ((_, _, text),) = warnings_in(upstream.responses_requests[-1])
    assert "`run_build` with {\"target\":\"all\"} failed 3 times with the same error" in text
    await agent.close()


async def test_chanting_is_cut_and_the_sdk_stream_ends_cleanly(upstream, proxy):
    agent = ResponsesAgent(proxy.url, stream=True, chained=True)
    upstream.script.append(Turn(content=SENTENCE * 300, chunk_chars=7, burst=True))
    response = await agent.turn()
    completed = agent.events[-1]
    assert completed["type"] == "response.completed"
    assert completed["loopwarden"] == {"loop": "content", "action": "cut", "episode": "1/2"}
    text = response["output"][0]["content"][0]["text"]
    assert text.endswith("\n\n[loopwarden] Output cut: the same text repeated 10 times.")
    assert text.count(SENTENCE.strip()) <= 10 and response["status"] == "completed"
    numbers = [e["sequence_number"] for e in agent.events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)

    # The next request of the chain carries the warning (once); the cut text is the model's, the notice not.
    upstream.script.append(Turn(content="Sorry, here is the summary."))
    await agent.turn()
    ((_, _, warning),) = warnings_in(upstream.responses_requests[-1])
    assert warning.startswith("[loopwarden] Loop detected (1/2): your reply keeps repeating")
    await agent.close()


async def test_a_stop_reached_mid_stream_raises_loop_detected(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, max_warnings=0)
    agent = ResponsesAgent(running.url, stream=True)
    upstream.script.append(Turn(content=SENTENCE * 300, chunk_chars=9))
    with pytest.raises(openai.APIError) as caught:
        await agent.turn()
    assert caught.value.code == "loop_detected" and "Loop detected" in caught.value.message
    # The stop's message carries the way back, as a stop refused before the request does.
    link = re.search(r"open (http://\S+/loopwarden/resume/[\w-]+)", caught.value.message)
    assert link, caught.value.message
    async with aiohttp.ClientSession() as http:
        async with http.get(link.group(1)) as page:
            assert page.status == 200 and "Resume the session" in await page.text()
    await agent.close()


async def test_a_chain_continued_on_a_freshly_started_replica_reaches_the_same_verdicts(upstream, proxy_factory,
                                                                                     tmp_path):
    database = f"sqlite+aiosqlite:///{tmp_path}/shared.db"
    first = await proxy_factory(upstream.url, database_url=database)
    agent = ResponsesAgent(first.url, chained=True)
    await loop_calls(agent, upstream, 6, CONTENT)  # the 6th request carried the first warning
    assert len(warnings_in(upstream.responses_requests[-1])) == 1
    await first.runner.cleanup()  # flushes what it logged and kept

    second = await proxy_factory(upstream.url, database_url=database)
    await agent.client.close()
    agent.client = openai.AsyncOpenAI(base_url=second.url, api_key="sk-agent-key-123", max_retries=0)
    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
    await agent.turn()
    found = [text[:32] for _, _, text in warnings_in(upstream.responses_requests[-1])]
    assert found == ["[loopwarden] Loop detected (2/2)"]  # the first is in the chain already
    agent.answer(CONTENT)
    with pytest.raises(openai.BadRequestError) as caught:
        await agent.turn()
    assert caught.value.code == "loop_detected"
    # Both replicas named the same session: the chain's.
    rows = []
    async with aiohttp.ClientSession() as http:
        for _ in range(50):  # the log is written in batches
            async with http.get(f"{second.root}/loopwarden/api/detections") as response:
                rows = (await response.json())["data"]
            if len(rows) == 3:
                break
            await asyncio.sleep(0.05)
    assert [(r["episode"], r["action"], r["detail"]["api"]) for r in rows] == [
        (3, "stopped", "responses"), (2, "warned", "responses"), (1, "warned", "responses")]
    assert len({r["session_id"] for r in rows}) == 1
    await agent.close()


async def test_a_chain_through_a_response_never_seen_is_analysed_from_what_there_is(upstream, proxy):
    # The first responses went straight to the service; loopwarden sees the chain from the middle.
    direct = ResponsesAgent(upstream.url, chained=True)
    await loop_calls(direct, upstream, 3, CONTENT)
    agent = ResponsesAgent(proxy.url, chained=True)
    agent.previous_id, agent.pending = direct.previous_id, direct.pending
    await loop_calls(agent, upstream, 3, CONTENT)
    assert all(warnings_in(body) == [] for body in upstream.responses_requests)
    # An unknown previous response: the service's own error passes through, the proxy adds nothing.
    with pytest.raises(openai.BadRequestError) as caught:
        await agent.client.responses.create(model="gpt-test", input="hi", previous_response_id="resp_unknown")
    assert caught.value.code == "previous_response_not_found"
    await agent.close()
    await direct.close()


async def test_requests_and_answers_without_a_warning_are_byte_for_byte(upstream, proxy):
    body = orjson.dumps({"model": "gpt-test", "input": [{"role": "user", "content": "hi"}], "store": False,
                         "reasoning": {"effort": "low"}, "include": ["reasoning.encrypted_content"],
                         "prompt_cache_key": "k-1", "tools": [], "stream": True}) + b"  "
    upstream.script.append(Turn(content="Hello there, nice to meet you.", chunk_chars=3))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/responses", data=body,
                             headers={"Content-Type": "application/json"}) as response:
            received = await response.read()
    assert upstream.responses_raw[-1] == body
    assert received == bytes(upstream.streams[-1].body)
    upstream.script.append(Turn(content="Hello again."))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/responses", json={"model": "gpt-test", "input": "hi"}) as response:
            assert (await response.json())["output"][0]["content"][0]["text"] == "Hello again."


async def test_bad_responses_input_is_a_clear_400(upstream, proxy):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/responses", json={"model": "m", "input": 42}) as response:
            body = await response.json()
    assert response.status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "'input'" in body["error"]["message"]
    assert upstream.responses_requests == []


async def test_sessions_from_the_conversation_id(upstream, proxy):
    agent = ResponsesAgent(proxy.url)
    upstream.script.append(Turn(content="hi"))
    raw = await agent.client.responses.with_raw_response.create(model="gpt-test", input="hi",
                                                                extra_body={"conversation": "conv_42"})
    assert raw.headers["x-loopwarden-session"] == "conv_42"
    await agent.close()
    await asyncio.sleep(0)


# A looping Codex CLI run as it sent it (exec_command outputs with a new Chunk ID each time, full input,
# `store: false`), with the reasoning items its model would have sent back before each call.
CODEX = orjson.loads((Path(__file__).parent / "fixtures" / "codex_exec_loop.json").read_bytes())


def codex_requests() -> list[dict]:
    """Codex's request before each turn: the opening messages, then each call and its output."""
    items: list[dict] = []
    requests = []
    for item in CODEX["input"]:
        if item.get("type") == "function_call":
            if not requests:
                requests.append(list(items))
            items.append({"type": "reasoning", "id": f"rs_{len(items)}", "summary": [],
                          "encrypted_content": "gAAAAB" + "x" * 40})
        items.append(item)
        if item.get("type") == "function_call_output":
            requests.append(list(items))
    # The recording ends with the request that carried the second warning; the agent went on once more.
    call, output = dict(items[-2]), dict(items[-1])
    call["call_id"] = output["call_id"] = "call_again"
    call["id"] = "fc_again"
    output["output"] = output["output"].replace("Chunk ID: ", "Chunk ID: 9", 1)
    requests.append(list(items) + [{"type": "reasoning", "id": "rs_again", "summary": [],
                                    "encrypted_content": "gAAAAB" + "y" * 40}, call, output])
    return [{**{k: v for k, v in CODEX.items() if k != "input"}, "input": r} for r in requests]


async def test_a_codex_run_is_warned_and_stopped_at_the_same_calls_as_a_chat_agent(upstream, proxy):
    outcomes = []
    async with aiohttp.ClientSession() as http:
        for body in codex_requests():
            upstream.script.append(Turn(tool_calls=[("exec_command", {"cmd": "cat a.txt"})]))
            async with http.post(f"{proxy.url}/responses", json=body,
                                 headers={"session_id": "codex-run", "Authorization": "Bearer sk-x"}) as response:
                await response.read()
                outcomes.append("stop" if response.status == 400 else
                                response.headers.get("X-Loopwarden-Warning", "-"))
            if response.status == 400:
                error = (await response.json())["error"]
                assert error["code"] == "loop_detected" and "`exec_command` with {\"cmd\":\"cat a.txt\"}" in \
                    error["message"]
                break
    sent = upstream.responses_requests
    assert all(r["input"][:4] == body["input"][:4] for r, body in zip(sent, codex_requests()))
    # Reasoning items go upstream untouched, each still right before its call.
    last = sent[-1]["input"]
    assert [last[i + 1]["type"] for i, item in enumerate(last) if item.get("type") == "reasoning"] == \
        ["function_call"] * sum(1 for item in last if item.get("type") == "function_call")

    # The same calls and outputs as a chat agent's conversation, through the chat path.
    from tests.agent import Agent

    chat = Agent(proxy.url, headers={"X-Loopwarden-Session": "chat-twin"})
    chat_outcomes = []
    outputs = [item["output"] for item in codex_requests()[-1]["input"] if item.get("type") == "function_call_output"]
    for output in outputs + [None]:
        upstream.script.append(Turn(tool_calls=[("exec_command", {"cmd": "cat a.txt"})]))
        try:
            await chat.turn()
        except openai.BadRequestError:
            chat_outcomes.append("stop")
            break
        chat_outcomes.append(chat.last_headers.get("x-loopwarden-warning", "-"))
        if output is not None:
            chat.answer(output)
    await chat.close()
    assert outcomes == chat_outcomes, (outcomes, chat_outcomes)
    assert outcomes[-3:] == ["1/2 tool_call", "2/2 tool_call", "stop"]


async def test_the_judge_watches_responses_sessions_too(upstream, proxy_factory):
    from tests.test_judge import judged, verdict

    proxy = await proxy_factory(upstream.url, llm_check=True)

    items: list[dict] = [{"role": "user", "content": "Migrate the payment service."}]
    for i in range(31):
        items += [{"type": "function_call", "call_id": f"c{i}", "name": "edit_file",
                   "arguments": orjson.dumps({"path": f"src/f{i}.py"}).decode()},
                  {"type": "function_call_output", "call_id": f"c{i}", "output": f"edited f{i}"}]
    upstream.judge = lambda body: verdict(0.95, "it edits and reverts the same files")
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-agent", max_retries=0)
    session = {"X-Loopwarden-Session": "judged-responses"}
    await client.responses.create(model="agent-model", input=items[:61], extra_headers=session)  # 30 turns
    assert await judged(upstream, 1)
    assert "Migrate the payment service." in upstream.judge_requests[0]["messages"][1]["content"]
    await client.responses.create(model="agent-model", input=items, extra_headers=session)
    ((_, role, text),) = warnings_in(upstream.responses_requests[-1])
    assert text.startswith("[loopwarden] Loop detected (1/2)") and "edits and reverts" in text
    await client.close()


async def test_observe_mode_follows_a_chained_conversation(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, mode="observe")
    agent = ResponsesAgent(running.url, chained=True)
    await loop_calls(agent, upstream, 7, CONTENT)
    upstream.script.append(Turn(content="ok"))
    await agent.turn()  # the 8th request would have been refused; observed, it goes on
    assert agent.last_headers["x-loopwarden-observed"] == "stop tool_call"
    assert all(warnings_in(body) == [] for body in upstream.responses_requests)
    assert len(upstream.responses_requests) == 8
    await agent.close()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_calls_named_by_item_reference_are_read_as_the_calls_they_name(upstream, proxy_factory, stream):
    """The AI SDK (Mastra's `openai(...)`) sends a kept response's calls back as `item_reference` items, with
    `store` on and the whole input each time: the calls are the ones the proxy relayed, and the loop shows."""
    proxy = await proxy_factory(upstream.url, preset="default")
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-mastra", max_retries=0)
    items: list[dict] = [{"role": "user", "content": "Fix the failing test."}]
    for number in range(1, 5):
        upstream.script.append(Turn(tool_calls=[("read_file", {"path": "src/app.py"})]))
        kwargs = dict(model="gpt-test", input=items, tools=TOOLS, store=True)
        if stream:
            response = None
            async for event in await client.responses.create(stream=True, **kwargs):
                if event.type == "response.completed":
                    response = event.response.to_dict()
        else:
            response = (await client.responses.create(**kwargs)).to_dict()
        for item in response["output"]:
            if item["type"] == "function_call":
                items += [{"type": "item_reference", "id": item["id"]},
                          {"type": "function_call_output", "call_id": item["call_id"], "output": CONTENT}]
    # The 4th request carried the warning after the 3rd identical call, placed after its output.
    fourth = upstream.responses_requests[3]
    assert [text[:33] for _, _, text in warnings_in(fourth)] == ["[loopwarden] Loop detected (1/2):"]
    assert [item.get("type") for item in fourth["input"]][-2:] == ["function_call_output", "message"]
    await client.close()
