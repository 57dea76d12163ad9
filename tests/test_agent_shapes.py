"""The shapes real agents send, from request bodies captured from the agents themselves
(`tests/fixtures/agents/`, one line per request of one run): replayed as `loopwarden replay` reads them, and
folded request by request as the proxy sees them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from proxy.config import build
from proxy.detect.engine import Decision, DetectConfig, analyze, episodes
from proxy.inspection import Incoming, Inspector, first_prompt, session_of, tenant_of
from proxy.replay import read_records, replay
from proxy.wire.chat import ChatDialect

AGENTS = Path(__file__).parent / "fixtures" / "agents"
DEFAULT = DetectConfig(tool_call_threshold=5)
STRICT = DetectConfig(tool_call_threshold=3, max_warnings=1)  # the `strict` preset


def requests(agent: str) -> list[dict]:
    return [orjson.loads(line) for line in (AGENTS / f"{agent}.jsonl").read_bytes().splitlines() if line.strip()]


def replayed(agent: str) -> list[tuple[str, str]]:
    """What replaying the run's last request (the whole history it sent) logs."""
    records, errors = read_records([str(AGENTS / f"{agent}.jsonl")])
    assert errors == []
    return [(e["action"], e["type"]) for e in replay(DEFAULT, records[-1]).episodes]


def decisions(agent: str, config: DetectConfig = DEFAULT) -> list[tuple]:
    """Per request of the run, as the proxy decides it: the warnings it carries, or the stop."""
    result = []
    for body in requests(agent):
        state, _ = analyze(config, ChatDialect.read(body).messages)
        decision = Decision(episodes(config, state))
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


def test_crewai_text_tools_read_the_result_it_writes_into_the_assistants_message():
    # CrewAI on its text path (a model without function calling) writes `Observation: ...` into the assistant's
    # own message and answers every step with the same nudge; from the 2nd identical call on it runs nothing
    # and observes `I tried reusing the same input ...`, once with its system message's tool list appended.
    bodies = requests("crewai-text")
    assert all(m["content"].rstrip().endswith("without meta-commentary.") for m in bodies[-1]["messages"][3::2])
    # The read's result, then the refusal three times (the tool list cut): the 3rd identical refusal is the loop.
    assert decisions("crewai-text", DetectConfig()) == [(), (), (), (), ("tool_call",)]


def test_cline_error_array_is_warned_as_tool_error():
    # Cline CLI answers a failed read with [{"query": ..., "error": "Error reading file: ENOENT ...", "success":
    # false}]; its own guard stops the run after the 5th call, so the proxy warns at the 3rd and the 4th.
    assert replayed("cline") == [("warned", "tool_error"), ("warned", "tool_error")]
    assert decisions("cline") == [(), (), (), ("tool_error",), ("tool_error", "tool_error")]


def test_aider_three_failed_edits_are_warned_as_tool_error():
    # Aider's own `I updated the files.` / `Ok.` after each edit and its file-context message before the
    # newest failure are the agent's, not a person's: the three failures are one task. Aider stops itself
    # after its 3rd reflection, so its last request carries the warning.
    assert replayed("aider") == [("warned", "tool_error")]
    assert decisions("aider") == [(), (), (), ("tool_error",)]
    body = requests("aider")[-1]
    conversation = ChatDialect.read(body)
    state, _ = analyze(DEFAULT, conversation.messages)
    (episode,) = episodes(DEFAULT, state)
    assert state.start == 2 and state.turns == 3  # the task is the person's `fix the bug in a.py`
    assert episode.detail["tool"] == "edit" and "failed to match" in episode.detail["error"]
    # The warning goes after the failure that completed the loop, before Aider's closing system reminder.
    assert conversation.messages[episode.place - 1].text.startswith("# 1 SEARCH/REPLACE block failed to match!")
    assert conversation.messages[episode.place].role == "system"


def test_aider_run_that_goes_well_is_clean_and_its_second_message_is_a_persons():
    for body in requests("aider-benign"):
        state, _ = analyze(DEFAULT, ChatDialect.read(body).messages)
        assert episodes(DEFAULT, state) == []
    messages = ChatDialect.read(requests("aider-benign")[-1]).messages
    assert messages[state.start - 1].text == "is it fixed now?"


@pytest.mark.parametrize("agent", ["aider", "aider-benign", "qwen"])
def test_one_run_of_an_agent_is_one_session(agent):
    # Aider's first request opens with its file-context message, which later requests move next to the newest
    # user message; Qwen Code opens with its environment. The fingerprint uses the first message a person wrote.
    sessions = {session_of({}, ChatDialect.read(body).messages, "t") for body in requests(agent)}
    assert len(sessions) == 1


class _Sink:
    def episode(self, *args, **kwargs) -> None:
        pass

    def recovery(self, *args) -> None:
        pass


def test_the_proxy_names_each_request_as_its_fingerprint_read_afresh_does():
    # The proxy reads a conversation's fingerprint once, then knows its later requests by their first messages
    # (up to the person's first prompt): every run of every agent, one after another through one process.
    inspector = Inspector(build({}, environ={}), None)
    for run in sorted(path.stem for path in AGENTS.glob("*.jsonl")):
        for body in requests(run):
            verdict = inspector.inspect(Incoming({}, orjson.dumps(body), body, ChatDialect()), _Sink())
            fresh = session_of({}, ChatDialect.read(body).messages, tenant_of(""))
            assert verdict.headers["X-Loopwarden-Session"] == fresh, run


def test_runs_on_different_prompts_are_different_sessions_though_the_agent_opens_alike():
    first = ChatDialect.read(requests("aider")[0]).messages
    other = [m._replace(text="add a docstring to a.py") if m.text == "fix the bug in a.py" else m for m in first]
    assert session_of({}, first, "t") != session_of({}, other, "t")


@pytest.mark.parametrize("agent", ["aider-git", "aider-examples"])
def test_aider_in_a_git_repository_three_failed_edits_are_warned_as_tool_error(agent):
    # In a git repository (Aider's default) Aider's note after a failed edit is `I didn't see any properly
    # formatted edits in your reply?!`, and its repository map opens the conversation. For a model it has no
    # settings for (`aider-examples`: openai/qwen2.5-coder-32b) it also opens with its example conversation as
    # user messages and appends its closing reminder to the newest failure only. Either way the three failures
    # are one task, warned at Aider's 3rd reflection, the last request it sends.
    assert replayed(agent) == [("warned", "tool_error")]
    assert decisions(agent) == [(), (), (), ("tool_error",)]
    # The strict preset names the same step a repeated edit (threshold 3); its stop would be the 5th request.
    assert decisions(agent, STRICT) == [(), (), (), ("tool_call",)]
    body = requests(agent)[-1]
    messages = ChatDialect.read(body).messages
    state, _ = analyze(DEFAULT, messages)
    (episode,) = episodes(DEFAULT, state)
    assert messages[state.start - 1].text == "fix the bug in calc.py"
    assert messages[episode.place - 1].text.startswith("# 1 SEARCH/REPLACE block failed to match!")


def test_cline_under_the_strict_preset_is_stopped_before_its_own_guard():
    # Warned once at the 3rd failed read (as a repeated call: threshold 3), the 5th request is refused; Cline's
    # own guard would only have stopped it after the 5th call.
    assert decisions("cline", STRICT) == [(), (), (), ("tool_call",), ("stop", "tool_call")]


def test_aider_run_in_a_git_repository_that_goes_well_is_clean():
    # The edit applied and committed (`I committed the changes with git hash ... & commit msg: ...` / `Ok.`),
    # then the person's second message. Between them Aider asks its weak model for the commit message.
    bodies = requests("aider-git-benign")
    for body in bodies:
        state, _ = analyze(DEFAULT, ChatDialect.read(body).messages)
        assert episodes(DEFAULT, state) == []
    messages = ChatDialect.read(bodies[-1]).messages
    assert messages[state.start - 1].text == "is it fixed now?"
    assert first_prompt(messages) == "fix the bug in calc.py"


@pytest.mark.parametrize("agent", ["aider-git", "aider-examples"])
def test_one_aider_run_is_one_session_titled_by_the_persons_prompt(agent):
    # Aider's example conversation is no person's prompt, and the reminder it appends to the first request's
    # prompt (for a model without settings) is not in the later requests: both are left out of the fingerprint.
    prompts = {first_prompt(ChatDialect.read(body).messages) for body in requests(agent)}
    assert prompts == {"fix the bug in calc.py"}
    assert len({session_of({}, ChatDialect.read(body).messages, "t") for body in requests(agent)}) == 1


def test_aiders_commit_message_request_is_a_conversation_of_its_own():
    # Without a session header the weak model's commit-message request (2 messages, gpt-4o-mini) has a
    # fingerprint of its own; the run's conversation is still one session.
    bodies = requests("aider-git-benign")
    assert [body["model"] for body in bodies] == ["gpt-4o", "gpt-4o-mini", "gpt-4o"]
    run = {session_of({}, ChatDialect.read(body).messages, "t") for body in (bodies[0], bodies[2])}
    assert len(run) == 1 and session_of({}, ChatDialect.read(bodies[1]).messages, "t") not in run
