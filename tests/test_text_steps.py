"""Agents that act in text: their steps read from recorded requests, and every rule applied to them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from proxy.detect.engine import DetectConfig, Decision, ResponseWatcher, episodes
from proxy.detect.text_steps import TextAction, is_observation, read_actions, task_text, trajectory
from proxy.detect.texts import stop_text, warning_text
from proxy.conversation import text_of
from tests.convo import analyze, neutral

DEFAULT = DetectConfig(tool_call_threshold=5)
# The last request of a looping run of each agent, as the real packages sent it to a scripted model;
# DSPy's every request (its trajectory grows inside one user message).
RECORDED = json.loads((Path(__file__).parent / "fixtures" / "text_agents.json").read_text())


def kinds(messages, config=DEFAULT):
    state, _ = analyze(config, messages)
    return [(e.number, e.type, e.is_stop) for e in episodes(config, state)]


def chat(user_text: str, steps: list[tuple[str, str]], system: str = "You are an agent.") -> list[dict]:
    """A conversation of (assistant text, harness answer) steps after one user request."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user_text}]
    for action, answer in steps:
        messages.append({"role": "assistant", "content": action})
        if answer is not None:
            messages.append({"role": "user", "content": answer})
    return messages


def recorded_steps(name: str) -> tuple[list[dict], list[tuple[str, str]]]:
    """A recorded run: its opening messages and its (assistant, observation) steps."""
    (request,) = RECORDED[name]
    messages = request["messages"]
    opening = messages[:2]
    steps = [(text_of(messages[i]["content"]), text_of(messages[i + 1]["content"])) for i in range(2, len(messages) - 1, 2)]
    return opening, steps


def replay(name: str, count: int) -> list[dict]:
    """The recorded run's first step `count` times, as the looping agent went on. (The recorded run's last
    observation is merged with smolagents' closing request for a final answer.)"""
    opening, steps = recorded_steps(name)
    steps = [steps[0]] * count
    return copy.deepcopy(opening) + [m for a, o in steps for m in (
        {"role": "assistant", "content": a}, {"role": "user", "content": o})]


# Shapes the other agents use, from their templates.
SWE_AGENT_CD = ("DISCUSSION\nThe sources are in the fastjson directory; let me go there.\n\n```\ncd fastjson/\n```")
SWE_AGENT_FAILED = ("/bin/bash: line {line}: cd: fastjson/: No such file or directory\n"
                    "(Open file: n/a)\n(Current directory: /fastjson__fastjson)\nbash-$")
MINI_SWE = "THOUGHT: I need to see the failing test first.\n\n```mswea_bash_command\ncat tests/test_{name}.py\n```"
MINI_SWE_OUTPUT = "<returncode>0</returncode>\n<output>\ndef test_{name}():\n    assert parse('1') == 1\n</output>"
AIDER_EDIT = ("src/app.py\n```python\n<<<<<<< SEARCH\n    return parse(value)\n=======\n"
              "    return parse(value.strip())\n>>>>>>> REPLACE\n```")
AIDER_FAILED = ("# 1 SEARCH/REPLACE block failed to match!\n\n## SearchReplaceNoExactMatch: This SEARCH block failed "
                "to exactly match lines in src/app.py\n<<<<<<< SEARCH\n    return parse(value)\n=======\n"
                "    return parse(value.strip())\n>>>>>>> REPLACE\n\nThe SEARCH section must exactly match an existing "
                "block of lines including all white space, comments, indentation, docstrings, etc\n")

# Cline's, Roo Code's and Kilo Code's XML tools, as their system prompts describe them and their harness answers.
CLINE_READ = "<thinking>\nThe parser lives in src/app.py.\n</thinking>\n<read_file>\n<path>src/app.py</path>\n</read_file>"
CLINE_RESULT = ("[read_file for 'src/app.py'] Result:\ndef parse(value):\n    return int(value)\n\n<environment_details>\n"
                "# Current Time\n{time}\n</environment_details>")
CLINE_NO_TOOL = ("[ERROR] You did not use a tool in your previous response! Please retry with a tool use.\n\n"
                 "# Reminder: Instructions for Tool Use\n\nTool uses are formatted using XML-style tags.")


def test_cline_style_xml_tools_are_read_and_html_is_not():
    assert read_actions(CLINE_READ) == [TextAction("read_file", "<path>src/app.py</path>")]
    assert read_actions("<execute_command><command>npm test</command></execute_command>") == [
        TextAction("execute_command", "<command>npm test</command>")]
    assert read_actions("The page:\n<div>\n<p>hello</p>\n</div>") is None  # no HTML element is snake case
    assert is_observation(CLINE_RESULT.format(time="5/1/2026, 10:00:00 AM")) and is_observation(CLINE_NO_TOOL)
    assert not is_observation("[Note] I changed my mind: read the tests first.")


def test_a_cline_style_agent_reading_the_same_file_is_warned_and_its_results_start_no_task():
    steps = [(CLINE_READ, CLINE_RESULT.format(time=f"5/1/2026, 10:0{i}:00 AM")) for i in range(5)]
    assert kinds(chat("Fix the parser.", steps[:4])) == []
    assert kinds(chat("Fix the parser.", steps)) == [(1, "tool_call", False)]
    state, _ = analyze(DEFAULT, chat("Fix the parser.", steps))
    assert state.start == 2 and state.turns == 5


def test_a_cline_style_agent_answering_without_a_tool_again_and_again():
    replies = ["Here is the plan: read the parser, then fix it.", "I will start with the parser module.",
               "The fix belongs in parse(); the tests come after."]
    steps = [(reply, CLINE_NO_TOOL) for reply in replies]
    assert kinds(chat("Fix the parser.", steps)) == [(1, "tool_error", False)]


# BrowserGym's DemoAgent (WorkArena): its reasoning, then one action in an inline triple-backtick span; the
# environment answers with the page and the last action's error.
BROWSERGYM_CLICK = ("The previous attempt to click the checkbox timed out. I will try clicking it again to select "
                    "the option.\n\n```click('a222')```")
BROWSERGYM_PAGE = ("# Currently open tabs\nTab 0 (active tab)\n    Title: Developer Laptop (Mac) | ServiceNow\n\n"
                   "# Current page Accessibility Tree\n[a222] checkbox 'Adobe Acrobat', clickable, checked='false'\n\n"
                   "# Error message from last action\nTimeoutError: Locator.click: Timeout 500ms exceeded.")


def test_a_browser_agents_action_in_a_code_span_is_a_step():
    assert read_actions(BROWSERGYM_CLICK) == [TextAction("click", "'a222'")]
    assert read_actions("In summary, the next action I will perform is ```click [1234]```") == [
        TextAction("click", "1234")]
    assert read_actions("I fixed it by calling ```parse(x)``` earlier, as you asked.") is None  # not its end
    assert read_actions("Use `parse()`") is None  # a single-backtick span in prose is no action
    steps = [(BROWSERGYM_CLICK, BROWSERGYM_PAGE)] * 3
    assert kinds(chat("Order a Developer Laptop with Adobe Acrobat.", steps[:2])) == []
    assert kinds(chat("Order a Developer Laptop with Adobe Acrobat.", steps)) == [(1, "tool_error", False)]


# CrewAI's text tools (a model without function calling): the harness writes the result into the assistant's
# own message, and answers every step with the same nudge.
CREWAI_STEP = 'Thought: I need the job\'s state.\nAction: job_status\nAction Input: {{"id": "j1"}}\nObservation: {state}'
CREWAI_NUDGE = ("Analyze the tool result. If requirements are met, provide the Final Answer. Otherwise, call the "
                "next tool. Deliver only the answer without meta-commentary.")


def test_crewai_text_tools_take_the_result_from_the_assistants_message_not_the_nudge():
    polling = [(CREWAI_STEP.format(state=f"running, {10 * i}% done"), CREWAI_NUDGE) for i in range(8)]
    assert kinds(chat("Wait for job j1.", polling)) == []  # the result changes every time: progress
    stuck = [(CREWAI_STEP.format(state="queued"), CREWAI_NUDGE)] * 6
    found = kinds(chat("Wait for job j1.", stuck))
    assert found and found[0][1] == "tool_call"
    state, _ = analyze(DEFAULT, chat("Wait for job j1.", stuck))
    assert state.turns >= 5  # after its first time, the nudge started no task


def test_each_format_reads_its_action():
    _, llama = recorded_steps("llamaindex_react")
    assert read_actions(llama[0][0]) == [TextAction("read_file", '{"path":"a.txt"}')]
    _, smol = recorded_steps("smolagents_toolcalling")
    assert read_actions(smol[0][0]) == [TextAction("read_file", '{"path":"a.txt"}')]
    _, code = recorded_steps("smolagents_code")
    assert read_actions(code[0][0]) == [TextAction("python_interpreter", 'print(read_file(path="a.txt"))')]
    assert read_actions(SWE_AGENT_CD) == [TextAction("cd", "cd fastjson/")]
    assert read_actions(MINI_SWE.format(name="x")) == [TextAction("cat", "cat tests/test_x.py")]
    (edit,) = read_actions(AIDER_EDIT)
    assert edit.name == "edit" and '"path":"src/app.py"' in edit.arguments
    dspy_answer = ("[[ ## next_thought ## ]]\nRead it.\n\n[[ ## next_tool_name ## ]]\nread_file\n\n"
                   "[[ ## next_tool_args ## ]]\n{\"path\": \"a.txt\"}\n\n[[ ## completed ## ]]")
    assert read_actions(dspy_answer) == [TextAction("read_file", '{"path":"a.txt"}')]
    # Prose, a final answer and a Python example in a chat reply are not actions.
    assert read_actions("Thought: I can answer without tools.\nAnswer: 42") is None
    assert read_actions("Sure! Here is how:\n```javascript\nconsole.log(1)\n```") is None


def test_observations_are_the_harness_and_questions_are_people():
    for answer in ("Observation: hello", "Observation:\nExecution logs:\nx", MINI_SWE_OUTPUT, AIDER_FAILED,
                   SWE_AGENT_FAILED.format(line=3), "Error:\nCode execution failed at line 1"):
        assert is_observation(answer)
    for answer in ("Thanks! Now add a test.", "What does the observation mean?", "Error handling looks wrong."):
        assert not is_observation(answer)


@pytest.mark.parametrize("name", ["llamaindex_react", "smolagents_toolcalling", "smolagents_code"])
def test_recorded_loops_warn_at_the_fifth_and_sixth_step_and_stop_at_the_seventh(name):
    assert kinds(replay(name, 4)) == []
    assert kinds(replay(name, 5)) == [(1, "tool_call", False)]
    assert kinds(replay(name, 6))[-1] == (2, "tool_call", False)
    assert kinds(replay(name, 7))[-1] == (3, "tool_call", True)
    state, _ = analyze(DEFAULT, replay(name, 7))
    assert state.start == 2 and state.turns == 7  # the observations started no task


def test_the_warning_goes_after_the_observation_that_completed_the_loop():
    messages = replay("llamaindex_react", 5)
    state, _ = analyze(DEFAULT, messages)
    (episode,) = episodes(DEFAULT, state)
    assert episode.place == len(messages) and messages[-1]["content"].startswith("Observation:")
    assert "`read_file` with {\"path\":\"a.txt\"} 5 times" in warning_text(episode)


def test_a_two_step_cycle_in_text():
    steps = [(MINI_SWE.format(name=n), MINI_SWE_OUTPUT.format(name=n)) for n in ("a", "b")] * 5
    assert kinds(chat("Fix the parser.", steps[:9])) == []
    ((number, kind, _),) = kinds(chat("Fix the parser.", steps))
    assert (number, kind) == (1, "tool_cycle")


def test_the_same_failing_command_three_times_with_new_shell_line_numbers():
    steps = [(SWE_AGENT_CD, SWE_AGENT_FAILED.format(line=11301 + 13 * i)) for i in range(3)]
    assert kinds(chat("Fix the issue.", steps[:2])) == []
    state, _ = analyze(DEFAULT, chat("Fix the issue.", steps))
    (episode,) = episodes(DEFAULT, state)
    assert (episode.type, episode.detail["tool"], episode.detail["arguments"]) == ("tool_error", "cd", "cd fastjson/")
    assert "failed 3 times" in stop_text(episode)


def test_aider_edits_that_fail_to_match():
    assert kinds(chat("Strip the value.", [(AIDER_EDIT, AIDER_FAILED)] * 3)) == [(1, "tool_error", False)]


def test_benign_text_agent_runs_are_clean():
    steps = [(MINI_SWE.format(name=f"m{i}"), MINI_SWE_OUTPUT.format(name=f"m{i}")) for i in range(12)]
    assert kinds(chat("Fix the parser.", steps)) == []
    react = [(f"Thought: next file.\nAction: read_file\nAction Input: {{\"path\": \"f{i}.py\"}}", f"Observation: {i}")
             for i in range(12)]
    state, _ = analyze(DEFAULT, chat("Summarise the package.", react))
    assert episodes(DEFAULT, state) == [] and state.turns == 12


def test_a_persons_chat_is_not_a_streak():
    # Each question is a person's, so each starts a new task, however alike the answers.
    messages = [{"role": "system", "content": "You are helpful."}]
    for i in range(8):
        messages += [{"role": "user", "content": f"How do I list the files in folder {i}?"},
                     {"role": "assistant", "content": "Run this:\n```bash\nls -la\n```"}]
    messages.append({"role": "user", "content": "And hidden ones?"})
    state, _ = analyze(DEFAULT, messages)
    assert episodes(DEFAULT, state) == [] and state.start == len(messages)


def test_the_harness_repeating_a_format_error_is_not_a_person():
    error = ("Format error:\n\n<error>\nFound 2 actions.\n</error>\n\nPlease always provide EXACTLY ONE action "
             "in triple backticks, found 2 actions.")
    malformed = "THOUGHT: two at once.\n\n```mswea_bash_command\nls\n```\n\n```mswea_bash_command\npwd\n```"
    messages = chat("Fix the parser.", [(malformed, error)] * 4)
    state, _ = analyze(DEFAULT, messages)
    # The first format error looked like a person until it came again: then it was the harness answering a
    # step all along, and the task is still the person's.
    assert state.start == 2 and state.turns == 4
    assert [(e.type, e.turn, e.is_stop) for e in episodes(DEFAULT, state)] == [
        ("tool_error", 3, False), ("tool_error", 4, False)]
    # One format error is a person's message until it repeats.
    state, _ = analyze(DEFAULT, chat("Fix the parser.", [(malformed, error)]))
    assert state.start == 4 and state.turns == 0


def test_a_format_error_whose_count_changes_is_the_harness_warned_after_the_third():
    # mini-swe-agent's format error, its count changing with the malformed answer it answers.
    error = ("Format error:\n\n<error>\nFound {n} actions.\n</error>\n\nPlease always provide EXACTLY ONE action "
             "in triple backticks, found {n} actions.")
    malformed = "THOUGHT: try again.\n\n" + "\n\n".join(f"```mswea_bash_command\nls {i}\n```" for i in range(3))
    answers = [error.format(n=n) for n in (3, 2, 4, 2)]
    for count, expected in ((2, []), (3, [("tool_error", 3, False)])):
        messages = chat("Fix the parser.", [(malformed, answer) for answer in answers[:count]])
        state, _ = analyze(DEFAULT, messages)
        assert state.start == 2, "the harness's reply is not a new task"
        assert [(e.type, e.turn, e.is_stop) for e in episodes(DEFAULT, state)] == expected
    assert "found … actions" in episodes(DEFAULT, state)[0].detail["error"]
    # Folded request by request (the cache carried on), the verdict is the same.
    cache = None
    for count in range(1, 5):
        state, cache = analyze(DEFAULT, chat("Fix the parser.", [(malformed, a) for a in answers[:count]]),
                               0, cache)
    assert [(e.type, e.turn) for e in episodes(DEFAULT, state)] == [("tool_error", 3), ("tool_error", 4)]


# DSPy's ReAct requests (question and a growing trajectory), then its extractor's, which ends the run.
DSPY = [r for r in RECORDED["dspy_react"] if "next_tool_name" in r["messages"][0]["content"]]


def test_dspy_trajectory_steps_and_the_task_named_by_the_question():
    assert [len(trajectory(r["messages"][-1]["content"])) for r in DSPY] == [0, 1, 2, 3]
    last = DSPY[-1]["messages"][-1]["content"]
    steps = trajectory(last)
    assert [s.action for s in steps] == [TextAction("read_file", '{"path":"a.txt"}')] * 3
    assert all(s.observation == "hello from a.txt" for s in steps)  # the closing instruction is not in it
    keys = {analyze(DEFAULT, request["messages"])[0].key for request in DSPY}
    assert len(keys) == 1
    assert task_text(last) == task_text(DSPY[0]["messages"][-1]["content"])


def _dspy_request(steps: int) -> list[dict]:
    """The recorded DSPy request, its trajectory grown to `steps` identical steps."""
    messages = copy.deepcopy(DSPY[-1]["messages"])
    text = messages[-1]["content"]
    head, tail = text.split("[[ ## thought_0 ## ]]", 1)
    step = "[[ ## thought_0 ## ]]" + tail.split("[[ ## thought_1 ## ]]", 1)[0]
    closing = tail[tail.rindex("\n\nRespond with "):]
    body = "".join(step.replace("_0 ## ]]", f"_{i} ## ]]") for i in range(steps)).rstrip("\n")
    messages[-1]["content"] = head + body + closing
    return messages


def test_dspy_loops_warn_twice_then_stop_and_the_warnings_follow_the_trajectory():
    assert kinds(_dspy_request(4)) == []
    messages = _dspy_request(6)
    state, _ = analyze(DEFAULT, messages)
    found = episodes(DEFAULT, state)
    assert [(e.number, e.type, e.step) for e in found] == [(1, "tool_call", 5), (2, "tool_call", 6)]
    assert {e.place for e in found} == {len(messages)}
    assert kinds(_dspy_request(7))[-1] == (3, "tool_call", True)


def test_the_response_watcher_reads_text_actions():
    messages = replay("llamaindex_react", 6)
    state, _ = analyze(DEFAULT, messages)
    decision = Decision(episodes(DEFAULT, state))
    answer = {"role": "assistant", "content": messages[-2]["content"]}
    repeated = ResponseWatcher(DEFAULT, state.clone(), decision, len(messages), False).finish(neutral([answer])[0])
    assert repeated is not None and repeated.type == "tool_call"
    moved_on = {"role": "assistant", "content": "Thought: try the docs.\nAction: search\nAction Input: {\"q\": \"x\"}"}
    assert ResponseWatcher(DEFAULT, state.clone(), decision, len(messages), False).finish(neutral([moved_on])[0]) is None


def test_a_text_agents_edit_command_repeated_is_a_loop_whatever_its_observations():
    edit = "DISCUSSION\nFix the return.\n\n```\nedit 12:12\n    return parse(value.strip())\nend_of_edit\n```"
    observation = "[File: /repo/src/app.py ({n} lines total)]\n(Open file: /repo/src/app.py)\n(Current directory: /repo)\nbash-$"
    steps = [(edit, observation.format(n=100 + i)) for i in range(5)]
    assert kinds(chat("Fix the parser.", steps[:4])) == []
    assert kinds(chat("Fix the parser.", steps)) == [(1, "tool_call", False)]


def test_a_short_nudge_is_the_harness_from_its_repeat_on_and_its_first_time_a_persons():
    reply = "I will look at the configuration next."
    state, _ = analyze(DEFAULT, chat("Fix the parser.", [(reply, "go on")] * 3))
    # The first `go on` opened a task (a person may say it); its repeats are the harness answering in it.
    assert state.start == 4 and state.turns == 2


REMINDER = ("# *SEARCH/REPLACE block* Rules:\n\nEvery *SEARCH/REPLACE block* must use this format:\n"
            "1. The *FULL* file path alone on a line, verbatim.\n")
AIDER_SYSTEM = "Act as an expert software developer.\n\nTake requests for changes to the supplied code.\n" + REMINDER


def test_aiders_reminder_is_cut_from_the_message_it_was_appended_to():
    from proxy.detect.text_steps import without_reminder
    assert without_reminder("fix the bug in a.py\n\n" + REMINDER, AIDER_SYSTEM) == "fix the bug in a.py"
    assert without_reminder(AIDER_FAILED + "\n\n" + REMINDER, AIDER_SYSTEM) == AIDER_FAILED
    # Nothing is cut without the system message's own closing part after a blank line.
    assert without_reminder("fix the bug in a.py", AIDER_SYSTEM) == "fix the bug in a.py"
    assert without_reminder("fix it\n\n" + REMINDER.upper(), AIDER_SYSTEM) == "fix it\n\n" + REMINDER.upper()
    assert without_reminder("fix it\n" + REMINDER, AIDER_SYSTEM) == "fix it\n" + REMINDER
    assert without_reminder("thanks\n\nOk.", "You are helpful.\n\nOk.") == "thanks\n\nOk."  # too short to be one


def test_aider_failures_are_one_error_though_the_newest_carries_the_reminder():
    messages = chat("Strip the value.", [(AIDER_EDIT, AIDER_FAILED)] * 3)
    messages[0]["content"] = AIDER_SYSTEM
    messages[-1]["content"] += "\n\n" + REMINDER
    assert kinds(messages) == [(1, "tool_error", False)]


def test_aiders_example_conversation_is_no_persons_prompt():
    from proxy.detect.text_steps import person_text
    texts = ["Change get_factorial() to use math.factorial", "Refactor hello() into its own file.",
             "I switched to a new code base. Please don't consider the above files or try to edit them any longer.",
             "Here are summaries of some files present in my git repository.\ncalc.py",
             "I have *added these files to the chat* so you can go ahead and edit them.\n\ncalc.py",
             "fix the bug in calc.py\n\n" + REMINDER]
    assert person_text(enumerate(texts), AIDER_SYSTEM) == ("fix the bug in calc.py", 5)
    assert person_text(enumerate(texts[3:]), AIDER_SYSTEM) == ("fix the bug in calc.py", 2)
    assert person_text(enumerate(["Change get_factorial() to use math.factorial", "fix it"])) == \
        ("Change get_factorial() to use math.factorial", 0)  # without the note closing them, they are a person's
    assert person_text(enumerate(texts[3:5])) == ("", -1)  # only the agent's own preambles: no person wrote yet


def test_the_react_papers_numbered_steps_and_bracketed_arguments_are_actions():
    """The ReAct paper's harnesses (HotPotQA, FEVER, WebShop) number each step and give the argument in brackets:
    `Action 3: Lookup[Cher]` answered by `Observation 3: No more results.`; the same lookup failing alike is
    one step repeated, whatever its number."""
    from proxy.detect.text_steps import is_observation, observation_text, read_actions

    assert read_actions("Thought 3: I need her albums.\nAction 3: Lookup[Cher]") == [TextAction("Lookup", "Cher")]
    assert read_actions("Action: click[Buy Now]") == [TextAction("click", "Buy Now")]
    assert read_actions("Thought: look it up\nAction: search\nAction Input: {\"q\": 1}") == [
        TextAction("search", '{"q":1}')]  # an agent framework's ReAct, as before
    assert is_observation("Observation 3: No more results.")
    assert observation_text("Observation 3: No more results.") == observation_text("Observation 5: No more results.")
    assert read_actions("The next action: none needed.") is None  # not at a line's start


# SWE-agent with XML function calling (and Qwen3-Coder's tool format): `<function=bash>` with its parameters inside;
# a command that printed nothing is answered with SWE-agent's own sentence.
def function_block(command: str) -> str:
    return f"Let's look further.\n\n<function=bash>\n<parameter=command>{command}</parameter>\n</function>"


SWE_AGENT_NO_OUTPUT = "Your command ran successfully and did not produce any output."


def test_swe_agents_function_blocks_are_read_as_actions():
    assert read_actions(function_block("grep -rn FileType src")) == [
        TextAction("bash", '{"command":"grep -rn FileType src"}')]
    edit = ("<function=str_replace_editor>\n<parameter=command>str_replace</parameter>\n<parameter=path>/a.py"
            "</parameter>\n<parameter=old_str>\nx = 1\n</parameter>\n<parameter=new_str>\nx = 2\n</parameter>\n")
    assert read_actions(edit) == [TextAction("str_replace_editor", '{"command":"str_replace","new_str":"x = 2",'
                                                                   '"old_str":"x = 1","path":"/a.py"}')]
    assert is_observation(SWE_AGENT_NO_OUTPUT)


def test_swe_agents_searches_that_print_nothing_are_steps_not_replies_the_harness_rejects():
    # Before they were read, each search was a reply and SWE-agent's sentence the harness answering it alike.
    searches = ['grep -rl "class FileType" /testbed', 'grep -rl "FileType =" /testbed', "find /testbed -name file.py",
                'grep -rl "enum.*FileType" /testbed']
    run = [(function_block(command), SWE_AGENT_NO_OUTPUT) for command in searches]
    run.append((function_block("grep -n import /testbed/safety/scan/main.py"),
                "OBSERVATION:\n3:from safety_schemas.models import FileType\n"))
    assert kinds(chat("Fix the scan.", run), DetectConfig()) == []


def test_swe_agents_same_failing_command_is_still_a_loop():
    failure = "OBSERVATION:\nTraceback (most recent call last):\n  File \"/testbed/r.py\", line 3\nValueError: bad\n"
    run = [(function_block("python /testbed/r.py"), failure)] * 3
    assert kinds(chat("Fix the scan.", run), DetectConfig()) == [(1, "tool_call", False)]


OPENHANDS_NUDGE = ("Please continue working on the task on whatever approach you think is suitable. If you think you "
                   "have solved the task, please first send your answer to user through message and then finish the "
                   "interaction.\nIMPORTANT: YOU SHOULD NEVER ASK FOR HUMAN HELP.\n")


def test_replies_each_nudged_to_go_on_need_one_more_than_replies_an_error_answers():
    # OpenHands answers a reply without a tool call with its nudge; a model that believes it is done summarises
    # again. Three summaries then `finish` is an ending; a fourth is the model stuck replying.
    summaries = ["### Summary\n1. Decimal arithmetic fixed in dynamo_type.py.",
                 "### Key actions\n- Updated DynamoType.",
                 "The fix is complete: DynamoType keeps Decimal precision.", "To recap, the change is in place."]
    assert kinds(chat("Fix the Decimal handling.", [(s, OPENHANDS_NUDGE) for s in summaries[:3]]), DetectConfig()) == []
    found = kinds(chat("Fix the Decimal handling.", [(s, OPENHANDS_NUDGE) for s in summaries]), DetectConfig())
    assert found == [(1, "tool_error", False)]
    # Cline's error for the same thing counts at the third, as before.
    cline = [(s, CLINE_NO_TOOL) for s in summaries[:3]]
    assert kinds(chat("Fix the Decimal handling.", cline), DetectConfig()) == [(1, "tool_error", False)]


def test_openhands_without_native_tool_calls_is_read_as_steps_and_its_results_start_no_task():
    # OpenHands writes a tool call as a `<function=...>` block for a model without native ones, and its result as a
    # user message `EXECUTION RESULT of [terminal]:` (SDK 1.58; `[execute_bash]` before).
    def result(output: str, code: int = 1) -> str:
        return f"EXECUTION RESULT of [terminal]:\n{output}\n[Command finished with exit code {code}]"

    failing = [(function_block("cd /workspace && python -m pytest tests/test_app.py -x"),
                result("E   ImportError: cannot import name 'parse' from 'app'\n1 error in 0.12s"))] * 3
    assert kinds(chat("Fix the import.", failing), DetectConfig()) == [(1, "tool_call", False)]
    state, _ = analyze(DetectConfig(), chat("Fix the import.", failing))
    assert state.start == 2  # the results are the harness's, not a person's new request
    exploring = [(function_block(f"cat src/{name}.py"), result(f"def {name}(): ...", 0))
                 for name in ("app", "parse", "cli", "config", "models", "views", "util", "tests")]
    assert kinds(chat("Fix the import.", exploring), DetectConfig()) == []
    state, _ = analyze(DetectConfig(), chat("Fix the import.", exploring))
    assert (state.start, state.turns) == (2, 8)  # one task of eight steps, not eight requests of a person
