"""The shapes real agents send, from request bodies captured from the agents themselves
(`tests/fixtures/agents/`, one line per request of one run): replayed as `loopwarden replay` reads them, and
folded request by request as the proxy sees them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from proxy.detect.engine import Decision, DetectConfig, analyze, episodes
from proxy.replay import read_records, replay
from proxy.wire.chat import ChatDialect

AGENTS = Path(__file__).parent / "fixtures" / "agents"
DEFAULT = DetectConfig()


def requests(agent: str) -> list[dict]:
    return [orjson.loads(line) for line in (AGENTS / f"{agent}.jsonl").read_bytes().splitlines() if line.strip()]


def replayed(agent: str) -> list[tuple[str, str]]:
    """What replaying the run's last request (the whole history it sent) logs."""
    records, errors = read_records([str(AGENTS / f"{agent}.jsonl")])
    assert errors == []
    return [(e["action"], e["type"]) for e in replay(DEFAULT, records[-1]).episodes]


def decisions(agent: str) -> list[tuple]:
    """Per request of the run, as the proxy decides it: the warnings it carries, or the stop."""
    result = []
    for body in requests(agent):
        state, _ = analyze(DEFAULT, ChatDialect.read(body).messages)
        decision = Decision(episodes(DEFAULT, state))
        result.append(("stop", decision.stop.type) if decision.stop else tuple(e.type for e in decision.warnings))
    return result


def test_mastra_one_message_history_is_warned_twice_and_stopped():
    # Mastra 0.24 appends every step's identical read_file call to one assistant message, its results after it.
    assert replayed("mastra") == [("warned", "tool_error"), ("warned", "tool_error"), ("stopped", "tool_error")]
    assert decisions("mastra") == [(), (), (), ("tool_error",), ("tool_error", "tool_error"), ("stop", "tool_error")]


@pytest.mark.parametrize("agent", ["continue", "google-adk", "kilo", "opencode", "qwen"])
def test_agents_without_a_guard_are_warned_twice_and_stopped(agent):
    found = replayed(agent)
    assert [action for action, _ in found] == ["warned", "warned", "stopped"]
    assert len({kind for _, kind in found}) == 1


def test_cline_error_array_is_warned_as_tool_error():
    # Cline CLI answers a failed read with [{"query": ..., "error": "Error reading file: ENOENT ...", "success":
    # false}]; its own guard stops the run after the 5th call, so the proxy warns at the 3rd and the 4th.
    assert replayed("cline") == [("warned", "tool_error"), ("warned", "tool_error")]
    assert decisions("cline") == [(), (), (), ("tool_error",), ("tool_error", "tool_error")]
