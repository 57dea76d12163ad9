"""loopwarden's guardrail in LiteLLM's proxy: the proxy's verdicts, through LiteLLM, with the `openai` SDK."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import openai
import pytest

from proxy.detect.engine import CUT_NOTICE_PREFIX, INJECTED_PREFIX
from proxy.inspection import tenant_of
from tests.litellm.conftest import MASTER_KEY, TOOL

TOOLS = [{"type": "function", "function": {"name": TOOL, "description": "Read a file",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}}}}}]


def client(proxy, key: str = MASTER_KEY, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, **options)


def ask(proxy, key: str = MASTER_KEY, **request):
    """One request, with no retry of the SDK's own."""
    with client(proxy, key, max_retries=0) as sdk:
        return sdk.chat.completions.create(**request)


def session_headers() -> dict[str, str]:
    return {"X-Session-Id": f"litellm-{uuid.uuid4().hex[:12]}"}


def run_tool_loop(proxy, headers: dict[str, str], stream: bool = False, rounds: int = 8):
    """An agent that runs whatever tool the model calls and sends the result back, until refused: the answers'
    count and the error that ended it (None: never refused)."""
    with client(proxy, max_retries=2) as sdk:
        return _tool_loop(sdk, headers, stream, rounds)


def _tool_loop(sdk: openai.OpenAI, headers: dict[str, str], stream: bool, rounds: int):
    messages = [{"role": "system", "content": "You are a careful agent."},
                {"role": "user", "content": f"Read the configuration ({uuid.uuid4().hex})."}]
    for done in range(rounds):
        try:
            if stream:
                calls = {}
                for chunk in sdk.chat.completions.create(model="loop", messages=messages, tools=TOOLS, stream=True,
                                                         extra_headers=headers):
                    for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                        entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                        entry["id"] += call.id or ""
                        entry["name"] += (call.function.name or "") if call.function else ""
                        entry["arguments"] += (call.function.arguments or "") if call.function else ""
                call = calls[0]
            else:
                answer = sdk.chat.completions.create(model="loop", messages=messages, tools=TOOLS,
                                                     extra_headers=headers)
                made = answer.choices[0].message.tool_calls[0]
                call = {"id": made.id, "name": made.function.name, "arguments": made.function.arguments}
        except openai.APIStatusError as exc:
            return done, exc
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "port = 8080"})
    return rounds, None


def warnings_seen(bodies: list[dict]) -> list[str]:
    """The warnings each upstream request carried, in order."""
    return [m["content"] for body in bodies for m in body["messages"]
            if isinstance(m.get("content"), str) and m["content"].startswith(INJECTED_PREFIX)]


def detections(proxy, session: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "proxy", "detections", "--database-url", proxy.database_url,
                          "--session", session, "--format", "json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_loop_warned_twice_then_stopped(litellm_proxy, models, stream):
    headers = session_headers()
    before = len(models.bodies("loop"))
    answers, error = run_tool_loop(litellm_proxy, headers, stream=stream)
    # The default ladder: warned at the 3rd and 4th identical call (the 4th and 5th requests), the request
    # carrying the 5th refused.
    assert answers == 5 and error is not None, litellm_proxy.output()[-2000:]
    assert error.status_code == 400
    assert "loop_detected" in str(error.body) and "[loopwarden] Loop detected" in error.message
    bodies = models.bodies("loop")[before:]
    assert len(bodies) == 5  # the refused request never went upstream, and the SDK did not retry it
    # Each warning re-created at its place in the requests after it: one in the 3rd request, two in the 4th.
    assert [len(warnings_seen([body])) for body in bodies] == [0, 0, 0, 1, 2]
    logged = detections(litellm_proxy, headers["X-Session-Id"])
    assert sorted(row["action"] for row in logged) == ["stopped", "warned", "warned"]
    assert len({row["tenant"] for row in logged}) == 1


def test_chant_cut_as_it_streams(litellm_proxy, models):
    headers = session_headers()
    before = len(models.upstream.streams)
    text, finish = "", None
    with client(litellm_proxy) as sdk:
        for chunk in sdk.chat.completions.create(  # ends cleanly: no error raised
                model="chant", messages=[{"role": "user", "content": "Check the configuration."}], stream=True,
                extra_headers=headers):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
    assert CUT_NOTICE_PREFIX in text and finish == "stop"
    assert len(text) < len("I will check the configuration file once more to be sure. ") * 60
    record = models.upstream.streams[before]
    assert not record.completed  # the upstream was not read to its end
    assert [row["action"] for row in detections(litellm_proxy, headers["X-Session-Id"])] == ["cut"]


def test_benign_run_untouched(litellm_proxy, models):
    headers = session_headers()
    before = len(models.bodies("answer"))
    messages = [{"role": "user", "content": "Summarise the configuration."}]
    for _ in range(3):
        answer = ask(litellm_proxy, model="answer", messages=messages,
                                                               extra_headers=headers)
        assert answer.choices[0].message.content == "All done: the file holds the configuration."
        messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                     {"role": "user", "content": "And once more, shorter."}]
    assert warnings_seen(models.bodies("answer")[before:]) == []
    assert detections(litellm_proxy, headers["X-Session-Id"]) == []


def test_observe_mode_changes_nothing_and_logs(litellm_proxy, models):
    headers = {**session_headers(), "X-Loopwarden-Mode": "observe"}
    before = len(models.bodies("loop"))
    answers, error = run_tool_loop(litellm_proxy, headers, rounds=6)
    assert (answers, error) == (6, None)
    assert warnings_seen(models.bodies("loop")[before:]) == []
    logged = detections(litellm_proxy, headers["X-Session-Id"])
    assert logged and all(row["enforced"] is False for row in logged)


def test_failing_database_is_harmless(failing_db_proxy, models):
    headers = session_headers()
    answers, error = run_tool_loop(failing_db_proxy, headers)
    assert answers == 5 and error is not None and error.status_code == 400  # detection goes on without its log
    answer = ask(failing_db_proxy, 
        model="answer", messages=[{"role": "user", "content": "Hello"}], extra_headers=session_headers())
    assert answer.choices[0].message.content


def test_litellm_key_auth_still_applies(litellm_proxy, models):
    before = len(models.bodies("answer"))
    with pytest.raises(openai.APIStatusError) as refused:  # without LiteLLM's database, only its master key
        ask(litellm_proxy, key="sk-wrong", model="answer", messages=[{"role": "user", "content": "Hello"}])
    assert refused.value.status_code in (400, 401)
    assert len(models.bodies("answer")) == before


def test_litellm_retries_still_work(litellm_proxy, models):
    answer = ask(litellm_proxy, 
        model="flaky", messages=[{"role": "user", "content": "Hello"}], extra_headers=session_headers())
    assert answer.choices[0].message.content == "All done: the file holds the configuration."
    assert len(models.bodies("flaky")) >= 2


def test_litellm_fallbacks_still_work(litellm_proxy, models):
    before = len(models.bodies("answer"))
    answer = ask(litellm_proxy, 
        model="broken", messages=[{"role": "user", "content": "Hello"}], extra_headers=session_headers())
    assert answer.choices[0].message.content == "All done: the file holds the configuration."
    assert len(models.bodies("answer")) == before + 1


def test_tenant_is_the_key_the_proxy_would_name():
    """LiteLLM holds a virtual key as its SHA-256: the tenant is the one the proxy names for that key. (Its master
    key reaches guardrails as an alias: one tenant of its own.)"""
    from litellm.proxy._types import UserAPIKeyAuth

    from proxy.integrations.litellm import tenant

    assert tenant(UserAPIKeyAuth(api_key="sk-a-virtual-key")) == tenant_of("sk-a-virtual-key")
    assert tenant(UserAPIKeyAuth(api_key="an-alias")) == tenant_of("an-alias")
    assert tenant(UserAPIKeyAuth()) is None

