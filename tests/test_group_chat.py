"""Groups of agents (AutoGen's and AG2's group chats, Magentic-One): the other agents speak as user messages named
after them. Such a message answers a step; it is not a person opening a new task, so what repeats across the
agents' turns is seen as one task's."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.conversation import from_record, to_record
from proxy.detect.engine import Decision, DetectConfig, analyze as engine_analyze, episodes
from proxy.detect.text_steps import is_observation
from tests.convo import analyze, neutral, step

DEFAULT = DetectConfig()
AGENTS = Path(__file__).parent / "fixtures" / "agents"

KEY_ERROR = ("exitcode: 1 (execution failed)\nCode output: \nTraceback (most recent call last):\n"
             "  File \"\", line {line}, in <module>\n    print(df['Weight_in_lbs'])\nKeyError: 'Weight_in_lbs'\n")


def said(name: str, text: str) -> dict:
    return {"role": "user", "name": name, "content": text}


OPTIONS = ("", ", sep=','", ", encoding='utf-8'", ", header=0")


def coder(attempt: int) -> dict:
    """The coder's code, a little different each time, failing the same way."""
    return {"role": "assistant", "content": "Let me try again.\n\n```python\nimport pandas as pd\n"
                                            f"df = pd.read_csv('cars.csv'{OPTIONS[attempt]})\n"
                                            "print(df['Weight_in_lbs'])\n```"}


def found(messages, config=DEFAULT):
    state, _ = analyze(config, messages)
    return state, [(e.type, e.turn, e.is_stop) for e in episodes(config, state)]


def test_another_agents_reply_between_failing_calls_is_not_a_new_task():
    task = said("user", "How many at bats did the Yankee with the most walks in 1977 have?")
    messages = [task]
    for i in range(3):
        messages += step("web_search", {"query": "1977 Yankees walks"}, "Error: search quota exceeded")
        messages.append(said("Critic", f"Review {i}: the search should work now, try it once more."))
    state, episodes_found = found(messages[:-1])
    assert state.start == 1  # one task: the critic's replies opened none
    assert episodes_found == [("tool_call", 3, False)]
    # The same texts from whoever set the task are that person's new prompts, each a task of its own.
    person = [m if m.get("name") != "Critic" else {**m, "name": "user"} for m in messages[:-1]]
    state, episodes_found = found(person)
    assert episodes_found == [] and state.start == len(person) - 2


def test_autogens_code_executor_answers_a_step():
    assert is_observation(KEY_ERROR.format(line=3))
    assert is_observation("exitcode: 0 (execution succeeded)\nCode output: \n42\n")
    # A two-agent chat: the code changes every time, the executor's error does not (different code meeting one
    # error: weak evidence, one more than the threshold).
    messages = [said("User_proxy", "Plot weight against horsepower from cars.csv.")]
    for attempt in range(4):
        messages += [coder(attempt), said("User_proxy", KEY_ERROR.format(line=3 + attempt))]
    state, episodes_found = found(messages[:-2])
    assert episodes_found == [] and state.start == 1
    state, episodes_found = found(messages)
    assert episodes_found == [("tool_error", 4, False)]


def test_in_a_group_chat_the_executors_answer_is_the_result_though_a_critic_speaks_first():
    messages = [said("User_proxy", "Plot weight against horsepower from cars.csv.")]
    for attempt in range(4):
        messages += [coder(attempt), said("Critic", f"Score {attempt}: looks right to me."),
                     said("User_proxy", KEY_ERROR.format(line=3 + attempt))]
    state, episodes_found = found(messages)
    assert state.start == 1 and state.turns == 4
    assert episodes_found == [("tool_error", 4, False)]
    # Had the code run, the same critic's praise would be no failure: a run of new results is no loop.
    fine = [m if not m["content"].startswith("exitcode") else
            {**m, "content": f"exitcode: 0 (execution succeeded)\nCode output: \n{3500 + i}\n"}
            for i, m in enumerate(messages)]
    assert found(fine)[1] == []


def test_a_chat_messages_name_is_read_and_kept():
    (task, reply) = neutral([said("user", "Find it."), said("WebSurfer", "I typed 'it' into the search bar.")])
    assert (task.name, reply.name) == ("user", "WebSurfer")
    assert from_record(to_record(reply, 1000)) == reply
    assert "name" not in to_record(neutral([{"role": "user", "content": "hi"}])[0], 1000)
    assert neutral([{"role": "user", "name": 7, "content": "hi"}])[0].name == ""  # not text: no name


def ag2_requests(run: str, agent: str) -> list[list]:
    """The neutral messages of each request one agent of a captured AG2 run sent (its system prompt names it)."""
    bodies = [orjson.loads(line) for line in (AGENTS / f"ag2-{run}.jsonl").read_bytes().splitlines()]
    return [neutral(body["messages"]) for body in bodies
            if body["messages"][0]["content"].startswith(f"You are {agent}.")]


def decided(requests: list[list]) -> list:
    result = []
    for messages in requests:
        state, _ = engine_analyze(DEFAULT, messages)
        decision = Decision(episodes(DEFAULT, state))
        result.append(("stop", decision.stop.type) if decision.stop else tuple(e.type for e in decision.warnings))
    return result


def test_ag2_group_chat_coder_failing_alike_is_warned_at_the_third_and_fourth_and_stopped_at_the_fifth():
    # The real run: every message named after its speaker; after each of the Coder's messages the Critic
    # speaks, then the executor's `exitcode: 1`. The Coder's code differs each time, its failure does not.
    assert decided(ag2_requests("groupchat", "Coder")) == [
        (), (), (), ("tool_error",), ("tool_error", "tool_error"), ("stop", "tool_error")]
    # The Critic wrote no code: the executor's answers are not its steps. It says the same thing every time
    # (`Review N: looks fine`), which is the reply rule's.
    assert [kinds for kinds in decided(ag2_requests("groupchat", "Critic")) if "tool_error" in kinds] == []
    assert decided(ag2_requests("groupchat", "Critic"))[3] == ("reply",)  # its third review


def test_ag2_two_agent_chat_is_warned_at_the_third_failure():
    assert decided(ag2_requests("twoagent", "Coder")) == [
        (), (), (), ("tool_error",), ("tool_error", "tool_error")]


PAGE = ("I clicked 'Batting'.\n\nThe web browser is open to the page [1977 New York Yankees Batting Statistics]"
        "(https://www.baseball-reference.com/teams/NYY/1977-batting.shtml).\nThe viewport shows 7% of the webpage, "
        "and is positioned at the top of the page.\nThe following text is visible in the viewport:\n\n"
        "We and our partners store and access information on your device for the purposes below.")
ASKED = ("Please find the player with the most walks on this page.", "Look for the walks leader in the table.",
         "Scroll to the batting table and read who walked most.", "Find the 1977 walks leader and his at bats.",
         "Please read the BB column and report the top player.")


def test_an_agent_giving_the_same_answer_to_requests_reworded_is_no_news():
    # Magentic-One's orchestrator rewords its request; the web surfer answers with the same page every time.
    messages = [said("user", "How many at bats did the Yankee with the most walks in 1977 have?")]
    for asked in ASKED:
        messages += [{"role": "assistant", "content": asked}, said("WebSurfer", PAGE)]
    state, episodes_found = found(messages)
    assert state.start == 1 and episodes_found[:1] == [("tool_error", 4, False)]
    # A page that moves on each time is progress.
    players = iter(("Reggie Jackson", "Thurman Munson", "Graig Nettles", "Chris Chambliss", "Willie Randolph"))
    moving = [m if m.get("name") != "WebSurfer" else {**m, "content": PAGE.replace("We and our", next(players))}
              for m in messages]
    assert found(moving)[1] == []
