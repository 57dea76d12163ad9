"""What a client cannot do: skip detection by spelling a watched path another way or by posing as the judge,
or have headers it names in `Connection` sent on upstream."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.agent import Agent
from tests.fake_upstream import Turn
from tests.test_log_api import same_calls

BODY = orjson.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]})


def refusal_code(body: dict) -> str:
    """The code of a refusal, in the shape of the route's dialect: OpenAI's `code`, or Google's reason (the
    Gemini API's paths answer in Google's shape)."""
    error = body["error"]
    return error["code"] if isinstance(error["code"], str) else error["details"][0]["reason"].lower()


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1//chat/completions", "/v1/chat%2fcompletions",
                                  "/v1/responses/", "/v1//messages", "/v1beta/models/gemini-test:generateContent/"])
async def test_another_spelling_of_a_watched_path_is_refused_not_relayed(upstream, proxy, path):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}{path}", data=BODY,
                             headers={"Content-Type": "application/json"}) as answer:
            body = await answer.json()
    assert answer.status == 400 and refusal_code(body) == "invalid_path"
    assert upstream.requests == []


async def test_a_client_posing_as_the_judge_is_inspected_like_any_other(upstream, proxy):
    agent = Agent(proxy.url, headers={"X-Loopwarden-Judge": "1", "X-Loopwarden-Session": "forged"})
    await same_calls(agent, upstream, 6)
    assert "[loopwarden] Loop detected (1/2)" in orjson.dumps(upstream.chat_requests[-1]).decode()
    await agent.close()


async def test_headers_named_in_connection_stay_on_this_hop(upstream, proxy):
    upstream.script.append(Turn(content="ok"))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", data=BODY, headers={
                "Content-Type": "application/json", "Connection": "keep-alive, X-Hop-Secret",
                "X-Hop-Secret": "for the proxy only", "X-Kept": "yes"}) as answer:
            assert answer.status == 200
    (sent,) = upstream.requests
    assert "X-Hop-Secret" not in sent.headers and sent.headers["X-Kept"] == "yes"


async def test_a_cookie_the_upstream_sets_for_one_client_never_goes_up_with_another(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url.replace("127.0.0.1", "localhost"))  # a name, as providers have
    upstream.script.append(Turn(content="ok", headers={"Set-Cookie": "session=client-a-secret; Path=/"}))
    upstream.script.append(Turn(content="ok"))
    async with aiohttp.ClientSession() as first, aiohttp.ClientSession() as second:
        async with first.post(f"{proxy.url}/chat/completions", data=BODY,
                              headers={"Content-Type": "application/json", "Authorization": "Bearer sk-a"}) as answer:
            assert answer.headers["Set-Cookie"].startswith("session=client-a-secret")  # relayed to its client
        async with second.post(f"{proxy.url}/chat/completions", data=BODY,
                               headers={"Content-Type": "application/json", "Authorization": "Bearer sk-b"}) as answer:
            assert answer.status == 200
    assert [sent.headers.get("Cookie") for sent in upstream.requests] == [None, None]


def test_an_alerts_text_line_shows_a_clients_markup_as_typed():
    from datetime import datetime

    from proxy.server.alerts import alert_payload

    record = {"session_id": "<!here> run", "tenant": "t", "model": "m", "type": "tool_call", "action": "stopped",
              "episode": 3, "episode_limit": 2, "turn": 7, "enforced": True, "tokens_saved_estimate": 0,
              "created_at": datetime(2026, 11, 24), "detail": {"tool": "<https://evil.example|sign in again>",
                                                               "arguments": "{\"q\": \"a & b\"}"}}
    payload = alert_payload(record, "https://lw.example.com")
    assert "<!" not in payload["text"] and "<http" not in payload["text"]
    assert "&lt;!here&gt; run" in payload["text"] and "a &amp; b" in payload["text"]
    assert payload["session_id"] == "<!here> run"  # the JSON fields keep the values as they are
    assert payload["url"] == "https://lw.example.com/loopwarden/#open=%3C%21here%3E%20run"


async def test_upstream_credentials_stay_out_of_answers_and_work_with_a_clients_key(upstream, proxy_factory):
    from yarl import URL

    with_secrets = str(URL(upstream.url).with_user("user").with_password("s3cret").with_query({"api-key": "k3y"}))
    proxy = await proxy_factory(with_secrets)
    upstream.script.append(Turn(content="ok"))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", data=BODY, headers={
                "Content-Type": "application/json", "Authorization": "Bearer sk-client"}) as answer:
            assert answer.status == 200
    (sent,) = upstream.requests
    assert sent.path == "/v1/chat/completions" and sent.query == "api-key=k3y"  # the query stays a query
    assert sent.headers["Authorization"].startswith("Basic ")
    upstream.script.append(Turn(content="late", hang=True))
    slow = await proxy_factory(with_secrets, upstream_read_timeout=0.3)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{slow.url}/chat/completions", data=BODY,
                             headers={"Content-Type": "application/json"}) as answer:
            text = await answer.text()
    assert answer.status == 504 and "s3cret" not in text and "k3y" not in text


@pytest.mark.parametrize("path", ["/v1beta/models/gemini-test:generateContent%3B",
                                  "/v1beta/models/gemini-test:generateContent;alt=sse",
                                  "/v1beta/tunedModels/tuned-1:generateContent%3B"])
async def test_a_gemini_method_spelled_with_more_than_letters_is_refused_not_relayed(upstream, proxy, path):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}{path}", data=BODY, headers={"Content-Type": "application/json"}) as answer:
            body = await answer.json()
    assert answer.status == 400 and body["error"]["status"] == "INVALID_ARGUMENT" and refusal_code(body) == "invalid_path"
    assert upstream.requests == []
