"""Rolling out safely: observe mode, tool and model policies, `loopwarden replay` and `loopwarden config`."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import openai
import orjson
import pytest

from proxy.config import ConfigError, build
from proxy.detect.engine import DetectConfig
from proxy.replay import Record, replay
from tests.agent import Agent
from tests.convo import conversation, neutral, step, user
from tests.fake_upstream import Turn
from tests.test_log_api import ROOT
from tests.test_served_episodes import logged

CONTENT = "def main():\n    return 1\n"
SENTENCE = "I will now check the configuration file once more. "


async def calls(agent: Agent, upstream, count: int, name: str = "read_file", args=None, result=CONTENT) -> list:
    observed = []
    for i in range(count):
        upstream.script.append(Turn(tool_calls=[(name, args or {"path": "a.py"})]))
        await agent.turn()
        observed.append(agent.last_headers.get("x-loopwarden-observed"))
        agent.answer(result(i) if callable(result) else result)
    return observed


# -- observe mode ----------------------------------------------------------------------------------------------

async def test_observe_mode_logs_everything_and_changes_nothing(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, mode="observe")
    agent = Agent(running.url, headers={"X-Loopwarden-Session": "observed"})
    observed = await calls(agent, upstream, 10)
    upstream.script.append(Turn(content="done"))
    await agent.turn()
    observed.append(agent.last_headers.get("x-loopwarden-observed"))
    # Every request went upstream as the agent sent it; none was refused.
    assert len(upstream.chat_requests) == 11
    for i, body in enumerate(upstream.chat_requests):
        assert body["messages"] == agent.messages[:len(body["messages"])]
        assert "[loopwarden]" not in orjson.dumps(body).decode()
    assert observed[:5] == [None] * 5
    assert observed[5:8] == ["1/2 tool_call", "2/2 tool_call", "stop tool_call"]
    assert set(observed[8:]) == {"stop tool_call"}
    await logged(running, "observed", 3)
    await asyncio.sleep(0.3)  # and nothing more comes
    found = await logged(running, "observed", 3)
    assert [(r["episode"], r["action"], r["enforced"]) for r in found] == [
        (1, "warned", False), (2, "warned", False), (3, "stopped", False)]  # nothing after the stop
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.root}/loopwarden/api/stats") as response:
            stats = await response.json()
    assert stats["detections"] == 0 and stats["observed"]["would_have_stopped_tasks"] == 1
    await agent.close()


async def test_observe_mode_lets_a_chanting_stream_run_and_logs_the_would_be_cut(upstream, proxy_factory):
    running = await proxy_factory(upstream.url, mode="observe")
    agent = Agent(running.url, stream=True, headers={"X-Loopwarden-Session": "chant"})
    upstream.script.append(Turn(content=SENTENCE * 40, chunk_chars=9))
    message = await agent.turn()
    assert message["content"] == SENTENCE * 40 and upstream.streams[-1].completed
    assert not agent.extras
    upstream.script.append(Turn(content="ok"))
    await agent.turn()
    assert agent.last_headers["x-loopwarden-observed"] == "1/2 content"
    assert "[loopwarden]" not in orjson.dumps(upstream.chat_requests[-1]).decode()
    await logged(running, "chant", 1)
    await asyncio.sleep(0.3)  # and nothing more comes
    assert [(r["type"], r["action"], r["enforced"]) for r in await logged(running, "chant", 1)] == [
        ("content", "cut", False)]
    await agent.close()


async def test_the_observe_header_observes_that_request_only(upstream, proxy):
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "mixed"})
    await calls(agent, upstream, 5)
    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "a.py"})]))
    await agent.turn(**{"X-Loopwarden-Mode": "plan, observe"})
    assert agent.last_headers["x-loopwarden-observed"] == "1/2 tool_call"
    assert "[loopwarden]" not in orjson.dumps(upstream.chat_requests[-1]).decode()
    agent.answer(CONTENT)
    upstream.script.append(Turn(tool_calls=[("read_file", {"path": "a.py"})]))
    await agent.turn()  # enforced again: both warnings are in this request
    assert agent.last_headers["x-loopwarden-warning"] == "2/2 tool_call"
    assert orjson.dumps(upstream.chat_requests[-1]).decode().count("[loopwarden] Loop detected") == 2
    await agent.close()


# -- policies ---------------------------------------------------------------------------------------------------

POLICIES = """
[tools.run_tests]
threshold = 3

[tools."wait_*"]
exempt = true

[tools."wait_for_deploy"]
exempt = false

[models."gpt-strict*"]
max_warnings = 0

[models."gpt-strict-lenient"]
max_warnings = 2
"""


@pytest.fixture
def policy_file(tmp_path):
    path = tmp_path / "loopwarden.toml"
    path.write_text(POLICIES)
    return str(path)


async def test_tool_and_model_policies_most_specific_wins(upstream, proxy_factory, policy_file):
    running = await proxy_factory(upstream.url, config=policy_file)
    tests = Agent(running.url, headers={"X-Loopwarden-Session": "tests"})
    await calls(tests, upstream, 3, name="run_tests", args={})
    upstream.script.append(Turn(content="hmm"))
    await tests.turn()
    assert tests.last_headers["x-loopwarden-warning"] == "1/2 tool_call"  # the 3rd identical call

    poller = Agent(running.url, headers={"X-Loopwarden-Session": "poller"})
    await calls(poller, upstream, 12, name="wait_for_job", args={"id": 1}, result="still running")
    upstream.script.append(Turn(content="hmm"))
    await poller.turn()
    assert "x-loopwarden-warning" not in poller.last_headers
    deploy = Agent(running.url, headers={"X-Loopwarden-Session": "deploy"})  # the exact name is not exempt
    await calls(deploy, upstream, 5, name="wait_for_deploy", args={}, result="pending")
    upstream.script.append(Turn(content="hmm"))
    await deploy.turn()
    assert deploy.last_headers["x-loopwarden-warning"] == "1/2 tool_call"

    for model, stops_at_once in (("gpt-strict-mini", True), ("gpt-strict-lenient", False)):
        agent = Agent(running.url, headers={"X-Loopwarden-Session": model})
        agent.model = model
        await calls(agent, upstream, 5)
        if stops_at_once:
            with pytest.raises(openai.BadRequestError) as caught:
                await agent.turn()
            assert "stopped at once" in caught.value.message
        else:
            upstream.script.append(Turn(content="hmm"))
            await agent.turn()
            assert agent.last_headers["x-loopwarden-warning"] == "1/2 tool_call"
        await agent.close()
    for agent in (tests, poller, deploy):
        await agent.close()


@pytest.mark.parametrize("text, complaint", [
    ('[tools."x"]\nexmpt = true\n', 'tools."x".exmpt: unknown key'),
    ('[tools."x"]\nthreshold = "3"\n', 'tools."x".threshold: expected a whole number'),
    ('[tools."x"]\nthreshold = 1\n', "must be at least 2"),
    ('[models."gpt[4"]\nmax_warnings = 1\n', "bad glob"),
    ('[models."m"]\nmode = "loud"\n', "must be one of enforce, observe"),
    ('[models."m"]\nupstream_url = "http://x"\n', "unknown key"),
])
def test_a_bad_policy_is_one_line_naming_the_file_and_key(tmp_path, text, complaint):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        build({"config": str(path)}, environ={})
    assert str(path) in str(caught.value) and complaint in str(caught.value)
    done = subprocess.run([sys.executable, "-m", "proxy", "config", "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and complaint in done.stderr


def test_config_prints_values_and_where_they_came_from(policy_file):
    done = subprocess.run([sys.executable, "-m", "proxy", "config", "--config", policy_file, "--max-warnings", "3",
                           "--preset", "lenient"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"LOOPWARDEN_ADMIN_TOKEN": "secret-token", "PATH": ""})
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line and line.split()[0].isupper()}
    assert lines["MAX_WARNINGS"].split()[1:] == ["3", "--max-warnings"]
    assert lines["TOOL_CALL_THRESHOLD"].split()[1:] == ["5", "preset", "lenient"]
    assert lines["ADMIN_TOKEN"].split()[1:] == ["(set)", "LOOPWARDEN_ADMIN_TOKEN"]
    assert "secret-token" not in done.stdout
    assert '[tools."wait_*"] exempt = True' in done.stdout


# -- replay ---------------------------------------------------------------------------------------------------

def looping_run(calls_made: int, name: str = "read_file") -> list[dict]:
    return conversation(user("Fix it."), *[step(name, {"path": "a.py"}, CONTENT) for _ in range(calls_made)])


async def test_replay_finds_what_a_live_proxy_in_observe_mode_logs(upstream, proxy_factory, tmp_path):
    running = await proxy_factory(upstream.url, mode="observe")
    # Three recorded runs, driven live through the proxy, one request per turn.
    runs = {"loop": (looping_run(9), False), "chant": (None, True), "calm": (None, False)}
    live: dict[str, list] = {}
    for name in runs:
        agent = Agent(running.url, stream=runs[name][1], headers={"X-Loopwarden-Session": f"live-{name}"},
                      task=f"Task {name}")
        for i in range(9 if name == "loop" else 4):
            if name == "loop":
                upstream.script.append(Turn(tool_calls=[("read_file", {"path": "a.py"})]))
            elif name == "chant":
                upstream.script.append(Turn(content=SENTENCE * (30 if i == 1 else 1), chunk_chars=11))
            else:
                upstream.script.append(Turn(tool_calls=[("ls", {"dir": f"d{i}"})]))
            await agent.turn()
            agent.answer(CONTENT) if name != "chant" else agent.say("go on")
        upstream.script.append(Turn(content="done"))
        await agent.turn()
        await agent.close()
        runs[name] = (agent.messages[:-1], runs[name][1])
        live[name] = [(r["turn"], r["type"], r["action"], r["episode"])
                      for r in await logged(running, f"live-{name}", {"loop": 3, "chant": 1, "calm": 0}[name])]
    await asyncio.sleep(0.3)
    for name in runs:
        live[name] = [(r["turn"], r["type"], r["action"], r["episode"]) for r in await logged(running, f"live-{name}", 0)]
    assert live["loop"] == [(5, "tool_call", "warned", 1), (6, "tool_call", "warned", 2), (7, "tool_call", "stopped", 3)]
    assert [e[1:3] for e in live["chant"]] == [("content", "cut")] and live["calm"] == []

    path = tmp_path / "runs.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"model": "gpt-test", "messages": messages, "stream": streamed}) + b"\n"
                              for messages, streamed in runs.values()) + b"[1, 2]\n")
    done = subprocess.run([sys.executable, "-m", "proxy", "replay", str(path), "--format", "json",
                           "--set", "tool_call_threshold=5"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = orjson.loads(done.stdout)
    replayed = {c["source"]: [(e["turn"], e["type"], e["action"], e["episode"]) for e in c["episodes"]]
                for c in report["conversations"]}
    assert list(replayed.values()) == [live["loop"], live["chant"], live["calm"]]
    assert report["errors"] == [{"source": f"{path}:4", "message": "a list must hold the conversation's messages "
                                                                  "(objects with a role)"}]
    assert report["summary"]["would_stop"] == 1 and report["summary"]["turns_saved"] == 2


def test_replay_fail_on_and_set(tmp_path):
    path = tmp_path / "one.json"
    path.write_bytes(orjson.dumps(looping_run(5)))  # a JSON file holding a list of messages
    run = lambda *extra: subprocess.run([sys.executable, "-m", "proxy", "replay", str(path), *extra],  # noqa: E731
                                        cwd=ROOT, capture_output=True, text=True, timeout=60)
    warned = run("--fail-on", "stop", "--set", "tool_call_threshold=5")
    assert warned.returncode == 0 and "1 with episodes" in warned.stdout
    assert run("--fail-on", "warn", "--set", "tool_call_threshold=5").returncode == 1
    assert run("--fail-on", "stop", "--set", "max_warnings=0").returncode == 1
    assert run("--fail-on", "stop").returncode == 1  # the default ladder stops the 5th identical call
    assert "no episodes" in run("--set", "tool_call_threshold=6").stdout
    bad = run("--set", "nonsense=1")
    assert bad.returncode == 2 and "--set" in bad.stderr


def test_replay_reads_text_agents_and_responses_bodies():
    config = DetectConfig(tool_call_threshold=5)
    react = [{"role": "system", "content": "ReAct"}, {"role": "user", "content": "Q?"}]
    for _ in range(7):
        react += [{"role": "assistant", "content": "Thought: again.\nAction: search\nAction Input: {\"q\": \"x\"}"},
                  {"role": "user", "content": "Observation: nothing found"}]
    assert [e["action"] for e in replay(config, Record("react", neutral(react), False)).episodes] == [
        "warned", "warned", "stopped"]
    items = [{"role": "user", "content": "go"}]
    for i in range(6):
        items += [{"type": "function_call", "call_id": f"c{i}", "name": "ls", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"c{i}", "output": "a.py"}]
    from proxy.replay import _record

    record = _record({"model": "m", "instructions": "Be brief.", "input": items}, "responses:1")
    assert [(e["turn"], e["action"]) for e in replay(config, record).episodes] == [(5, "warned"), (6, "warned")]


def test_replay_reads_the_last_answer_of_a_record():
    chant = "I will now check the configuration file once more before I answer. " * 12
    record = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is the config valid?"},
              {"role": "assistant", "content": chant}]  # recorded without "stream": true
    (episode,) = replay(DetectConfig(tool_call_threshold=5), Record("final", neutral(record), False)).episodes
    assert (episode["turn"], episode["type"], episode["action"]) == (1, "content", "warned")
    streamed = replay(DetectConfig(tool_call_threshold=5), Record("final", neutral(record), True)).episodes
    assert [(e["type"], e["action"]) for e in streamed] == [("content", "cut")]  # logged once, where it was cut
