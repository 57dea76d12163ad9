"""pydantic-ai's `AnthropicModel` (on the Anthropic SDK, the Messages API) driven through loopwarden in front of a
scripted model. It runs with the other real-agent checks, in their own environment (`make agents-check`)."""

from __future__ import annotations

import itertools

import anthropic
import pytest
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.providers.anthropic import AnthropicProvider

from tests.fake_upstream import Turn

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning",
                                        "ignore::pytest.PytestUnraisableExceptionWarning")


def _agent(root: str) -> Agent:
    client = anthropic.AsyncAnthropic(base_url=root, api_key="sk-ant-agent", max_retries=0)
    agent = Agent(AnthropicModel("claude-sonnet-5-5", provider=AnthropicProvider(anthropic_client=client)),
                  instructions="Answer from the files.")

    @agent.tool_plain
    def read_file(path: str) -> str:
        """Read a text file."""
        return f"contents of {path}: hello"

    return agent


def _warnings(body: dict) -> list[str]:
    return [block["text"] for message in body["messages"] if isinstance(message["content"], list)
            for block in message["content"] if block.get("type") == "text" and block["text"].startswith("[loopwarden]")]


@pytest.fixture
async def anthropic_proxy(upstream, proxy_factory):
    return await proxy_factory(upstream.url, anthropic_upstream_url=upstream.url)


async def test_pydantic_ai_loop_is_warned_twice_then_stopped(upstream, anthropic_proxy):
    upstream.responder = lambda body: Turn(tool_calls=[("read_file", {"path": "a.txt"})])
    with pytest.raises(ModelHTTPError) as caught:
        await _agent(anthropic_proxy.root).run("What does a.txt say?")
    requests = upstream.messages_requests
    assert len(requests) == 7  # the 8th, the stop, never reached the upstream
    assert [len(_warnings(body)) for body in requests] == [0, 0, 0, 0, 0, 1, 2]
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "loop_detected"
    assert "`read_file`" in caught.value.body["error"]["message"]


async def test_pydantic_ai_benign_run_ends_with_its_answer(upstream, anthropic_proxy):
    steps = itertools.count()

    def answer(body):
        step = next(steps)
        return Turn(tool_calls=[("read_file", {"path": f"f{step}.txt"})]) if step < 6 else Turn(content="all read")

    upstream.responder = answer
    result = await _agent(anthropic_proxy.root).run("Read the files.")
    assert result.output == "all read"
    assert all(_warnings(body) == [] for body in upstream.messages_requests)
