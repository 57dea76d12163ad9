"""The judge through the proxy: its schedule, its verdicts, and that it never costs a request time."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import orjson
import pytest

from proxy.server.app import GUARD
from tests.convo import conversation, step, user
from tests.fake_upstream import Turn

TASK = "Migrate the payment service to the new billing API."


# One agent's run: every request resends the same history (same call ids), one turn longer.
RUN = conversation(user(TASK), *[step("edit_file", {"path": f"src/f{i}.py", "line": i}, f"edited f{i}")
                                 for i in range(80)])


def history(turns: int) -> list[dict]:
    """A task with `turns` assistant turns of distinct, productive-looking tool calls."""
    return RUN[:2 + 2 * turns]


def verdict(confidence, analysis: str = "it keeps re-reading the same config") -> Turn:
    return Turn(content=orjson.dumps({"analysis": analysis, "confidence": confidence}).decode())


async def ask(url: str, turns: int, session: str = "judged") -> tuple[float, dict]:
    client = openai.AsyncOpenAI(base_url=url, api_key="sk-agent", max_retries=0)
    started = time.perf_counter()
    try:
        await client.chat.completions.create(model="agent-model", messages=history(turns),
                                             extra_headers={"X-Loopwarden-Session": session})
    finally:
        await client.close()
    return time.perf_counter() - started, {}


async def judged(upstream, count: int, timeout: float = 5.0) -> bool:
    """Wait until the judge has been asked `count` times (and its answer recorded)."""
    deadline = time.monotonic() + timeout
    while len(upstream.judge_requests) < count:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    return True


def warnings_in(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if str(m.get("content", "")).startswith("[loopwarden]")]



@pytest.fixture
async def proxy(upstream, proxy_factory):
    """The judge spends model calls, so it runs only when asked for: these tests ask."""
    return await proxy_factory(upstream.url, llm_check=True)


async def test_schedule_first_at_turn_30_then_adaptive(upstream, proxy):
    answers = [verdict(0.85), verdict(0.0), verdict(0.3)]
    upstream.judge = lambda body: answers.pop(0)
    await ask(proxy.url, 29)
    await asyncio.sleep(0.3)
    assert upstream.judge_requests == []
    await ask(proxy.url, 30)
    assert await judged(upstream, 1)
    prompt = upstream.judge_requests[0]["messages"][1]["content"]
    assert TASK in prompt and "edit_file" in prompt
    assert upstream.judge_requests[0]["model"] == "agent-model"
    # 0.85 -> the next check 7 turns later.
    await ask(proxy.url, 36)
    await asyncio.sleep(0.3)
    assert len(upstream.judge_requests) == 1
    await ask(proxy.url, 37)
    assert await judged(upstream, 2)
    # 0.0 -> 15 turns later.
    await ask(proxy.url, 51)
    await asyncio.sleep(0.3)
    assert len(upstream.judge_requests) == 2
    await ask(proxy.url, 52)
    assert await judged(upstream, 3)
    assert all(warnings_in(body) == [] for body in upstream.chat_requests)


async def test_a_sure_verdict_warns_on_the_next_request(upstream, proxy):
    upstream.judge = lambda body: verdict(0.95, "it edits and reverts the same line")
    await ask(proxy.url, 30)
    assert await judged(upstream, 1)
    await ask(proxy.url, 31)
    (text,) = warnings_in(upstream.chat_requests[-1])
    assert text.startswith("[loopwarden] Loop detected (1/2)") and "edits and reverts the same line" in text
    # The warning sits after the turn that followed the judged conversation.
    body = upstream.chat_requests[-1]
    assert body["messages"][-1]["content"] == text


async def test_confirmation_below_the_threshold_is_no_loop(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, llm_check=True, judge_confirm_model="strong-model")
    upstream.judge = lambda body: verdict(0.89 if body["model"] == "strong-model" else 0.95)
    await ask(running.url, 30)
    assert await judged(upstream, 2)
    assert [b["model"] for b in upstream.judge_requests] == ["agent-model", "strong-model"]
    await ask(running.url, 31)
    assert warnings_in(upstream.chat_requests[-1]) == []
    # The confirming model's 0.89 sets the next interval: 6 turns.
    await ask(running.url, 35)
    await asyncio.sleep(0.3)
    assert len(upstream.judge_requests) == 2
    await ask(running.url, 36)
    assert await judged(upstream, 3)


@pytest.mark.parametrize("answer", [
    Turn(content="I think the agent is fine, maybe."),
    Turn(content='{"confidence": 7, "analysis": "out of range"}'),
    Turn(status=500),
    Turn(hang=True),
])
async def test_a_failing_judge_never_harms_a_request(upstream, proxy_factory, answer):
    running = await proxy_factory(upstream.url, llm_check=True, judge_timeout=0.5)
    upstream.judge = lambda body: answer
    elapsed, _ = await ask(running.url, 30)
    assert elapsed < 1.0
    assert await judged(upstream, 1)
    await asyncio.sleep(0.7)  # past the judge's timeout
    await ask(running.url, 31)
    assert warnings_in(upstream.chat_requests[-1]) == []


async def test_a_slow_judge_does_not_slow_the_request_that_started_it(upstream, proxy):
    upstream.judge = lambda body: Turn(content=verdict(0.1).content, latency=2.0)
    quiet, _ = await ask(proxy.url, 29, session="timing")
    due, _ = await ask(proxy.url, 30, session="timing")
    for _ in range(50):
        if upstream.judge_requests:
            break
        await asyncio.sleep(0.02)
    assert len(upstream.judge_requests) == 1  # it was asked, and is still thinking
    assert due < 1.0 and due < quiet + 0.5


@pytest.mark.parametrize("rejected, used", [(("json_schema",), "json_object"),
                                            (("json_schema", "json_object"), None)])
async def test_backends_without_structured_output_still_give_a_verdict(upstream, proxy, rejected, used):
    def judge(body):
        return Turn(content="Verdict: " + verdict(0.97).content, reject_response_format=rejected)
    upstream.judge = judge
    await ask(proxy.url, 30)
    assert await judged(upstream, 1 + len(rejected))
    assert (upstream.judge_requests[-1].get("response_format") or {}).get("type") == used
    await ask(proxy.url, 31)
    assert len(warnings_in(upstream.chat_requests[-1])) == 1


async def test_judge_requests_through_the_proxy_are_not_inspected(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, llm_check=True)
    # A second proxy whose judge is the first proxy: its judge requests pass through it untouched.
    outer = await proxy_factory(running.url, llm_check=True)
    upstream.judge = lambda body: verdict(0.2)
    await ask(outer.url, 30)
    assert await judged(upstream, 1)

    async def get(url: str) -> dict:
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as response:
                return await response.json()

    for _ in range(50):
        stats = await get(f"{outer.root}/loopwarden/api/stats")
        sessions = (await get(f"{running.root}/loopwarden/api/sessions"))["data"]
        if stats["judge_checks"] and sessions:
            break
        await asyncio.sleep(0.1)
    # Only the agent's request made a session (its id is a fingerprint: the outer proxy does not pass
    # its own X-Loopwarden-* headers on); the judge's did not.
    assert [s["messages"] for s in sessions] == [len(history(30))]
    assert stats["judge_checks"] == 1 and stats["judge_tokens"] > 0


def test_each_dialect_asks_the_judge_question_in_its_own_shape():
    """Pure: the judge's question as each dialect's request, the ways of asking for JSON in turn, and the answer
    read back with its tokens."""
    from proxy.config import build
    from proxy.judge import VERDICT_SCHEMA
    from proxy.wire import GEMINI, OPENAI, ROUTES, judge_route
    from proxy.wire.dialect import JudgeQuestion

    question = JudgeQuestion("m-1", "You review.", "The user's request: x", VERDICT_SCHEMA)
    chat = [OPENAI.judge_call(question, "k", attempt) for attempt in range(4)]
    assert [c and (c.body.get("response_format") or {}).get("type") for c in chat] == \
        ["json_schema", "json_object", None, None]
    assert chat[0].path == "/v1/chat/completions" and chat[0].headers == {"Authorization": "Bearer k"}
    assert OPENAI.judge_reply({"choices": [{"message": {"content": "{}"}}], "usage": {"total_tokens": 9}}) == ("{}", 9)
    responses = ROUTES["/v1/responses"].judge_call(question, "k", 0)
    assert responses.path == "/v1/chat/completions"  # a Responses session is judged over Chat Completions

    messages = ROUTES["/v1/messages"]
    call = messages.judge_call(question, "k", 0)
    assert (call.path, call.body["system"], call.body["max_tokens"]) == ("/v1/messages", "You review.", 400)
    assert messages.judge_call(question, "k", 1) is None
    assert messages.judge_reply({"content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "{}"}],
                                 "usage": {"input_tokens": 5, "output_tokens": 2}}) == ("{}", 7)

    call = GEMINI.judge_call(JudgeQuestion("models/g 1", "s", "t", VERDICT_SCHEMA), "gk", 0)
    assert call.path == "/v1beta/models/models%2Fg%201:generateContent" and call.headers == {"x-goog-api-key": "gk"}
    assert GEMINI.judge_reply({"candidates": [{"content": {"parts": [{"text": "x", "thought": True},
                                                                     {"text": "{}"}]}}],
                               "usageMetadata": {"totalTokenCount": 11}}) == ("{}", 11)
    assert GEMINI.judge_reply({"candidates": "no"}) == ("", 0)

    own = build({"upstream_url": "http://u/v1", "gemini_upstream_url": "http://g/v1beta",
                 "gemini_upstream_api_key": "gemini-key"}, environ={})
    route = judge_route(own, GEMINI)
    assert (route.dialect, str(route.url(call.path)), route.key) == (
        GEMINI, "http://g/v1beta/models/models%2Fg%201:generateContent", "gemini-key")
    elsewhere = build({"upstream_url": "http://u/v1", "judge_url": "http://j/v1", "judge_api_key": "jk"}, environ={})
    route = judge_route(elsewhere, GEMINI)  # JUDGE_URL: Chat Completions for every session
    assert (route.dialect, str(route.url("/v1/chat/completions")), route.key) == (
        OPENAI, "http://j/v1/chat/completions", "jk")


def _chat_answer(content: str, usage: dict | None = None) -> bytes:
    return orjson.dumps({"id": "j", "object": "chat.completion", "model": "m", "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        "usage": usage or {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


@pytest.mark.parametrize("answer", [
    Turn(raw_body=_chat_answer("x" * 40_000_000)),  # 40 MB: refused as it comes, never held whole
    Turn(raw_body=_chat_answer("{" * 300_000)),  # a search for the object in it is linear
    Turn(raw_body=_chat_answer('{"confidence": 0.2, "analysis": "fine"}', {"total_tokens": -5})),
    Turn(raw_body=b"[" * 100_000 + b"]" * 100_000),  # nested past what the parser takes
])
async def test_a_hostile_judge_answer_costs_nothing_and_breaks_nothing(upstream, proxy_factory, answer, caplog):
    running = await proxy_factory(upstream.url, judge_timeout=5, llm_check=True)
    upstream.judge = lambda body: answer
    elapsed, _ = await ask(running.url, 30)
    assert elapsed < 1.0 and await judged(upstream, 1)
    started = time.perf_counter()
    await ask(running.url, 31)  # the loop is free while the answer is read
    assert time.perf_counter() - started < 1.0
    judges = running.runner.app[GUARD].judges
    for _ in range(100):
        if not judges._running:
            break
        await asyncio.sleep(0.05)
    assert not judges._running
    assert "Traceback" not in caplog.text and "never retrieved" not in caplog.text
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.root}/metrics") as scraped:
            tokens = [line for line in (await scraped.text()).splitlines()
                      if line.startswith("loopwarden_judge_tokens_total")]
    assert tokens and float(tokens[0].split()[-1]) >= 0


async def test_the_judge_is_off_until_asked_for(upstream, proxy_factory):
    """It spends model calls on the agent's key: with the settings as they come, a long task makes none."""
    running = await proxy_factory(upstream.url)
    upstream.judge = lambda body: verdict(0.95)
    for turns in (30, 31, 45):
        await ask(running.url, turns)
    assert not await judged(upstream, 1, timeout=1.0)
    assert len(upstream.chat_requests) == 3  # the agent's own requests only
