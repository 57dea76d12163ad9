"""The OpenAI Agents SDK on its default model (the Responses API), driven through loopwarden in front of a
scripted model. It runs with the other real-agent checks, in their own environment (`make agents-check`)."""

from __future__ import annotations

import itertools

import agents
import openai
import pytest

from tests.agents.test_real_text_agents import QUESTION, assert_stopped, no_loopwarden_text
from tests.fake_upstream import Turn

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning",
                                        "ignore::pytest.PytestUnraisableExceptionWarning")


def _agent(url: str):
    agents.set_default_openai_client(openai.AsyncOpenAI(base_url=url, api_key="sk-agent", max_retries=0))
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def read_file(path: str) -> str:
        """Read a text file.

        Args:
            path: the file's path
        """
        return f"contents of {path}: hello"

    return agents, agents.Agent(name="reader", instructions="Answer from the files.", tools=[read_file])


def _requests(upstream) -> list[dict]:
    return upstream.responses_requests


@pytest.mark.parametrize("streamed", [False, True])
async def test_agents_sdk_loop_is_warned_then_stopped(upstream, proxy, streamed):
    agents, agent = _agent(proxy.url)
    upstream.responder = lambda body: Turn(tool_calls=[("read_file", {"path": "a.txt"})])
    with pytest.raises(Exception) as caught:
        if streamed:
            result = agents.Runner.run_streamed(agent, QUESTION, max_turns=30)
            async for _ in result.stream_events():
                pass
        else:
            await agents.Runner.run(agent, QUESTION, max_turns=30)
    requests = _requests(upstream)
    assert len(requests) <= 8, len(requests)
    assert_stopped(caught.value, _AsChat(requests))


async def test_agents_sdk_benign_run_ends_with_its_answer(upstream, proxy):
    agents, agent = _agent(proxy.url)
    steps = itertools.count()

    def answer(body):
        step = next(steps)
        if step < 6:
            return Turn(tool_calls=[("read_file", {"path": f"f{step}.txt"})])
        return Turn(content="all read")

    upstream.responder = answer
    result = await agents.Runner.run(agent, QUESTION, max_turns=30)
    assert result.final_output == "all read"
    assert no_loopwarden_text(_AsChat(_requests(upstream)))


class _AsChat:
    """Responses requests seen as the chat helpers expect (`chat_requests` with `messages`)."""

    def __init__(self, requests: list[dict]) -> None:
        self.chat_requests = [{"messages": [item for item in r["input"] if isinstance(item, dict)]
                               if isinstance(r.get("input"), list) else [{"content": r.get("input")}]}
                              for r in requests]
