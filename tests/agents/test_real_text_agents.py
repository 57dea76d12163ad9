"""Real agent packages that act in text, driven through loopwarden in front of a scripted model.

They run in an environment of their own (`make agents-check`, which `make test` runs after the main suite):
these packages pin openai versions of their own, and leave HTTP clients open at exit.
"""

from __future__ import annotations

import asyncio
import itertools

import dspy
import pytest
import smolagents
from llama_index.core.agent.workflow import ReActAgent
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai import OpenAI

from tests.fake_upstream import Turn

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning",
                                        "ignore::pytest.PytestUnraisableExceptionWarning")

QUESTION = "What does a.txt say?"


def read_file(path: str) -> str:
    """Read a text file.

    Args:
        path: the file's path
    """
    return f"contents of {path}: hello"


def warnings_seen(upstream) -> list[str]:
    """Every loopwarden warning the model was shown, by the first words that number it."""
    seen = set()
    for body in upstream.chat_requests:
        for message in body["messages"]:
            content = message.get("content")
            text = content if isinstance(content, str) else " ".join(
                part.get("text", "") for part in content or () if isinstance(part, dict))
            for k in ("1/2", "2/2"):
                if f"[loopwarden] Loop detected ({k})" in text:
                    seen.add(k)
    return sorted(seen)


def no_loopwarden_text(upstream) -> bool:
    return not any("[loopwarden]" in str(body["messages"]) for body in upstream.chat_requests)


def assert_stopped(error: BaseException, upstream) -> None:
    chain, seen = [], error
    while seen is not None and len(chain) < 10:
        chain.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    assert any("loop_detected" in text or "Loop detected" in text for text in chain), chain
    assert len(upstream.chat_requests) <= 12, len(upstream.chat_requests)
    assert warnings_seen(upstream) == ["1/2", "2/2"]


# -- smolagents ---------------------------------------------------------------------------------------------

def _smolagents(kind: str, url: str):
    model = smolagents.OpenAIServerModel(model_id="gpt-test", api_base=url, api_key="sk-agent")
    cls = smolagents.ToolCallingAgent if kind == "tool" else smolagents.CodeAgent
    return cls(tools=[smolagents.tool(read_file)], model=model, max_steps=20, verbosity_level=0)


@pytest.mark.parametrize("kind", ["tool", "code"])
async def test_smolagents_loop_is_warned_then_stopped(upstream, proxy, kind):
    agent = _smolagents(kind, proxy.url)
    if kind == "tool":
        upstream.responder = lambda body: Turn(tool_calls=[("read_file", {"path": "a.txt"})])
    else:
        upstream.responder = lambda body: Turn(content='Thought: read it.\n<code>\nprint(read_file(path="a.txt"))\n</code>')
    with pytest.raises(Exception) as caught:
        await asyncio.to_thread(agent.run, QUESTION)
    assert_stopped(caught.value, upstream)


@pytest.mark.parametrize("kind", ["tool", "code"])
async def test_smolagents_benign_run_ends_with_its_answer(upstream, proxy, kind):
    agent = _smolagents(kind, proxy.url)
    steps = itertools.count()

    def answer(body):
        step = next(steps)
        if kind == "tool":
            if step < 6:
                return Turn(tool_calls=[("read_file", {"path": f"f{step}.txt"})])
            return Turn(tool_calls=[("final_answer", {"answer": "all read"})])
        if step < 6:
            return Turn(content=f'Thought: next.\n<code>\nprint(read_file(path="f{step}.txt"))\n</code>')
        return Turn(content='Thought: done.\n<code>\nfinal_answer("all read")\n</code>')

    upstream.responder = answer
    assert await asyncio.to_thread(agent.run, QUESTION) == "all read"
    assert no_loopwarden_text(upstream)


# -- LlamaIndex ReActAgent --------------------------------------------------------------------------------

def _llamaindex(url: str):
    llm = OpenAI(model="gpt-4o-mini", api_base=url, api_key="sk-agent", max_retries=0)
    return ReActAgent(tools=[FunctionTool.from_defaults(read_file)], llm=llm)


async def test_llamaindex_react_loop_is_warned_then_stopped(upstream, proxy):
    agent = _llamaindex(proxy.url)
    upstream.responder = lambda body: Turn(
        content='Thought: I need the file.\nAction: read_file\nAction Input: {"path": "a.txt"}')
    with pytest.raises(Exception) as caught:
        await agent.run(QUESTION, max_iterations=30)
    assert_stopped(caught.value, upstream)


async def test_llamaindex_react_benign_run_ends_with_its_answer(upstream, proxy):
    agent = _llamaindex(proxy.url)
    steps = itertools.count()

    def answer(body):
        step = next(steps)
        if step < 6:
            return Turn(content=f'Thought: next file.\nAction: read_file\nAction Input: {{"path": "f{step}.txt"}}')
        return Turn(content="Thought: I can answer without using any more tools.\nAnswer: all read")

    upstream.responder = answer
    result = await agent.run(QUESTION, max_iterations=30)
    assert "all read" in str(result)
    assert no_loopwarden_text(upstream)


# -- DSPy ReAct ---------------------------------------------------------------------------------------------

def _dspy_react(url: str):
    """A DSPy ReAct program, as a function to run in a worker thread with its own LM settings."""
    lm = dspy.LM("openai/gpt-test", api_base=url, api_key="sk-agent", cache=False, num_retries=0)
    react = dspy.ReAct("question -> answer", tools=[read_file], max_iters=20)

    def run(question: str):
        with dspy.context(lm=lm):
            return react(question=question)
    return run


def _dspy_step(name: str, arguments: str) -> Turn:
    return Turn(content=f"[[ ## next_thought ## ]]\nNext.\n\n[[ ## next_tool_name ## ]]\n{name}\n\n"
                        f"[[ ## next_tool_args ## ]]\n{arguments}\n\n[[ ## completed ## ]]")


async def test_dspy_react_loop_is_warned_then_stopped(upstream, proxy):
    react = _dspy_react(proxy.url)
    upstream.responder = lambda body: _dspy_step("read_file", '{"path": "a.txt"}')
    with pytest.raises(Exception) as caught:
        await asyncio.to_thread(react, QUESTION)
    assert_stopped(caught.value, upstream)


async def test_dspy_react_benign_run_ends_with_its_answer(upstream, proxy):
    react = _dspy_react(proxy.url)
    steps = itertools.count()

    def answer(body):
        if "next_tool_name" not in str(body["messages"][0]["content"]):  # the extractor
            return Turn(content="[[ ## reasoning ## ]]\nRead them all.\n\n[[ ## answer ## ]]\nall read\n\n"
                                "[[ ## completed ## ]]")
        step = next(steps)
        return _dspy_step("read_file", f'{{"path": "f{step}.txt"}}') if step < 6 else _dspy_step("finish", "{}")

    upstream.responder = answer
    result = await asyncio.to_thread(react, QUESTION)
    assert result.answer == "all read"
    assert no_loopwarden_text(upstream)
