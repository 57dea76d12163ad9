"""Google's Agent Development Kit (google-adk) on a Gemini model whose base URL is loopwarden, in front of a
scripted Gemini model. It runs with the other real-agent checks, in their own environment (`make agents-check`)."""

from __future__ import annotations

import itertools

import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.google_llm import Gemini
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import errors, types

from tests.fake_upstream import Turn

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning",
                                        "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")


def read_file(path: str) -> dict:
    """Read a text file.

    Args:
        path: the file's path
    """
    return {"result": f"contents of {path}: hello"}


@pytest.fixture
async def gemini_proxy(upstream, proxy_factory, monkeypatch):
    monkeypatch.setenv("GOOGLE_API_KEY", "adk-key")
    monkeypatch.setenv("GOOGLE_GENAI_USE_VERTEXAI", "FALSE")
    return await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)


def run_tests() -> str:
    """Run the project's tests."""
    return "FAILED tests/test_calc.py::test_add - assert 2 - 2 == 4\n1 failed in 0.02s"  # ADK wraps it in `result`


async def run(root: str, question: str, streaming: bool, events: list | None = None) -> list:
    """The runner's events for one question (into `events`, kept when it raises)."""
    agent = LlmAgent(name="reader", model=Gemini(model="gemini-2.5-flash", base_url=root),
                     instruction="Answer from the files.", tools=[read_file, run_tests])
    sessions = InMemorySessionService()
    runner = Runner(agent=agent, app_name="loopwarden-check", session_service=sessions)
    session = await sessions.create_session(app_name="loopwarden-check", user_id="u1")
    config = RunConfig(streaming_mode=StreamingMode.SSE if streaming else StreamingMode.NONE)
    events = [] if events is None else events
    async for event in runner.run_async(user_id="u1", session_id=session.id, run_config=config,
                                        new_message=types.Content(role="user", parts=[types.Part(text=question)])):
        events.append(event)
    return events


def warnings(body: dict) -> list[str]:
    return [part["text"] for content in body["contents"] for part in content.get("parts", [])
            if part.get("text", "").startswith("[loopwarden]")]


@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
async def test_adk_agent_calling_one_tool_alike_is_warned_twice_then_stopped(upstream, gemini_proxy, streaming):
    upstream.responder = lambda body: Turn(tool_calls=[("read_file", {"path": "a.txt"})])
    seen: list = []
    with pytest.raises(errors.ClientError) as caught:
        await run(gemini_proxy.root, "What does a.txt say?", streaming, seen)
    # What the application saw first: an event with the error's code and message, then the exception.
    failed = [event for event in seen if event.error_code]
    assert [event.error_code for event in failed] == ["FAILED_PRECONDITION"]
    assert "[loopwarden] Loop detected" in failed[0].error_message
    assert (caught.value.code, caught.value.status) == (400, "FAILED_PRECONDITION")
    assert caught.value.message.startswith("[loopwarden] Loop detected (tool_call)")
    assert "`read_file` with {\"path\":\"a.txt\"} 7 times in a row" in caught.value.message
    assert caught.value.details["error"]["details"][0]["reason"] == "LOOP_DETECTED"
    sent = upstream.gemini_requests
    assert len(sent) == 7  # the 8th, the stop, never reached the upstream
    assert all(r.path.endswith(":streamGenerateContent" if streaming else ":generateContent") for r in sent)
    assert [len(warnings(r.json)) for r in sent] == [0, 0, 0, 0, 0, 1, 2]
    assert warnings(sent[6].json)[1].startswith("[loopwarden] Loop detected (2/2)")


async def test_adk_benign_run_ends_with_its_answer(upstream, gemini_proxy):
    steps = itertools.count()

    def answer(body):
        step = next(steps)
        return Turn(tool_calls=[("read_file", {"path": f"f{step}.txt"})]) if step < 6 else Turn(content="all read")

    upstream.responder = answer
    events = await run(gemini_proxy.root, "Read the files.", streaming=False)
    final = [part.text for event in events if event.is_final_response() and event.content
             for part in event.content.parts or () if part.text]
    assert final == ["all read"]
    assert len(upstream.gemini_requests) == 7
    assert all(warnings(r.json) == [] for r in upstream.gemini_requests)


async def test_adk_rerunning_a_failing_test_between_reads_is_warned_by_the_third_failure(
        upstream, proxy_factory, monkeypatch):
    """The test's report comes back as `{"result": "FAILED …"}`: read as the report, its failure shows, and the
    third identical failure is a `tool_error` loop with the default settings, reads between or not."""
    monkeypatch.setenv("GOOGLE_API_KEY", "adk-key")
    monkeypatch.setenv("GOOGLE_GENAI_USE_VERTEXAI", "FALSE")
    proxy = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root, preset="default")
    steps = itertools.count()
    upstream.responder = lambda body: Turn(tool_calls=[
        ("run_tests", {}) if next(steps) % 2 == 0 else ("read_file", {"path": "calc.py"})])
    with pytest.raises(errors.ClientError):
        await run(proxy.root, "Make the tests pass.", streaming=False)
    sent = upstream.gemini_requests
    first = next(k for k, r in enumerate(sent) if warnings(r.json))
    assert first == 5  # the answer to the third failing run (calls: run, read, run, read, run)
    assert warnings(sent[first].json)[0].startswith("[loopwarden] Loop detected (1/2)")
    assert "run_tests" in warnings(sent[first].json)[0] and "fail" in warnings(sent[first].json)[0]
