"""The engine: tool-call rules, the policy (tasks, episodes, warnings, the stop), determinism."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from proxy.detect.engine import DetectConfig, Decision, ResponseWatcher, episodes
from proxy.detect.judge_policy import JudgeCheck
from proxy.detect.normalize import excerpt, is_error_form
from proxy.detect.texts import stop_text, warning_text
from proxy.policy import parse as parse_policies
from proxy.wire.chat import ChatDialect
from tests.convo import analyze, assistant, conversation, neutral, step, steps, user

DEFAULT = DetectConfig(tool_call_threshold=5)
SENTENCE = "This is a sentence that repeats over and over now. "


def eps(messages, config=DEFAULT, **kw):
    state, _ = analyze(config, messages)
    return episodes(config, state, **kw)


def kinds(messages, config=DEFAULT, **kw):
    return [(e.number, e.type) for e in eps(messages, config, **kw)]


def same_calls(n, result="contents of a.py", name="read_file", args=None):
    return [step(name, args or {"path": "a.py"}, result) for _ in range(n)]


def test_four_identical_calls_are_nothing_the_fifth_is_a_loop():
    assert kinds(conversation(user("go"), *same_calls(4))) == []
    found = eps(conversation(user("go"), *same_calls(5)))
    assert [(e.number, e.type) for e in found] == [(1, "tool_call")]
    assert found[0].detail["tool"] == "read_file"
    assert found[0].detail["arguments"] == '{"path":"a.py"}'


def test_further_identical_calls_are_further_episodes_then_the_stop():
    messages = conversation(user("go"), *same_calls(7))
    found = eps(messages)
    assert [(e.number, e.type, e.is_stop) for e in found] == [
        (1, "tool_call", False), (2, "tool_call", False), (3, "tool_call", True)]
    decision = Decision(found)
    assert [e.number for e in decision.warnings] == [1, 2]
    assert decision.stop is found[2]


def test_warning_goes_after_the_call_and_its_result():
    messages = conversation(user("go"), *same_calls(5))
    (episode,) = eps(messages)
    assert episode.place == len(messages)
    assert messages[episode.message_index]["role"] == "assistant"
    assert messages[episode.place - 1]["role"] == "tool"


def test_key_order_and_whitespace_do_not_matter():
    variants = ['{"path": "a.py", "limit": 10}', '{"limit":10,"path":"a.py"}', '{ "limit" : 10 , "path":"a.py" }']
    messages = conversation(user("go"), *[step("read_file", variants[i % 3], "same") for i in range(5)])
    assert kinds(messages) == [(1, "tool_call")]


def test_different_arguments_or_other_tools_between_are_nothing():
    calls = [step("read_file", {"path": f"f{i}.py"}, "x") for i in range(10)]
    assert kinds(conversation(user("go"), *calls)) == []
    mixed = []
    for _ in range(4):
        mixed += same_calls(2) + [step("ls", {}, "a.py")]
    assert kinds(conversation(user("go"), *mixed)) == []


def test_text_between_calls_does_not_break_a_streak():
    messages = conversation(user("go"), *[step("read_file", {"path": "a.py"}, "x", text=f"Attempt {i}")
                                          for i in range(5)])
    assert kinds(messages) == [(1, "tool_call")]


def test_a_poll_whose_answer_changes_is_progress():
    polls = [step("job_status", {"id": 7}, f"running: {i * 10}% done") for i in range(10)]
    assert kinds(conversation(user("go"), *polls)) == []


def test_a_poll_with_only_timestamps_changing_is_a_loop():
    polls = [step("job_status", {"id": 7}, f"2026-11-0{i + 1}T10:0{i}:00Z \x1b[32mpending\x1b[0m pid {100 + i}")
             for i in range(5)]
    assert kinds(conversation(user("go"), *polls)) == [(1, "tool_call")]


def test_an_unknown_result_counts_as_unchanged():
    messages = conversation(user("go"), *same_calls(4), step("read_file", {"path": "a.py"}, None))
    assert kinds(messages) == [(1, "tool_call")]


def test_whitelisted_tools_are_never_counted():
    config = DetectConfig(tool_call_threshold=5, whitelisted_tools=frozenset({"debugger_next"}))
    calls = [step("debugger_next", {}, "line 10") for _ in range(10)]
    assert kinds(conversation(user("go"), *calls), config) == []
    assert kinds(conversation(user("go"), *calls)) != []


def _cycle(names, repeats, result="ok"):
    return [step(name, {"n": name}, result) for _ in range(repeats) for name in names]


def test_alternation_fires_on_the_tenth_call():
    assert kinds(conversation(user("go"), *_cycle("AB", 5)[:9])) == []
    found = eps(conversation(user("go"), *_cycle("AB", 5)))
    assert [(e.number, e.type) for e in found] == [(1, "tool_cycle")]
    assert found[0].detail["cycle"] == ["A", "B"]
    assert found[0].turn == 10


def test_cycles_of_three_four_and_five():
    for names in ("ABC", "ABCD", "ABCDE"):
        k = len(names)
        assert kinds(conversation(user("go"), *_cycle(names, 5)[: 5 * k - 1])) == []
        found = eps(conversation(user("go"), *_cycle(names, 5)))
        assert [(e.type, e.turn) for e in found] == [("tool_cycle", 5 * k)], names


def test_broken_alternation_is_nothing():
    messages = conversation(user("go"), *_cycle("AB", 2), step("C", {}, "c"), *_cycle("AB", 2))
    assert kinds(messages) == []


def test_a_cycle_whose_results_change_is_progress():
    calls = []
    for i in range(6):
        calls += [step("edit", {"f": "a"}, f"edited, now {i} lines"), step("test", {}, f"{i} passing")]
    assert kinds(conversation(user("go"), *calls)) == []


def test_same_error_three_times_with_other_calls_between():
    error = "Error: ENOENT: no such file or directory, open '/tmp/build-8f3a9c2d/out.json' at 12:00:01"
    calls = [
        step("run_build", {"target": "all"}, error),
        step("read_file", {"path": "a.py"}, "code"),
        step("run_build", {"target": "all"}, error.replace("12:00:01", "12:00:09").replace("8f3a9c2d", "77aa00bb1")),
        step("ls", {}, "a.py b.py"),
    ]
    assert kinds(conversation(user("go"), *calls)) == []
    found = eps(conversation(user("go"), *calls, step("run_build", {"target": "all"}, error)))
    assert [(e.type, e.detail["tool"]) for e in found] == [("tool_error", "run_build")]


def test_client_marked_errors_count():
    calls = [step("deploy", {}, "nope", is_error=True) for _ in range(3)]
    assert kinds(conversation(user("go"), *calls)) == [(1, "tool_error")]


def test_same_call_same_error_warns_after_the_third_call_one_episode_per_message():
    calls = same_calls(5, result="Traceback (most recent call last): ValueError: bad input")
    found = eps(conversation(user("go"), *calls))
    # Calls 3, 4 and 5 each complete an episode; the 5th is also a tool_call loop, but the loop that was
    # warned as tool_error stops as tool_error.
    assert [(e.number, e.type) for e in found] == [(1, "tool_error"), (2, "tool_error"), (3, "tool_error")]
    assert "failed 5 times with the same error" in stop_text(found[2])


def test_identical_calls_in_one_message_are_steps_each_past_the_threshold_its_own_episode():
    messages = conversation(user("go"), steps([("read_file", {"path": "a"}, "x")] * 7))
    found = eps(messages)
    assert [(e.number, e.type, e.step, e.is_stop) for e in found] == [
        (1, "tool_call", 5, False), (2, "tool_call", 6, False), (3, "tool_call", 7, True)]
    # Every warning goes after the results that answer the message, in the order of its steps.
    assert {e.message_index for e in found} == {2} and {e.place for e in found} == {len(messages)}
    decision = Decision(found)
    body = ChatDialect.with_warnings({"messages": messages}, ChatDialect.read({"messages": messages}),
                                     [(e.place, "system", warning_text(e)) for e in decision.warnings])
    assert [m["content"][:34] for m in body["messages"][len(messages):]] == [
        "[loopwarden] Loop detected (1/2): ", "[loopwarden] Loop detected (2/2): "]


def test_a_message_with_different_calls_in_it_counts_each_as_a_step():
    # Four identical calls, then a message that calls it once more among other calls: its first step is the 5th.
    messages = conversation(user("go"), *same_calls(4), steps([("read_file", {"path": "a.py"}, "contents of a.py"),
                                                              ("ls", {}, "a.py"), ("ls", {"path": "b"}, "b.py")]))
    found = eps(messages)
    assert [(e.number, e.type, e.step) for e in found] == [(1, "tool_call", 1)]
    # The same calls spread over messages, or held in one, find the same loops.
    spread = conversation(user("go"), *[step("read_file", {"path": "a"}, "x") for _ in range(6)])
    held = conversation(user("go"), steps([("read_file", {"path": "a"}, "x")] * 3),
                        steps([("read_file", {"path": "a"}, "x")] * 3))
    assert kinds(spread) == kinds(held) == [(1, "tool_call"), (2, "tool_call")]


def test_one_message_whose_steps_grow_warns_at_each_request_then_stops():
    # An agent that appends each step's call to one assistant message sends the message with one call more
    # each time: the 5th warns, the 6th warns again, the 7th is the stop.
    seen = []
    for count in range(1, 8):
        decision = Decision(eps(conversation(user("go"), steps([("read_file", {"path": "a"}, "x")] * count))))
        seen.append("stop" if decision.stop else len(decision.warnings))
    assert seen == [0, 0, 0, 0, 1, 2, "stop"]


def test_a_response_of_identical_parallel_calls_is_a_loop():
    call = step("read_file", {"path": "a.py"}, None)[0]["tool_calls"] * 5
    kind, _, episode = _stream(DEFAULT, conversation(user("go")), [], [dict(c, id=f"c{i}") for i, c in enumerate(call)])
    assert (kind, episode.type, episode.number, episode.step) == ("end", "tool_call", 1, 5)


def test_a_new_user_message_starts_a_new_task():
    messages = conversation(user("go"), *same_calls(6), user("now do something else"), *same_calls(4))
    assert kinds(messages) == []
    messages = conversation(user("go"), *same_calls(6), user("again"), *same_calls(5))
    assert kinds(messages) == [(1, "tool_call")]


def test_reset_position_starts_a_fresh_task():
    messages = conversation(user("go"), *same_calls(6))
    state, _ = analyze(DEFAULT, messages, reset_at=len(messages))
    assert episodes(DEFAULT, state) == []
    more = messages + [m for s in same_calls(2) for m in s]
    state, _ = analyze(DEFAULT, more, reset_at=len(messages))
    assert episodes(DEFAULT, state) == []


def test_chanting_in_history_and_plan_mode():
    messages = conversation(user("go"), assistant(SENTENCE * 12))
    assert kinds(messages) == [(1, "content")]
    assert kinds(messages, plan_mode=True) == []


def test_a_tool_call_between_repeats_resets_the_content_tracking():
    messages = conversation(user("go"), *step("ls", {}, "x", text=SENTENCE * 9), assistant(SENTENCE * 9))
    assert kinds(messages) == []


def test_one_message_one_episode_named_by_the_first_rule():
    calls = same_calls(4) + [step("read_file", {"path": "a.py"}, "contents of a.py", text=SENTENCE * 12)]
    found = eps(conversation(user("go"), *calls))
    assert [(e.number, e.type) for e in found] == [(1, "tool_call")]


def test_injected_warnings_are_never_the_models_output_nor_a_new_task():
    messages = conversation(user("go"), *same_calls(5))
    (episode,) = eps(messages)
    injected = {"role": "user", "content": warning_text(episode)}
    with_warning = messages[: episode.place] + [injected] + messages[episode.place:]
    with_warning += [m for s in same_calls(1) for m in s]
    assert kinds(with_warning) == [(1, "tool_call"), (2, "tool_call")]


def test_dynamic_thresholds():
    config = DetectConfig(tool_call_threshold=5, dynamic_thresholds=True)
    assert kinds(conversation(user("go"), *same_calls(3)), config) == [(1, "tool_call")]
    early = [step("x", {"i": i}, "r") for i in range(31)]
    assert kinds(conversation(user("go"), *early, *same_calls(6)), config) == []
    assert kinds(conversation(user("go"), *early, *same_calls(7)), config) == [(1, "tool_call")]


def test_max_warnings_zero_stops_at_the_first_detection():
    config = DetectConfig(tool_call_threshold=5, max_warnings=0)
    (episode,) = eps(conversation(user("go"), *same_calls(5)), config)
    assert episode.is_stop


def test_warning_and_stop_texts_say_what_repeats():
    found = eps(conversation(user("go"), *same_calls(7)))
    text = warning_text(found[0])
    assert text.startswith("[loopwarden] Loop detected (1/2): ")
    assert "`read_file`" in text and '{"path":"a.py"}' in text
    assert "last warning" in warning_text(found[1])
    assert "read_file" in stop_text(found[2])


def test_judge_verdicts_become_llm_episodes_on_the_next_turn():
    calls = [step("edit", {"i": i}, f"ok {i}") for i in range(35)]
    messages = conversation(user("go"), *calls)
    state, _ = analyze(DEFAULT, messages)
    sure = JudgeCheck(state.key, 30, 0.95, analysis="keeps undoing its own edit")
    unsure = JudgeCheck(state.key, 30, 0.5)
    other_task = JudgeCheck("someothertask", 30, 0.99)
    assert episodes(DEFAULT, state, judge_checks=[unsure, other_task]) == []
    (episode,) = episodes(DEFAULT, state, judge_checks=[sure])
    assert (episode.type, episode.turn) == ("llm", 31)
    confirm = DetectConfig(tool_call_threshold=5, judge_confirm=True)
    assert episodes(confirm, state, judge_checks=[JudgeCheck(state.key, 30, 0.95, 0.89)]) == []
    assert len(episodes(confirm, state, judge_checks=[JudgeCheck(state.key, 30, 0.95, 0.91)])) == 1


def _stream(config, messages, text_deltas, tool_calls=(), plan_mode=False):
    state, _ = analyze(config, messages)
    decision = Decision(episodes(config, state, plan_mode=plan_mode))
    watcher = ResponseWatcher(config, state.clone(), decision, len(messages), plan_mode)
    for i, delta in enumerate(text_deltas):
        if watcher.text(delta):
            return "cut", i, watcher.episode
    return "end", None, watcher.finish(
        neutral([{"role": "assistant", "content": "".join(text_deltas), "tool_calls": list(tool_calls)}])[0])


def test_response_watcher_cuts_chanting_as_it_streams():
    kind, at, episode = _stream(DEFAULT, conversation(user("go")), [SENTENCE] * 100)
    assert (kind, episode.type, episode.number) == ("cut", "content", 1)
    assert at < 12
    assert _stream(DEFAULT, conversation(user("go")), [SENTENCE] * 100, plan_mode=True)[0] == "end"


def test_response_watcher_counts_the_completing_call_and_history_agrees():
    messages = conversation(user("go"), *same_calls(4))
    call = step("read_file", {"path": "a.py"}, None)[0]["tool_calls"]
    kind, _, episode = _stream(DEFAULT, messages, [], call)
    assert (kind, episode.type, episode.number) == ("end", "tool_call", 1)
    # The same call seen in the next request's history is the same episode, at the same message.
    later = messages + step("read_file", {"path": "a.py"}, "contents of a.py")
    (again,) = eps(later)
    assert (again.number, again.message_index) == (1, episode.message_index)


def test_cache_never_changes_a_verdict():
    rng = random.Random(5)
    messages = conversation(user("go"))
    cache = None
    for i in range(60):
        if rng.random() < 0.1:
            messages.append(user(f"new task {i}"))
        roll = rng.random()
        if roll < 0.4:  # the same read, its result changing now and then
            messages += step("read_file", {"path": "a.py"}, rng.choice(["same", "same", "changed"]))
        elif roll < 0.6:
            messages += step("build", {}, "Error: failed")
        elif roll < 0.8:
            messages.append(assistant(SENTENCE * rng.randint(1, 12)))
        else:
            messages += step("ls", {"d": i}, f"{i}")
        cached_state, cache = analyze(DEFAULT, messages, cache=cache)
        fresh_state, _ = analyze(DEFAULT, messages)
        assert episodes(DEFAULT, cached_state) == episodes(DEFAULT, fresh_state)


def test_the_cache_keeps_no_tool_result_whole():
    """Results are masked when first compared; whatever the cache keeps for the next request is settled, so a
    session's cached state never holds a raw result (they can be megabytes)."""
    big = "x = 1\n" * 50_000
    messages = conversation(user("go"), *same_calls(3), *step("read_file", {"path": "big.py"}, big))
    state, cache = analyze(DEFAULT, messages)
    kept = [call for call in cache.state.tools._recent if call is not None]
    assert kept and all(call._raw is None for call in kept)
    assert kept[-1].result_excerpt.startswith("x = 1 x = 1")
    # And the next request compares with them by their digests.
    later = messages + step("read_file", {"path": "big.py"}, big)
    cached_state, _ = analyze(DEFAULT, later, cache=cache)
    assert episodes(DEFAULT, cached_state) == eps(later)


def test_cache_notices_an_edited_history():
    messages = conversation(user("go"), *same_calls(5))
    _, cache = analyze(DEFAULT, messages)
    edited = orjson.loads(orjson.dumps(messages))
    edited[3]["content"] = "[old tool result cleared]"
    state, _ = analyze(DEFAULT, edited, cache=cache)
    assert episodes(DEFAULT, state) == episodes(DEFAULT, analyze(DEFAULT, edited)[0])
    assert episodes(DEFAULT, state) == []


def _shuffle_keys(value, rng):
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffle_keys(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffle_keys(v, rng) for v in value]
    return value


@given(st.lists(st.dictionaries(st.text(min_size=1, max_size=5), st.integers(min_value=-2**53, max_value=2**53) | st.text(max_size=8),
                                max_size=4), min_size=1, max_size=3),
       st.integers(min_value=0, max_value=2**16), st.integers(min_value=3, max_value=8))
@settings(max_examples=100, deadline=None)
def test_permuting_json_keys_never_changes_a_tool_verdict(argument_pool, seed, length):
    rng = random.Random(seed)
    chosen = [rng.choice(argument_pool) for _ in range(length)]
    plain = conversation(user("go"), *[step("tool", a, "r") for a in chosen])
    shuffled = conversation(user("go"), *[step("tool", orjson.dumps(_shuffle_keys(a, rng)).decode(), "r")
                                          for a in chosen])
    assert kinds(plain) == kinds(shuffled)


@given(st.integers(min_value=0, max_value=2**32))
@settings(max_examples=60, deadline=None)
def test_benign_conversations_never_trigger(seed):
    rng = random.Random(seed)
    words = ["file", "test", "build", "module", "change", "result", "error-free", "config", "update", "value"]
    parts = [user("Refactor the project.")]
    for i in range(rng.randint(5, 60)):
        prose = " ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) + f" ({i})."
        tool = rng.choice(["read_file", "edit_file", "run_tests", "grep"])
        parts.append(step(tool, {"path": f"src/m{i}.py", "line": rng.randint(1, 500)},
                          f"done {i}: {rng.random()}", text=prose))
    assert kinds(conversation(*parts)) == []


# Real result shapes from real agents: told apart by form, masked by meaning.

QWEN_UNCHANGED = ("[File a.txt unchanged since last read in this session. Its content is the same as shown in the "
                  "earlier read. If you cannot retrieve that prior content from the conversation, read it again "
                  "with a different offset.]")
QWEN_INVALID = "params must NOT have additional properties"


def test_qwen_unchanged_read_is_a_success_and_its_loop_says_so():
    assert kinds(conversation(user("go"), *same_calls(4, result=QWEN_UNCHANGED))) == []
    (found,) = eps(conversation(user("go"), *same_calls(5, result=QWEN_UNCHANGED)))
    assert found.type == "tool_call"
    assert "got the same result each time" in warning_text(found) and "failed" not in warning_text(found)


def test_an_agents_unchanged_since_last_read_answer_is_the_read_it_points_to():
    """Qwen Code answers a re-read with a marker from the 2nd read on: the default ladder warns after the 3rd."""
    reads = [step("read_file", {"path": "a.txt"}, "port = 1")] + same_calls(2, name="read_file",
                                                                            args={"path": "a.txt"},
                                                                            result=QWEN_UNCHANGED)
    assert kinds(conversation(user("go"), *reads), DetectConfig()) == [(1, "tool_call")]
    claude = "File unchanged since last read. The content from the earlier Read tool_result is still current."
    reads = [step("Read", {"file_path": "/a.txt"}, "port = 1")] + same_calls(2, name="Read",
                                                                             args={"file_path": "/a.txt"},
                                                                             result=claude)
    assert kinds(conversation(user("go"), *reads), DetectConfig()) == [(1, "tool_call")]


def test_qwen_validation_error_is_an_error():
    found = eps(conversation(user("go"), *same_calls(3, name="read_file", args={"path": "a", "bogus": 1},
                                                     result=QWEN_INVALID)))
    assert [(e.type, e.detail["error"]) for e in found] == [("tool_error", QWEN_INVALID)]


@pytest.mark.parametrize("success", [
    "Found 3 matches:\nsrc/errors.py: class ValidationError(Exception):\nsrc/app.py: raise Error('x')",
    "<file>\n00001| def handle_error(error):\n00002|     log.error(error)\n</file>",
    "Chunk ID: 4fa1\nWall time: 0.0021 seconds\nProcess exited with code 0\nOutput:\nerror: none of the tests failed",
    '{"status": "ok", "errors": [], "message": "no error"}',
    '[{"query": "a.txt", "result": "the error log is empty", "error": "", "success": true}]',
    '[{"job": 1, "error": "timeout"}, {"job": 2, "error": null, "success": true}]',  # a list of jobs, one failed
    "usage: tool.py [-h] [--fast]\n\nRun the tool.\n\noptions:\n  -h, --help  show this help message and exit",
])
def test_successes_that_mention_errors_are_successes(success):
    assert kinds(conversation(user("go"), *same_calls(4, result=success))) == []


@pytest.mark.parametrize("failure", [
    "Error: ENOENT: no such file or directory",
    "Traceback (most recent call last):\n  File \"a.py\", line 1\nZeroDivisionError: division by zero",
    "Chunk ID: 4fa1\nWall time: 0.0021 seconds\nProcess exited with code 2\nOutput:\nmake: *** [all] Error 2",
    '{"error": {"message": "rate limited"}}',
    "<returncode>1</returncode>\n<output>\ngrep: src: Is a directory\n</output>",
    "cat: src/app.py: No such file or directory",
    # Cline CLI 3.0.65's read_files on a missing file: a list of objects that say they failed.
    '[{"query":"/w/config/settings.json","result":"","error":"Error reading file: ENOENT: no such file or '
    'directory, statx \'/w/config/settings.json\'","success":false}]',
    '{"ok": true, "success": false, "message": "the patch did not apply"}',
    "Usage: edit <start_line>:<end_line>",  # SWE-agent answering a malformed edit command
])
def test_errors_by_their_form(failure):
    assert kinds(conversation(user("go"), *same_calls(3, result=failure))) == [(1, "tool_error")]


def test_codex_shell_outputs_differing_only_in_chunk_id_and_wall_time_are_the_same_result():
    outputs = [f"Chunk ID: {token}\nWall time: 0.00{i}3 seconds\nProcess exited with code 0\nOriginal token count: 12\n"
               f"Output:\nsrc/app.py\nsrc/util.py\n" for i, token in enumerate(["d131b6", "9f2", "a0c4e7", "1b", "77e0aa"])]
    calls = [step("shell", {"command": ["bash", "-lc", "ls src"]}, out) for out in outputs]
    assert kinds(conversation(user("go"), *calls)) == [(1, "tool_call")]


def test_gemini_cli_shell_outputs_differing_only_in_their_process_group_are_the_same_failure():
    outputs = ["<untrusted_context>\nOutput: F\nFAIL: test_add (__main__.T.test_add)\nTraceback (most recent call "
               "last):\n  File \"/work/calc/test_calc.py\", line 8, in test_add\nAssertionError: 0 != 4\n\n"
               f"Ran 1 test in 0.00{i}s\n\nFAILED (failures=1)\nExit Code: 1\nProcess Group PGID: {29753 + 31 * i}\n"
               "</untrusted_context>" for i in range(3)]
    calls = [step("run_shell_command", {"command": "python3 test_calc.py"}, out) for out in outputs]
    found = eps(conversation(user("go"), *calls))
    assert [(e.type, e.detail["tool"]) for e in found] == [("tool_error", "run_shell_command")]


def test_shell_line_numbers_do_not_hide_the_same_failure():
    calls = [step("bash", {"command": "cd fastjson/"}, f"/bin/bash: line {11301 + 7 * i}: cd: fastjson/: "
                                                       "No such file or directory") for i in range(3)]
    found = eps(conversation(user("go"), *calls))
    assert [(e.type, e.detail["tool"]) for e in found] == [("tool_error", "bash")]


def test_the_same_call_past_three_times_the_threshold_is_a_loop_whatever_its_results():
    query = {"sql": "select count(*) from jobs where state = 'queued'"}
    calls = [step("run_query", query, f"count: {100 + i}") for i in range(16)]
    found = eps(conversation(user("go"), *calls[:14]))
    assert found == []
    found = eps(conversation(user("go"), *calls))
    assert [(e.type, e.turn) for e in found] == [("tool_call", 15), ("tool_call", 16)]
    assert found[0].detail["same_result"] is False
    assert "its result changed" in warning_text(found[0])
    # A whitelisted tool is never counted, however often.
    exempt = DetectConfig(tool_call_threshold=5, whitelisted_tools=frozenset({"run_query"}))
    assert eps(conversation(user("go"), *calls), exempt) == []


EDIT = {"path": "src/app.py", "old_str": "return parse(value)", "new_str": "return parse(value.strip())"}


@pytest.mark.parametrize("name", ["str_replace_based_edit_tool", "apply_patch", "write_file", "edit", "MultiEdit",
                                  "search_replace", "insert_lines", "str_replace_editor"])
def test_the_same_edit_threshold_times_in_a_row_is_a_loop_whatever_its_results(name):
    calls = [step(name, EDIT, f"The file src/app.py has been edited: now {100 + i} lines") for i in range(7)]
    assert eps(conversation(user("go"), *calls[:4])) == []
    found = eps(conversation(user("go"), *calls))
    assert [(e.number, e.type, e.turn, e.is_stop) for e in found] == [
        (1, "tool_call", 5, False), (2, "tool_call", 6, False), (3, "tool_call", 7, True)]
    assert found[0].detail["same_result"] is False and "its result changed" in warning_text(found[0])


@pytest.mark.parametrize("name", ["read_file", "credit_check", "todo", "applications_list", "view"])
def test_other_tools_whose_results_change_are_not_edits(name):
    calls = [step(name, EDIT, f"result {i}") for i in range(7)]
    assert eps(conversation(user("go"), *calls)) == []


def test_a_policy_says_which_tools_edit():
    calls = [step("sed_tool", EDIT, f"done {i}") for i in range(5)]
    marked = DetectConfig(tool_call_threshold=5, policies=parse_policies({"tools": {"sed_*": {"edit": True}}}))
    assert kinds(conversation(user("go"), *calls)) == []
    assert kinds(conversation(user("go"), *calls), marked) == [(1, "tool_call")]
    writer = [step("write_log", EDIT, f"appended line {i}") for i in range(5)]
    unmarked = DetectConfig(tool_call_threshold=5,
                            policies=parse_policies({"tools": {"write_log": {"edit": False}}}))
    assert kinds(conversation(user("go"), *writer)) == [(1, "tool_call")]
    assert kinds(conversation(user("go"), *writer), unmarked) == []


def test_two_edits_applied_in_turn_past_three_times_the_threshold_rounds_are_a_cycle():
    first = dict(EDIT, new_str="return parse(value.strip())")
    second = dict(EDIT, old_str="return parse(value.strip())", new_str="return parse(value)")
    calls = []
    for i in range(16):
        calls += [step("str_replace_based_edit_tool", first, f"edited: {i}a"),
                  step("str_replace_based_edit_tool", second, f"edited: {i}b")]
    assert eps(conversation(user("go"), *calls[:29])) == []
    found = eps(conversation(user("go"), *calls[:30]))  # round 15
    assert [(e.type, e.turn) for e in found] == [("tool_cycle", 30)]
    assert found[0].detail["same_result"] is False and "their results changed" in warning_text(found[0])
    # Any two calls in turn, edits or not.
    polls = [step(name, {}, f"{name} {i}") for i in range(15) for name in ("status", "progress")]
    assert kinds(conversation(user("go"), *polls)) == [(1, "tool_cycle")]


def test_a_poll_whose_answer_changes_is_progress_up_to_the_bound():
    polls = [step("job_status", {"id": 7}, f"running: {i}% done") for i in range(14)]
    assert kinds(conversation(user("go"), *polls)) == []


def test_a_cycle_names_each_call_with_its_arguments():
    calls = []
    for _ in range(5):
        calls += [step("read", {"filePath": "/repo/a.ts"}, "<file>a</file>"),
                  step("read", {"filePath": "/repo/b.ts"}, "<file>b</file>")]
    (found,) = eps(conversation(user("go"), *calls))
    assert found.type == "tool_cycle"
    assert ('`read` with {"filePath":"/repo/a.ts"} → `read` with {"filePath":"/repo/b.ts"}'
            in stop_text(found))


def test_the_cut_notice_in_history_is_not_the_models_text():
    notice = "\n\n[loopwarden] Output cut: the same text repeated 10 times."
    # Five cut answers whose own text differs: only the notices would repeat.
    messages = conversation(user("go"))
    for i in range(12):
        messages += [assistant(f"Attempt {i} at the parser, with a different idea each time ({i * 37})." + notice),
                     user("continue")]
    assert kinds(messages) == []
    state, _ = analyze(DEFAULT, conversation(user("go"), assistant(SENTENCE * 10 + notice)))
    assert [f.was_cut for f in state.findings] == [True]


def test_a_rerun_of_the_same_prompt_is_another_task():
    first = conversation(user("go"), *same_calls(2))
    rerun = conversation(user("go"), *same_calls(2))  # the model gave new call ids
    key = lambda messages: analyze(DEFAULT, messages)[0].key  # noqa: E731
    assert key(first) != key(rerun)
    assert key(first) == key(first + same_calls(1)[0])  # the same run, one turn longer
    assert key(conversation(user("go"), assistant("hi"))) == key(conversation(user("go"), assistant("hello")))


# -- errors by the forms real tools print (tests/fixtures/tool_output: real output where the tool runs here) ---

TOOL_OUTPUT = Path(__file__).parent / "fixtures" / "tool_output"
FAILURES = sorted(p.name for p in TOOL_OUTPUT.glob("*.fail.txt"))
SUCCESSES = sorted(p.name for p in TOOL_OUTPUT.glob("*.pass.txt"))


def test_every_tool_form_has_fixtures_failing_and_passing():
    assert len(FAILURES) >= 20 and len(SUCCESSES) >= 10


@pytest.mark.parametrize("name", FAILURES)
def test_a_tools_failure_report_is_an_error(name):
    report = (TOOL_OUTPUT / name).read_text()
    assert is_error_form(report)
    assert kinds(conversation(user("go"), *same_calls(3, name="run", args={}, result=report))) == [(1, "tool_error")]


def test_a_failure_report_is_found_where_its_form_lives_in_a_long_output():
    noise = "".join(f"collecting tests/module_{i}.py\n" for i in range(400))
    assert is_error_form(noise + (TOOL_OUTPUT / "pytest.fail.txt").read_text())  # a summary comes last
    assert is_error_form((TOOL_OUTPUT / "gcc.fail.txt").read_text() + noise)  # a compiler error comes first
    assert not is_error_form(noise + "FAILED tests/test_a.py::test_x\n" + noise)  # not where the form lives


@pytest.mark.parametrize("name", SUCCESSES)
def test_a_tools_success_stays_a_success(name):
    assert not is_error_form((TOOL_OUTPUT / name).read_text())


def test_the_failing_test_run_with_other_calls_between_warns_twice_then_stops():
    def run_tests(i):  # the same pytest report, a new timestamp and pid each run
        report = (TOOL_OUTPUT / "pytest.fail.txt").read_text()
        return f"[{10 + i}:02:17] worker pid {4000 + i}\n{report}".replace("0.84s", f"0.{80 + i}s")

    calls = []
    for i in range(5):
        calls += [step("run_tests", {}, run_tests(i)), step("read_file", {"path": "calc.py"}, f"line {i}"),
                  step("edit", {"path": "calc.py", "line": i}, "edited")]
    found = eps(conversation(user("fix it"), *calls))
    assert [(e.number, e.type, e.detail["tool"], e.turn) for e in found] == [
        (1, "tool_error", "run_tests", 7), (2, "tool_error", "run_tests", 10), (3, "tool_error", "run_tests", 13)]
    assert found[2].is_stop and "::test_add - assert -1 == 5" in found[0].detail["error"]


def test_one_error_answering_three_different_calls_is_tool_error():
    unknown = "Error: tool 'search_code' does not exist. Available tools: read_file, edit, run_tests."
    calls = [step("search_code", {"query": q}, unknown) for q in ("parser", "Parser class", "def parse")]
    assert kinds(conversation(user("go"), *calls[:2])) == []
    (found,) = eps(conversation(user("go"), *calls))
    assert (found.type, found.detail["repeats"]) == ("tool_error", 3)
    assert [c["arguments"] for c in found.detail["calls"]] == [
        '{"query":"parser"}', '{"query":"Parser class"}', '{"query":"def parse"}']
    text = warning_text(found)
    assert "the same error answered your last 3 calls" in text and "does not exist" in text
    assert '`search_code` with {"query":"def parse"}' in stop_text(found)


def test_near_identical_edits_rejected_alike_are_tool_error():
    rejected = (TOOL_OUTPUT / "swe-agent-edit.fail.txt").read_text()
    edits = [step("edit", {"start": 1475, "end": 1475, "text": "return int(round(x))" + " " * i}, rejected)
             for i in range(3)]
    assert kinds(conversation(user("go"), *edits)) == [(1, "tool_error")]


def test_the_same_error_broken_by_another_result_or_saying_nothing_is_not_one_loop():
    unknown = "Error: tool 'search_code' does not exist. Available tools: read_file."
    broken = [step("search_code", {"q": 1}, unknown), step("search_code", {"q": 2}, unknown),
              step("read_file", {"path": "a"}, "text"), step("search_code", {"q": 3}, unknown)]
    assert kinds(conversation(user("go"), *broken)) == []
    no_match = "<returncode>1</returncode>\n<output>\n</output>"  # grep finding nothing is no cause of anything
    greps = [step("bash", {"command": f"grep -n {word} src/*.py"}, no_match) for word in ("foo", "bar", "baz", "qux")]
    assert kinds(conversation(user("go"), *greps)) == []


def test_two_failures_with_a_long_shared_start_are_two_errors():
    chain = "Traceback (most recent call last):\n" + "".join(
        f'  File "/testbed/pkg/m{i}.py", line {i}, in <module>\n    from pkg import m{i + 1}\n' for i in range(12))
    missing = [chain + f"ModuleNotFoundError: No module named '{name}'" for name in ("pytz", "scipy", "h5py")]
    assert kinds(conversation(user("go"), *[step("bash", {"command": "python repro.py"}, m) for m in missing])) == []


def test_six_seven_and_eight_call_cycles_fire_one_round_early():
    for names in ("ABCDEF", "ABCDEFG", "ABCDEFGH"):
        k = len(names)
        assert kinds(conversation(user("go"), *_cycle(names, 4)[: 4 * k - 1])) == []
        found = eps(conversation(user("go"), *_cycle(names, 4)))
        assert [(e.type, e.turn, len(e.detail["cycle"])) for e in found] == [("tool_cycle", 4 * k, k)], names


def test_a_long_cycle_whose_results_change_is_progress():
    calls = [step(name, {"n": name}, f"{name} round {r}") for r in range(5) for name in "ABCDEF"]
    assert kinds(conversation(user("go"), *calls)) == []


NPM_FAILURE = """npm ERR! code ERESOLVE
npm ERR! ERESOLVE unable to resolve dependency tree
npm ERR! Found: react@18.2.0
npm ERR! Could not resolve dependency: peer react@"^17.0.0" from legacy-widget@1.4.0

npm ERR! A complete log of this run can be found in: /root/.npm/_logs/2026-11-24T01_05_{second:02d}_{ms:03d}Z-debug-0.log"""


def test_a_repeated_npm_failure_is_the_same_error_whatever_its_log_files_timestamp():
    calls = [step("bash", {"command": "npm install"}, NPM_FAILURE.format(second=i * 7, ms=i * 131)) for i in range(3)]
    found = eps(conversation(user("go"), *calls))
    assert [(e.number, e.type) for e in found] == [(1, "tool_error")]
    assert "_logs/…-debug-0.log" in found[0].detail["error"]


def test_a_usage_message_answering_each_malformed_call_is_one_error():
    calls = [step("bash", {"command": f"edit {i}"}, "Usage: edit <start_line>:<end_line>") for i in (12, 14, 15)]
    found = eps(conversation(user("go"), *calls))
    assert [(e.number, e.type) for e in found] == [(1, "tool_error")]
    assert len(found[0].detail["calls"]) == 3


def test_the_default_ladder_warns_at_the_third_and_fourth_identical_calls_and_stops_at_the_fifth():
    ladder = DetectConfig()
    assert kinds(conversation(user("go"), *same_calls(2)), ladder) == []
    assert kinds(conversation(user("go"), *same_calls(3)), ladder) == [(1, "tool_call")]
    found = eps(conversation(user("go"), *same_calls(5)), ladder)
    assert [(e.number, e.type, e.is_stop) for e in found] == [
        (1, "tool_call", False), (2, "tool_call", False), (3, "tool_call", True)]
    # a cycle of two on its 6th call, as SPEC §5 scales it
    cycle = [step(name, {"path": "a.py"}, "same") for _ in range(3) for name in ("open", "search")]
    assert kinds(conversation(user("go"), *cycle[:5]), ladder) == []
    assert kinds(conversation(user("go"), *cycle), ladder) == [(1, "tool_cycle")]


# The `reply` rule: the same reply turn after turn, whatever answered it.

QUESTION = "Which of the {} config files should I change first? Tell me before I go on, please."


def asked(times: int, nudge: str = "continue") -> list[dict]:
    """The model asks the same question (its count changing), and the harness nudges it on each time."""
    return [part for n in range(times) for part in (assistant(QUESTION.format(n + 3)), user(nudge))][:-1]


def test_the_same_reply_turn_after_turn_is_a_reply_loop_numbers_aside():
    # The person's prompt opens the task; the harness's first nudge opens another, which its repeats continue:
    # the 2nd to 4th questions are 3 consecutive turns of that task.
    assert kinds(conversation(user("tidy the config"), *asked(3)), DetectConfig()) == []
    found = eps(conversation(user("tidy the config"), *asked(4)), DetectConfig())
    assert [(e.number, e.type) for e in found] == [(1, "reply")]
    assert found[0].detail == {"reply": excerpt(QUESTION.format(6), 200), "repeats": 3, "strength": "weak"}
    assert warning_text(found[0]).startswith("[loopwarden] Loop detected (1/2): you gave the same reply 3 times")
    # The same reply is weak evidence: it warns past the warnings allowed, and never stops the task alone.
    assert [(e.type, e.is_stop) for e in eps(conversation(user("tidy"), *asked(7)), DetectConfig())] == [
        ("reply", False), ("reply", False), ("reply", False), ("reply", False)]


def test_replies_that_say_different_things_or_are_broken_by_an_action_are_no_loop():
    different = [part for text in ("Reading the file.", "Fixing the bug.", "Running the tests.", "Done, all green.")
                 for part in (assistant(text), user("continue"))]
    assert kinds(conversation(user("go"), *different), DetectConfig()) == []
    questions = asked(4)
    broken = questions[:4] + [step("read_file", {"path": "a.toml"}, "x = 1")] + questions[4:]
    assert kinds(conversation(user("go"), *broken), DetectConfig()) == []


def test_a_react_paper_agent_repeating_a_lookup_is_warned_at_the_third():
    turns = [part for n in range(1, 4) for part in (
        assistant(f"Thought {n}: I should look her up again.\nAction {n}: Lookup[Cher]"),
        user(f"Observation {n}: No more results."))]
    found = eps(conversation(user("Claim: Cher is Cher's eighteenth orchestra."), *turns), DetectConfig())
    assert found and found[0].type in ("tool_call", "tool_error") and found[0].detail["tool"] == "Lookup"


def test_aiders_ok_after_the_run_it_records_is_not_a_model_turn():
    """Aider records a test run as `I ran this command: … And got this output: …` and its own `Ok.`: neither
    is the model's turn, so the warnings of a loop come one request at a time."""
    from proxy.detect.engine import analyze as fold

    run = user("I ran this command:\n\npytest -q\n\nAnd got this output:\n\nFAILED tests/test_a.py::test_x\n"
               "1 failed in 0.02s\n")
    messages = conversation(user("fix the test"), step("read_file", {"path": "a.py"}, "x = 1"), run,
                            assistant("Ok."), step("read_file", {"path": "b.py"}, "y = 2"))
    state, _ = fold(DetectConfig(), neutral(messages))
    assert state.turns == 2  # the two reads; Aider's `Ok.` is not a turn


LADDER_OF_THREE = DetectConfig()


def test_identical_calls_whose_result_comes_back_to_an_earlier_one_are_still_the_same_loop():
    # Cursor's codebase search issued again and again, its ranking jittering between two orders.
    first, second = "| src/start.ts | L1-19 |\n| src/delete.ts | L122-128 |", "| src/delete.ts | L122-128 |\n| src/start.ts | L1-19 |"
    search = {"query": "session start command implementation"}
    calls = [step("codebase_search", search, result) for result in (first, second, second, first)]
    assert kinds(conversation(user("fix this error"), *calls[:3]), LADDER_OF_THREE) == []
    (found,) = eps(conversation(user("fix this error"), *calls), LADDER_OF_THREE)
    assert (found.type, found.detail["tool"]) == ("tool_call", "codebase_search")
    # A poll whose every answer is new is still progress.
    polls = [step("job_status", {"id": 7}, f"{10 * i}% done") for i in range(6)]
    assert kinds(conversation(user("wait for the job"), *polls), LADDER_OF_THREE) == []


def test_the_same_negative_answer_to_different_lookups_four_times_in_a_row_is_tool_error():
    # The ReAct FEVER agent looking up one title in other words, on a page where nothing matches. (Keywords that
    # share nothing, each finding nothing, are a search at work: tests/test_precision.py.)
    lookups = [step("Lookup", {"keyword": k}, "No more results.") for k in (
        "The Dark Tower (2017 film)", "The Dark Tower (series)", "The Dark Tower: The Gunslinger",
        "The Dark Tower (comics)")]
    assert kinds(conversation(user("Claim: The Dark Tower is a fantasy film."), *lookups[:3]), LADDER_OF_THREE) == []
    (found,) = eps(conversation(user("Claim: The Dark Tower is a fantasy film."), *lookups), LADDER_OF_THREE)
    assert (found.type, found.detail["repeats"], found.detail["error"]) == ("tool_error", 4, "No more results.")


def test_a_negative_answer_told_by_its_end_is_one_whatever_its_first_sentence():
    # The answer is negative by its end; it is told by its first sentence, which alone says too little to be an
    # error of its own: it is still the same negative answer, four different calls in a row.
    clicks = [step("click", {"index": i}, f"Page scrolled. Element with index {i} not found")
              for i in (1260, 1261, 1262, 1263)]
    assert kinds(conversation(user("Order the iPad."), *clicks[:3]), LADDER_OF_THREE) == []
    (found,) = eps(conversation(user("Order the iPad."), *clicks), LADDER_OF_THREE)
    assert (found.type, found.detail["repeats"]) == ("tool_error", 4)


def test_searches_that_echo_their_query_in_the_same_failure_are_one_error():
    # The ReAct HotPotQA agent rewording one search; each answer echoes the query and suggests other titles.
    queries = ["famous bhavageete by Arun Date", "famous bhavageete by Arun Date in India",
               "famous Marathi bhavageete by Arun Date", "famous Marathi songs by Arun Date"]
    searches = [step("Search", {"entity": q}, f"Could not find [{q}]. Similar: ['Indian folk music', '{q[:6]}']")
                for q in queries]
    (found,) = eps(conversation(user("Question: which song?"), *searches), LADDER_OF_THREE)
    assert found.type == "tool_error" and found.detail["error"] == "Could not find […]."
    # Three searches that find nothing, then one that finds something, is a search at work.
    found_it = step("Search", {"entity": "Arun Date"}, "Arun Date was a Marathi singer of bhavageete.")
    assert kinds(conversation(user("Question: which song?"), *searches[:3], found_it), LADDER_OF_THREE) == []


def test_one_tool_failing_alike_for_different_calls_with_other_steps_between_is_tool_error():
    # A shell tool whose commands differ, answered by the same failure, with reads between.
    refused = "Error: connection to server at \"db\" (172.18.0.2), port 5432 failed: Connection refused"
    run = [step("bash", {"command": c}, refused) for c in ("python manage.py migrate",
                                                          "python manage.py migrate --noinput",
                                                          "DJANGO_SETTINGS_MODULE=app.settings python manage.py migrate",
                                                          "python manage.py migrate app",
                                                          "python3 manage.py migrate",
                                                          "python manage.py migrate --plan")]
    read = step("read_file", {"path": "settings.py"}, "DATABASES = {...}")
    history = [run[0], read, run[1], read, run[2], run[3], run[4], run[5]]
    # Different calls meeting one error are weak evidence: one more than the threshold, the 4th such call.
    found = eps(conversation(user("set up the database"), *history[:5]), LADDER_OF_THREE)
    assert found == []
    found = eps(conversation(user("set up the database"), *history), LADDER_OF_THREE)
    assert [(e.number, e.type, e.turn, e.detail["strength"]) for e in found][:1] == [(1, "tool_error", 6, "weak")]
    assert [c["arguments"] for c in found[0].detail["calls"]][0] == '{"command":"python manage.py migrate"}'
    # The ladder of five waits for five such calls (its threshold already asks more than one more).
    five = eps(conversation(user("set up the database"), *history[:6]), DEFAULT)
    assert five == []
    five = eps(conversation(user("set up the database"), *history), DEFAULT)
    assert [(e.type, e.turn) for e in five][:1] == [("tool_error", 7)]
    # Different failures of one tool are debugging, not a loop.
    moving = [step("bash", {"command": f"pytest -k t{i}"}, f"Error: test t{i} failed: assert {i} == 0")
              for i in range(5)]
    assert kinds(conversation(user("fix the tests"), *moving), LADDER_OF_THREE) == []


def _grown_and_first_seen(messages):
    """The task's start and key, for the conversation grown one turn at a time through the cache, and for the
    same conversation seen first whole (a restarted proxy, another replica)."""
    config, cache, grown = DetectConfig(), None, None
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"] + [len(messages)]
    for end in turns:
        grown, cache = analyze(config, messages[:end], cache=cache)
    first, _ = analyze(config, messages)
    return (grown.start, grown.key), (first.start, first.key)


def test_a_long_conversation_has_the_same_task_start_and_key_seen_first_or_grown():
    text_agent = conversation(user("Question: which county is the Sears Tower in?"))
    for n in range(600):  # 2 + 1,200 messages: a ReAct agent's action and the harness's observation
        text_agent += [assistant(f"Thought: look up part {n}.\nAction: lookup\nAction Input: {{\"page\": {n}}}"),
                       user(f"Observation: page {n} of the building's history, nothing about the county.")]
    grown, first = _grown_and_first_seen(text_agent)
    assert grown == first and grown[0] == 2
    native = conversation(user("Read every part of the report."))
    for n in range(600):
        native += step("read_file", {"path": f"report/part{n}.md"}, f"part {n}: figures for week {n}")
    grown, first = _grown_and_first_seen(native)
    assert grown == first and grown[0] == 2
