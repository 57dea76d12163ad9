"""The Gemini API through the proxy, driven by the real google-genai SDK in front of a scripted Gemini upstream:
a model stuck on one call warned twice and stopped, the warning placed after the function response and kept,
thought signatures untouched, a chanting stream cut cleanly, and the other Gemini calls relayed untouched."""

from __future__ import annotations

import base64

import aiohttp
import orjson
import pytest
from google import genai
from google.genai import errors, types

from tests.fake_upstream import Turn
from tests.test_log_api import wait_for

SENTENCE = "I will run the tests again to see whether they pass now. "
TOOLS = [types.Tool(function_declarations=[types.FunctionDeclaration(
    name="read_file", description="Read calc.py", parameters_json_schema={"type": "object"})])]
CONFIG = types.GenerateContentConfig(
    tools=TOOLS, automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))


def client_for(proxy) -> genai.Client:
    return genai.Client(api_key="gemini-key-1", http_options=types.HttpOptions(
        base_url=proxy.root, api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)))


async def ask(client: genai.Client, history: list[types.Content], stream: bool) -> types.Content:
    """One turn; the model's content (every part, signatures and all) as the SDK gives it back."""
    if not stream:
        answer = await client.aio.models.generate_content(model="gemini-test", contents=history, config=CONFIG)
        return answer.candidates[0].content
    parts: list[types.Part] = []
    async for chunk in await client.aio.models.generate_content_stream(model="gemini-test", contents=history,
                                                                       config=CONFIG):
        if chunk.candidates and chunk.candidates[0].content and chunk.candidates[0].content.parts:
            parts += chunk.candidates[0].content.parts
    return types.Content(role="model", parts=parts)


def warnings_in(body: dict) -> list[str]:
    return [part["text"] for content in body["contents"] for part in content["parts"]
            if part.get("text", "").startswith("[loopwarden]")]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_model_stuck_on_one_call_is_warned_twice_then_refused(upstream, proxy_factory, stream):
    proxy = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    client = client_for(proxy)
    history = [types.Content(role="user", parts=[types.Part(text="Make the tests pass.")])]
    signatures = []
    for number in range(1, 8):
        upstream.script.append(Turn(tool_calls=[("read_file", {})]))
        content = await ask(client, history, stream)
        call = next(part for part in content.parts if part.function_call)
        signatures.append(call.thought_signature)
        history += [content, types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            name="read_file", response={"output": "def add(a, b):\n    return a - b\n"}))])]
    upstream.script.append(Turn(tool_calls=[("read_file", {})]))
    with pytest.raises(errors.ClientError) as refused:
        await ask(client, history, stream)
    assert refused.value.code == 400 and refused.value.status == "FAILED_PRECONDITION"
    assert "[loopwarden] Loop detected" in refused.value.message
    assert refused.value.details["error"]["details"][0]["reason"] == "LOOP_DETECTED"

    sent = upstream.gemini_requests
    assert len(sent) == 7  # the eighth was answered by the proxy
    assert all(b"[loopwarden]" not in request.body for request in sent[:5])
    sixth, seventh = sent[5].json, sent[6].json
    assert [w[:31] for w in warnings_in(sixth)] == ["[loopwarden] Loop detected (1/2"]
    fifth_answer = sixth["contents"][10]["parts"]
    assert "functionResponse" in fifth_answer[0] and fifth_answer[1]["text"].startswith("[loopwarden]")
    assert seventh["contents"][:11] == sixth["contents"][:11]  # the first warning, re-created where it was
    assert [w[:31] for w in warnings_in(seventh)] == ["[loopwarden] Loop detected (1/2",
                                                      "[loopwarden] Loop detected (2/2"]
    # Every model turn goes back with the signature the upstream gave it.
    for index, signature in enumerate(signatures[:6]):  # the seventh answer is in no request
        part = seventh["contents"][1 + 2 * index]["parts"][-1]
        assert base64.b64decode(part["thoughtSignature"]) == signature
    assert upstream.chat_requests == [] and upstream.responses_requests == []
    await client.aio.aclose()


async def test_a_chanting_stream_is_cut_cleanly_and_logged_as_gemini(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    client = client_for(proxy)
    upstream.script.append(Turn(content=SENTENCE * 40, chunk_chars=20, delay=0.005))
    chunks = [chunk async for chunk in await client.aio.models.generate_content_stream(
        model="gemini-test", contents="Are the tests green?", config=CONFIG)]
    text = "".join(chunk.text or "" for chunk in chunks)
    assert text.count(SENTENCE) < 12 and "[loopwarden] Output cut: the same text repeated 10 times." in text
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert not upstream.streams[-1].completed  # the proxy stopped reading at once
    await client.aio.aclose()

    async def logged():
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proxy.root}/loopwarden/api/detections") as answer:
                data = (await answer.json())["data"]
        return data or None

    (detection,) = await wait_for(logged)
    assert (detection["type"], detection["action"], detection["detail"]["api"]) == ("content", "cut", "gemini")
    assert detection["model"] == "gemini-test"  # named in the path only


async def test_count_tokens_and_the_models_list_pass_untouched(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    client = client_for(proxy)
    counted = await client.aio.models.count_tokens(model="gemini-test", contents="hello")
    assert counted.total_tokens == 42
    models = [model.name async for model in await client.aio.models.list()]
    assert models == ["models/gemini-test"]
    assert [(r.method, r.path) for r in upstream.requests] == [
        ("POST", "/v1beta/models/gemini-test:countTokens"), ("GET", "/v1beta/models")]
    assert all(r.headers["x-goog-api-key"] == "gemini-key-1" for r in upstream.requests)
    assert orjson.loads(upstream.requests[0].body)["contents"][0]["parts"][0]["text"] == "hello"
    await client.aio.aclose()


async def test_a_gemini_session_is_judged_by_the_gemini_upstream_in_its_own_dialect(upstream):
    """No JUDGE_URL: the judge of a Gemini session asks generateContent, with the session's key, for JSON."""
    from proxy.config import build
    from proxy.conversation import Message
    from proxy.judge import Judge, Question
    from proxy.wire import GEMINI, judge_route
    from tests.test_judge import verdict

    upstream.judge = lambda body: verdict(0.95, "it reads calc.py again and again")
    settings = build({"upstream_url": upstream.url, "gemini_upstream_url": upstream.root + "/v1beta"}, environ={})
    judge = Judge(5.0, 2)
    check, tokens = await judge.check(judge_route(settings, GEMINI),
                                      Question("task-1", 30, "gemini-key-1", "Make the tests pass.",
                                               [Message("assistant", "Reading calc.py again.")]),
                                      "gemini-test", None)
    await judge.close()
    assert (check.confidence, check.analysis, tokens) == (0.95, "it reads calc.py again and again", 17)
    (asked,) = upstream.requests
    assert asked.path == "/v1beta/models/gemini-test:generateContent"
    assert asked.headers["x-goog-api-key"] == "gemini-key-1"
    body = asked.json
    assert body["generationConfig"]["responseMimeType"] == "application/json"
    assert "Make the tests pass." in body["contents"][0]["parts"][0]["text"]


def test_replay_reads_gemini_request_bodies(tmp_path):
    from proxy.detect.engine import DetectConfig
    from proxy.replay import read_records, replay

    contents = [{"role": "user", "parts": [{"text": "Make the tests pass."}]}]
    for _ in range(7):
        contents += [{"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"path": "calc.py"}},
                                                  "thoughtSignature": "c2ln"}]},
                     {"role": "user", "parts": [{"functionResponse": {"name": "read_file",
                                                                      "response": {"output": "def add(): ..."}}}]}]
    path = tmp_path / "gemini.jsonl"
    path.write_bytes(orjson.dumps({"contents": contents, "systemInstruction": {"parts": [{"text": "Be brief."}]}}))
    (record,), errors = read_records([str(path)])
    assert errors == []
    found = replay(DetectConfig(tool_call_threshold=5), record).episodes
    assert [(e["turn"], e["type"], e["action"]) for e in found] == [
        (5, "tool_call", "warned"), (6, "tool_call", "warned"), (7, "tool_call", "stopped")]


async def test_a_tuned_model_is_watched_as_a_model_is(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    body = {"contents": [{"role": "user", "parts": [{"text": "Make the tests pass."}]}]}
    for _ in range(7):
        body["contents"] += [{"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {}}}]},
                             {"role": "user", "parts": [{"functionResponse": {
                                 "name": "read_file", "response": {"output": "def add(a, b): return a - b"}}}]}]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}/v1beta/tunedModels/tuned-1:generateContent", json=body,
                             headers={"x-goog-api-key": "gemini-key-1"}) as answer:
            refused = await answer.json()
    assert answer.status == 400 and refused["error"]["details"][0]["reason"] == "LOOP_DETECTED"
    assert upstream.requests == []


async def test_a_key_in_the_query_is_the_tenant_as_the_header_is(upstream, proxy_factory):
    """Two customers whose runs open alike, each with its own `?key=`: two sessions, never one."""
    proxy = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    body = {"contents": [{"role": "user", "parts": [{"text": "Make the tests pass."}]}]}
    sessions = []
    async with aiohttp.ClientSession() as http:
        for key in ("customer-a", "customer-b", "customer-a"):
            upstream.script.append(Turn(content="ok"))
            async with http.post(f"{proxy.root}/v1beta/models/gemini-test:generateContent?key={key}",
                                 json=body) as answer:
                assert answer.status == 200
                sessions.append(answer.headers["X-Loopwarden-Session"])
    assert sessions[0] == sessions[2] != sessions[1]
    assert [request.query for request in upstream.requests] == ["key=customer-a", "key=customer-b", "key=customer-a"]
