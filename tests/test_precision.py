"""Healthy runs that look like loops at first glance, and the loops next to them that must still be found.

Each healthy shape is written from what coding agents' harnesses answer (a shell's timeout message, a harness's
format error, a search finding nothing, a sandbox refusing a command, a poll of a running process); next to it,
the loop of the same look that stays a loop."""

from __future__ import annotations

from proxy.detect import steps
from proxy.detect.engine import DetectConfig, episodes
from tests.convo import analyze, assistant, conversation, step, user

LADDER = DetectConfig()  # the default ladder: threshold 3, two warnings, then the stop


def found(messages, config=LADDER):
    state, _ = analyze(config, messages)
    return [(e.type, e.is_stop) for e in episodes(config, state)]


# -- 1. a shell tool whose new commands each time out -----------------------------------------------------------

def timed_out(command: str, output: str = "") -> str:
    """mini-swe-agent's answer to a command its timeout killed (the command echoed in it)."""
    return (f"The last command <command>{command}</command> timed out and has been killed.\n"
            f"The output of the command was:\n<output>\n{output}</output>\n"
            "Please try another command and make sure to avoid those requiring interactive input.")


def ran(output: str, code: int = 0) -> str:
    return f"<returncode>{code}</returncode>\n<output>\n{output}</output>"


def bash(command: str, answer: str) -> list[dict]:
    return step("bash", {"command": command}, answer)


SOLVERS = [
    ("solve.py", "def solve(n):\n    return search(n, depth=0)\n"),
    ("solve_memo.py", "from functools import lru_cache\n@lru_cache(None)\ndef solve(n): ...\n"),
    ("solve_dp.py", "dp = [0] * (N + 1)\nfor i in range(1, N + 1): ...\n"),
    ("bench_eval.py", "for case in load_cases('cases/'):\n    check(case)\n"),
    ("solve_bfs.py", "from collections import deque\nqueue = deque([start])\n"),
]


def test_new_scripts_each_killed_by_the_timeout_with_work_between_are_exploration():
    run = [bash("ls", ran("README.md\ncases\nproblem.txt\n")), bash("cat problem.txt", ran("Count the paths...\n"))]
    for script, source in SOLVERS:
        run += [bash(f"cat > {script} <<'EOF'\n{source}EOF", ran("")),
                bash(f"cd /app && python {script} < cases/big.in", timed_out(f"cd /app && python {script} "
                                                                             "< cases/big.in"))]
    run += [bash("python solve_bfs.py --limit 1000 < cases/small.in", ran("42\n"))]
    assert found(conversation(user("Solve the task in problem.txt; print the answer."), *run)) == []


def test_the_same_script_timing_out_again_after_edits_is_still_a_loop():
    run = []
    for i in range(3):
        run += [bash(f"sed -i 's/depth={i}/depth={i + 1}/' solve.py", ran("")),
                bash("python solve.py < cases/big.in", timed_out("python solve.py < cases/big.in"))]
    assert found(conversation(user("Solve the task in problem.txt."), *run)) == [("tool_error", False)]


# -- 2. a harness's format error recurring far apart ------------------------------------------------------------

FORMAT_ERROR = """Please always provide EXACTLY ONE action in triple backticks, found {} actions.

Please format your action in triple backticks as shown in <response_example>.

<response_example>
Here are some thoughts about why you want to perform the action.

```bash
<action>
```
</response_example>

If you have completed your assignment, please consult the first message about how to
submit your solution (you will not be able to continue working on this task after that)."""


def acted(thought: str, *commands: str) -> dict:
    """mini-swe-agent's model, acting in text: a thought and its fenced command(s)."""
    return assistant(f"THOUGHT: {thought}\n\n" + "\n\n".join(f"```bash\n{c}\n```" for c in commands))


def observed(output: str, code: int = 0) -> dict:
    return user(f"<returncode>{code}</returncode>\n<output>\n{output}</output>")


def text_run(steps: int, rejected_at: dict[int, tuple[str, ...]]) -> list[dict]:
    """A mini-swe-agent run in text: `steps` commands that work, and at the given steps a message with several
    commands, which the harness rejects before the model sends one."""
    run: list[dict] = []
    for n in range(steps):
        if n in rejected_at:
            commands = rejected_at[n]
            run += [acted("Let me look at both places at once.", *commands),
                    user(FORMAT_ERROR.format(len(commands)))]
        run += [acted(f"Step {n}: read the next part of the module.", f"cd /testbed && sed -n '{n * 40 + 1},"
                                                                         f"{n * 40 + 40}p' astropy/io/fits/card.py"),
                observed("".join(f"    line {n * 40 + k} of card.py\n" for k in range(1, 6)))]
    return run


PR = "<pr_description>\nCard.value loses precision for floats such as 0.009125.\n</pr_description>"


def test_a_format_error_recurring_far_apart_with_work_between_is_no_loop():
    # Each rejected message ends with a command of a kind the run has made before (reading card.py).
    run = text_run(45, {8: ("cd /testbed && grep -n '_format_float' astropy/io/fits/card.py",
                            "cd /testbed && sed -n '1290,1310p' astropy/io/fits/card.py"),
                        23: ("cd /testbed && python reproduce.py",
                             "cd /testbed && sed -n '1,40p' astropy/io/fits/card.py"),
                        37: ("cd /testbed && sed -n '1,20p' reproduce.py", "cd /testbed && python reproduce.py",
                             "cd /testbed && sed -n '41,80p' astropy/io/fits/card.py")})
    assert found(conversation(user(PR), *run)) == []


def test_a_format_error_answering_steps_back_to_back_is_still_a_loop():
    rejected = {n: ("cd /testbed && python reproduce.py", f"cd /testbed && sed -n '{n},{n + 9}p' card.py")
                for n in (5, 6, 7)}
    run = text_run(5, {}) + [
        turn for n in (5, 6, 7) for turn in (acted("Both again.", *rejected[n]), user(FORMAT_ERROR.format(2)))]
    assert [kind for kind, _ in found(conversation(user(PR), *run))] == ["tool_error"]


def test_a_format_error_every_other_reply_each_followed_by_a_valid_step_is_no_loop():
    # Gemini 3 Pro in mini-swe-agent: two blocks (a code excerpt quoted, then the command) every few replies; the
    # next reply sends the command alone and the work goes on. The rejected messages start alike.
    run = text_run(16, {n: ("cd /testbed && python reproduce.py", f"cd /testbed && sed -n '{n},{n + 9}p' card.py")
                        for n in range(2, 16, 2)})
    assert found(conversation(user(PR), *run)) == []


# -- 3. searches with a new pattern each time, finding nothing --------------------------------------------------

def test_searches_with_new_patterns_finding_nothing_are_a_search_at_work():
    nothing = "No files found"
    run = [step("glob", {"pattern": pattern}, nothing) for pattern in (
        "**/bunfig.toml", "**/tsconfig*.json", "**/*.{yml,yaml}", "**/vitest.config.*", "**/.env*")]
    run += [step("grep", {"pattern": "preload", "include": include}, nothing) for include in ("*.toml", "*.json",
                                                                                              "*.ts", "*.md")]
    run += [step("glob", {"pattern": "**/package.json"}, "/repo/package.json\n/repo/packages/cli/package.json"),
            step("read", {"filePath": "/repo/package.json"},
                 '{\n  "name": "cli",\n  "scripts": {"test": "bun test"}\n}')]
    assert found(conversation(user("Where is the test preload configured?"), *run)) == []


def test_the_same_search_finding_nothing_again_and_again_is_still_a_loop():
    run = [step("glob", {"pattern": "**/bunfig.toml"}, "No files found") for _ in range(3)]
    assert [kind for kind, _ in found(conversation(user("Find bunfig.toml"), *run))] == ["tool_call"]



# -- 4. an edit tool's informational output read as an error --------------------------------------------------

WATCH_PROMPT = (
    'I\'ve written your instructions in comments in the code and marked them with "ai"\n'
    'You can see the "AI" comments shown below (marked with \u2588).\n'
    "Find them in the code files I've shared with you, and follow their instructions.\n\n"
    'After completing those instructions, also be sure to remove all the "AI" comments from the code too.\n\n'
    "src/pricing.py:\n\u2502def total(items):\n\u2588    # round to cents AI!\n"
    "\u2502    return sum(i.price for i in items)\n")
WATCH_EDITS = [("    # round to cents AI!\n    return sum(i.price for i in items)",
                "    return round(sum(i.price for i in items), 2)"),
               ("    # apply the discount AI!\n    return subtotal", "    return subtotal * (1 - discount)"),
               ("    # add the tax AI!\n    return net", "    return net * (1 + TAX_RATE)"),
               ("    # log the order AI!\n    save(order)", "    log.info('order %s', order.id)\n    save(order)")]


def aider_edit(search: str, replace: str) -> dict:
    return assistant("Done as the comment asks.\n\nsrc/pricing.py\n```python\n<<<<<<< SEARCH\n"
                     f"{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```")


def test_aider_watch_modes_note_after_each_applied_edit_is_no_error():
    run = [user(WATCH_PROMPT)]
    for search, replace in WATCH_EDITS:
        run += [aider_edit(search, replace), user("Applied edit to src/pricing.py\nProcessing your request...")]
    run.append(assistant("All four AI comments are done and removed."))
    assert found(conversation(*run)) == []


def test_the_same_edit_failing_to_match_again_and_again_is_still_a_loop():
    failed = ("# 1 SEARCH/REPLACE block failed to match!\n\n## SearchReplaceNoExactMatch: This SEARCH block failed "
              "to exactly match lines in src/pricing.py\n<<<<<<< SEARCH\n    return total\n=======\n"
              "    return round(total, 2)\n>>>>>>> REPLACE\n\nThe SEARCH section must exactly match an existing "
              "block of lines including all white space, comments, indentation, docstrings, etc\n")
    run = [user("Round the total to cents in src/pricing.py")]
    for _ in range(3):
        run += [aider_edit("    return total", "    return round(total, 2)"), user(failed)]
    assert [kind for kind, _ in found(conversation(*run))] == ["tool_call"]

# -- 5. a sandbox that refuses every command while the agent works around it ------------------------------------

SANDBOX_REFUSED = ("Exit code: 1\nWall time: 0 seconds\nOutput:\n"
                   "bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted\n")


def shell(script: str, answer: str, escalated: bool = False) -> list[dict]:
    """Codex CLI's `shell` tool; rerun outside the sandbox with escalated permissions."""
    arguments = {"command": ["bash", "-lc", script], "workdir": "/home/dev/ledger", "timeout_ms": 120000}
    if escalated:
        arguments |= {"with_escalated_permissions": True,
                      "justification": "The sandbox fails to start here; I need to read the repository."}
    return step("shell", arguments, answer)


def ok(output: str) -> str:
    return f"Exit code: 0\nWall time: 0.1 seconds\nOutput:\n{output}"


def test_a_sandbox_refusing_each_new_command_while_the_agent_reruns_them_escalated_is_no_loop():
    run = []
    for script, output in (("sed -n '1,200p' src/ledger.rs", "pub struct Ledger {\n    entries: Vec<Entry>,\n}\n"),
                           ("find . -name '*.rs' -not -path './target/*'", "./src/ledger.rs\n./src/main.rs\n"),
                           ("git status --short", " M src/ledger.rs\n"),
                           ("rg -n 'fn balance' src", "src/ledger.rs:42:    pub fn balance(&self) -> i64 {\n"),
                           ("sed -n '30,80p' src/ledger.rs", "    pub fn balance(&self) -> i64 {\n"),
                           ("cargo test --quiet", "test result: ok. 12 passed; 0 failed\n")):
        run += [shell(script, SANDBOX_REFUSED), shell(script, ok(output), escalated=True)]
    assert found(conversation(user("Fix the balance rounding in the ledger."), *run)) == []


def test_the_same_command_refused_again_and_again_is_still_a_loop():
    run = [shell("cargo test --quiet", SANDBOX_REFUSED) for _ in range(3)]
    assert [kind for kind, _ in found(conversation(user("Run the tests."), *run))] == ["tool_call"]


# -- 6. a poll whose tool name sounds like an edit -------------------------------------------------------------

def unified_exec(output: str, running: bool = True) -> str:
    state = "Process running with session ID 7" if running else "Process exited with code 1"
    return f"Chunk ID: 9c41e2\nWall time: 30.0021 seconds\n{state}\nOriginal token count: 12\nOutput:\n{output}"


def test_polling_a_growing_test_run_with_write_stdin_is_no_edit_reapplied():
    poll = {"session_id": 7, "chars": "", "yield_time_ms": 30000}
    run = [step("exec_command", {"cmd": "pytest -q tests", "yield_time_ms": 10000}, unified_exec(""))]
    for output in ("..........", "..........F", "....................", "..........s.........", ".........."):
        run += [step("write_stdin", poll, unified_exec(output))]
    run += [step("write_stdin", poll, unified_exec("FAILED tests/test_api.py::test_paging - assert 3 == 2\n"
                                                   "1 failed, 57 passed in 151.20s", running=False))]
    assert found(conversation(user("Run the test suite and fix what fails."), *run)) == []


def test_the_same_patch_applied_again_and_again_is_still_a_loop():
    patch = ("*** Begin Patch\n*** Update File: src/api.py\n@@\n-    page = 2\n+    page = 3\n*** End Patch\n")
    run = [step("apply_patch", {"input": patch}, f"Success. Updated the following files:\nM src/api.py\n{i}")
           for i in range(3)]
    assert [kind for kind, _ in found(conversation(user("Fix paging."), *run))] == ["tool_call"]


# -- evidence strength: weak evidence warns, and stops only with strong evidence or the judge's agreement ---------

from proxy.detect.engine import Decision  # noqa: E402
from proxy.detect.judge_policy import JudgeCheck  # noqa: E402
from proxy.detect.texts import warning_text  # noqa: E402

UNKNOWN_TOOL = "Error: tool 'search_code' does not exist. Available tools: read_file, edit, run_tests."
QUERIES = ("parser", "Parser class", "def parse", "parse(", "tokenize", "Lexer", "grammar", "ast node")


def unknown_tool_calls():
    return [step("search_code", {"query": q}, UNKNOWN_TOOL) for q in QUERIES]


def test_different_calls_meeting_one_error_warn_on_and_never_stop_alone():
    messages = conversation(user("Fix the parser bug."), *unknown_tool_calls())
    state, _ = analyze(LADDER, messages)
    found = episodes(LADDER, state)
    assert [(e.number, e.type, e.detail["strength"], e.is_stop) for e in found] == [
        (n, "tool_error", "weak", False) for n in range(1, 7)]
    assert Decision(found).stop is None
    # Its warnings never promise a stop that will not come.
    assert "last warning" not in warning_text(found[1])


def test_weak_evidence_stops_with_the_judges_agreement():
    messages = conversation(user("Fix the parser bug."), *unknown_tool_calls())
    state, _ = analyze(LADDER, messages)
    agreed = JudgeCheck(state.key, 2, 0.95, analysis="asks for a tool that does not exist, again and again")
    found = episodes(LADDER, state, judge_checks=[agreed])
    assert [(e.type, e.is_stop) for e in found][:4] == [
        ("tool_error", False), ("tool_error", False), ("tool_error", True), ("tool_error", True)]


def test_a_stop_needs_strong_evidence_and_the_strong_one_names_it():
    failing = "FAILED tests/test_calc.py::test_add - assert -1 == 5\n1 failed, 11 passed in 0.05s"
    run = unknown_tool_calls()[:4] + [step("run_tests", {"path": "tests/test_calc.py"}, failing) for _ in range(3)]
    state, _ = analyze(LADDER, conversation(user("Fix the parser bug."), *run))
    found = episodes(LADDER, state)
    assert [(e.type, e.detail["strength"], e.is_stop) for e in found] == [
        ("tool_error", "weak", False), ("tool_error", "weak", False), ("tool_error", "strong", True)]
    assert "last warning" in warning_text(episodes(LADDER, analyze(LADDER, conversation(
        user("go"), *[step("run_tests", {}, failing) for _ in range(4)]))[0])[1])


# -- a sandboxed shell's frame is no part of the failure ----------------------------------------------------------

def openhands_run(failure: str) -> str:
    """OpenHands' execute_bash answer to a unittest run: a warning the environment prints first, the test's output,
    then the lines its sandbox ends every result with."""
    return ("/opt/miniconda3/envs/testbed/lib/python3.12/site-packages/botocore/auth.py:424: DeprecationWarning: "
            "datetime.datetime.utcnow() is deprecated\n  datetime_now = datetime.datetime.utcnow()\n"
            + "." * 3 + "F\n" + "=" * 70 + "\nFAIL: test_moto_matches_none_with_exists_filter (__main__.TestFilter)\n"
            + "-" * 70 + "\nTraceback (most recent call last):\n  File \"/workspace/getmoto__moto__3.1/reproduce.py\", "
            "line 41, in test_moto_matches_none_with_exists_filter\n    self.assertEqual(expected, actual)\n"
            f"AssertionError: Lists differ\n\n{failure}\n\n" + "-" * 70 + "\nRan 1 test in 0.209s\n\n"
            "FAILED (failures=1)[Python Interpreter: /opt/miniconda3/envs/testbed/bin/python]\n"
            "root@openhands-workspace:/workspace/getmoto__moto__3.1 # \n[Command finished with exit code 1]")


def test_a_test_rerun_whose_failure_changes_each_time_is_work_going_on_however_long_the_frame():
    command = {"command": "cd /workspace/getmoto__moto__3.1 && python3 reproduce.py -k test_moto_matches_none"}
    failures = ["First differing element 4:\n{'bar': '123'}\n{'foo': [], 'bar': '123'}",
                "First list contains 1 additional elements.\nFirst extra element 5:\n{'bar': '123'}",
                "First list contains 1 additional elements.\nFirst extra element 4:\n{'bar': '123'}",
                "First differing element 3:\n{'foo': False}\n{'foo': None, 'bar': '123'}",
                "Second list contains 1 additional elements.\nFirst extra element 5:\n{'foo': [], 'bar': '123'}"]
    run = []
    for n, failure in enumerate(failures):
        run += [step("str_replace_editor", {"command": "str_replace", "path": "/workspace/moto/dynamodb/utils.py",
                                            "old_str": f"key = sort_{n}", "new_str": f"key = sort_{n + 1}"},
                     "The file /workspace/moto/dynamodb/utils.py has been edited."),
                step("execute_bash", command, openhands_run(failure))]
    assert found(conversation(user("Fix the filter on attributes that exist."), *run)) == []


def test_the_same_failure_behind_the_frame_after_edits_that_change_nothing_is_still_a_loop():
    command = {"command": "cd /workspace/getmoto__moto__3.1 && python3 reproduce.py -k test_moto_matches_none"}
    failure = "First differing element 4:\n{'bar': '123'}\n{'foo': [], 'bar': '123'}"
    run = []
    for n in range(5):
        run += [step("str_replace_editor", {"command": "str_replace", "path": "/workspace/moto/dynamodb/utils.py",
                                            "old_str": f"# try {n}", "new_str": f"# try {n + 1}"},
                     "The file /workspace/moto/dynamodb/utils.py has been edited."),
                step("execute_bash", command, openhands_run(failure))]
    assert found(conversation(user("Fix the filter on attributes that exist."), *run)) == [
        ("tool_error", False), ("tool_error", False), ("tool_error", True)]


# -- variants of a failing call: weaker than one call failing alike ---------------------------------------------

REGEX_ERROR = ran("Traceback (most recent call last):\n"
                  "  File \"/testbed/test_regex.py\", line 4, in <module>\n    pattern = re.compile(regex_str)\n"
                  "  File \"/usr/lib/python3.9/sre_parse.py\", line 427, in _escape\n"
                  "    raise source.error(\"bad escape %s\" % escape, len(escape))\n"
                  "re.error: bad escape \\g at position 4\n", 1)


def regex_probe(literal: str) -> list[dict]:
    """An inline script written and run in one command, its regex written as `literal`."""
    return bash(f"cat <<EOF > test_regex.py\nimport re\nregex_str = {literal}\npattern = re.compile(regex_str)\n"
                "print(pattern)\nEOF\npython3 test_regex.py", REGEX_ERROR)


def test_a_variant_then_the_first_form_again_meeting_one_error_is_how_a_cause_is_found():
    # Gemini 3 in mini-swe-agent: a regex written one way, another, then the first again, each failing with one
    # error, before it sees that the shell ate its backslashes; then it goes on. Three different-or-returning
    # calls meeting one error are weak evidence: one more is needed.
    first, variant = "r'^src\\\\gen\\\\about\\\\.py$'", "'^src\\\\\\\\gen\\\\\\\\about\\\\\\\\.py$'"
    run = [bash("ls", ran("pylint\ntests\n")), regex_probe(first), regex_probe(variant), regex_probe(first)]
    assert found(conversation(user(PR), *run)) == []
    # A fourth variant meeting it is a loop: warned, as weak evidence never stopped.
    run.append(regex_probe("r'^src[\\\\]gen'"))
    state, _ = analyze(LADDER, conversation(user(PR), *run))
    assert [(e.type, e.detail["strength"], e.is_stop) for e in episodes(LADDER, state)] == [
        ("tool_error", "weak", False)]


def test_a_blind_retry_among_the_calls_one_error_meets_counts_at_the_threshold():
    # A customer-service agent: a call, then another date format, then that one again unchanged, each refused alike.
    error = "Error: '<' not supported between instances of 'str' and 'datetime.datetime'"
    order = {"id_cliente": "cliente_9001", "id_item": "item_0088", "cantidad_solicitada": 200}
    run = [step("register_order", {**order, "fecha_entrega": "2024-07-27 08:00"}, error),
           step("register_order", {**order, "fecha_entrega": "2024-07-27T08:00:00"}, error)]
    assert found(conversation(user("Register the order, please."), *run)) == []
    run.append(step("register_order", {**order, "fecha_entrega": "2024-07-27T08:00:00"}, error))
    assert found(conversation(user("Register the order, please."), *run)) == [("tool_error", False)]


MULTIPLE = ("ERROR:\nNo replacement was performed. Multiple occurrences of old_str `return pattern_type;` in lines "
            "[317, 449]. Please ensure it is unique.")


def test_an_edit_refused_for_the_text_it_replaces_is_the_same_call_whatever_it_would_write():
    # OpenHands: `str_replace` of a line that occurs twice, refused alike, with a new `new_str` each time and
    # views between: the refusal is about `old_str` alone, so it is the same call failing the same way (strong),
    # on every ladder.
    path = "/workspace/ponyc/src/libponyc/expr/match.c"
    run = []
    for n, fix in enumerate(("if(ast_id(t) == TK_ISO) t = alias(t);", "t = consume_type(t, TK_NONE);",
                             "if(is_iso(t)) t = set_cap(t, TK_TRN);")):
        run += [step("str_replace_editor", {"command": "view", "path": path, "view_range": [310 + n, 320]},
                     f"Here's the result of running `cat -n` on {path}:\n   317\t      return pattern_type;\n"),
                step("str_replace_editor", {"command": "str_replace", "path": path, "old_str": "return pattern_type;",
                                            "new_str": f"{fix}\n      return pattern_type;"}, MULTIPLE)]
    for config in (LADDER, DetectConfig(tool_call_threshold=5)):
        state, _ = analyze(config, conversation(user("Fix the aliasing of iso in match."), *run))
        assert [(e.type, e.detail["strength"]) for e in episodes(config, state)] == [("tool_error", "strong")]
    # Edits at different places, each refused for its own text, are no such call.
    moving = []
    for n in range(3):
        moving += [step("str_replace_editor", {"command": "str_replace", "path": path, "old_str": f"case TK_{n}:",
                                               "new_str": f"case TK_{n}: break;"},
                        f"ERROR:\nNo replacement was performed, old_str `case TK_{n}:` did not appear verbatim in "
                        f"{path}."),
                   step("str_replace_editor", {"command": "view", "path": path, "view_range": [300 + n, 320]},
                        f"Here's the result of running `cat -n` on {path}:\n   31{n}\t    case TK_X{n}:\n")]
    assert found(conversation(user("Fix the aliasing of iso in match."), *moving)) == []


def test_openhands_error_for_an_action_it_could_not_run_is_its_harness_not_a_new_task():
    # OpenHands answers an action it could not run with a user message ending in its own marker: the task goes on,
    # and a loop it completes is warned in that task.
    path = "/workspace/ponyc/src/libponyc/expr/match.c"
    run = [step("str_replace_editor", {"command": "str_replace", "path": path, "old_str": "return pattern_type;",
                                       "new_str": f"/* {n} */ return pattern_type;"}, MULTIPLE) for n in range(3)]
    harness = user("Parameter 'command' is expected to be one of ['view', 'create', 'str_replace', 'insert', "
                   "'undo_edit'].\n[Error occurred in processing last action]")
    before, _ = analyze(LADDER, conversation(user("Fix the aliasing of iso in match."), *run))
    state, _ = analyze(LADDER, conversation(user("Fix the aliasing of iso in match."), *run, harness))
    assert state.start == before.start and [e.type for e in episodes(LADDER, state)] == ["tool_error"]


# -- the same reproduction failing after edits that moved the failure -------------------------------------------

def raised(frames: tuple[int, int]) -> str:
    """A reproduction's traceback through the module being fixed; `frames`, the lines its two frames there name."""
    return ("Traceback (most recent call last):\n  File \"/testbed/reproduce_issue.py\", line 7, in <module>\n"
            "    message = cantools.database.can.Message(1, 'TestMessage', 4, [signal])\n"
            f"  File \"/testbed/src/cantools/database/can/message.py\", line {frames[0]}, in refresh\n"
            "    self._check_signal_tree(message_bits, self.signal_tree)\n"
            f"  File \"/testbed/src/cantools/database/can/message.py\", line {frames[1]}, in _check_signal\n"
            "    raise Error(f'The signal {signal.name} does not fit in message {self.name}.')\n"
            "cantools.database.errors.Error: The signal TestSignal does not fit in message TestMessage.\n")


def reproduce_after_edits(frames: list[tuple[int, int]]) -> list[dict]:
    run = []
    for n, lines in enumerate(frames):
        module = "/testbed/src/cantools/database/can/message.py"
        run += [step("str_replace_editor", {"command": "str_replace", "path": module,
                                            "old_str": f"        # check {n}", "new_str": f"        # check {n + 1}"},
                     f"The file {module} has been edited."),
                step("bash", {"command": "cd /testbed && python reproduce_issue.py"}, raised(lines))]
    return run


def test_the_same_failure_at_other_lines_after_each_edit_ran_other_code_and_is_no_loop():
    # SWE-agent: the reproduction raises the error it should (a signal too large for its message) after each
    # rewrite of the check; each rewrite moved the lines the traceback names in the module being fixed.
    moved = reproduce_after_edits([(1310, 1253), (1320, 1255), (1325, 1259), (1331, 1262)])
    assert found(conversation(user("Restore the signal size check."), *moved)) == []
    # The same failure at the same lines after edits that changed nothing it ran is still a loop.
    still = reproduce_after_edits([(1310, 1253)] * 3)
    assert found(conversation(user("Restore the signal size check."), *still)) == [("tool_error", False)]


# -- a terminal's transcript: the prompt echoing the command first ----------------------------------------------

def terminal(command: str, output: str) -> str:
    """Cursor's `run_terminal_cmd` answer: zsh's prompt with the command, the output, the prompt again."""
    return f"edobry@Mac minsky % {command}\n{output}\nedobry@Mac minsky % "


def cursor_run(command: str, output: str) -> list[dict]:
    return step("run_terminal_cmd", {"command": command}, terminal(command, output))


def test_an_error_after_a_terminals_echoed_prompt_is_read_as_the_error_it_is():
    assert steps.without_prompt_echo(terminal("minsky tasks list", "#011 TODO")) == "#011 TODO"
    failing = "Error starting session: The \"paths[0]\" property must be of type string, got undefined"
    # Cursor starting one session again and again, in other words each time, between reads: the same error.
    tries = ["minsky session start --task 011", "minsky session start --task '#011'",
             "minsky session start --task '#011' --repo /Users/edobry/Projects/minsky",
             "minsky session start --task '#011' --repo /Users/edobry/Projects/minsky",
             "minsky session start --task '#011' --repo $(git rev-parse --show-toplevel)"]
    run = []
    for n, command in enumerate(tries):
        run += [cursor_run(command, failing), cursor_run(f"minsky tasks get '#01{n}' --json",
                                                         f'{{"id": "#01{n}", "status": "TODO"}}')]
    state, _ = analyze(LADDER, conversation(user("continue working on task 011"), *run))
    assert [(e.type, e.detail["strength"], e.is_stop) for e in episodes(LADDER, state)] == [
        ("tool_error", "weak", False)]
    # The same commands answering what each asked are work going on, echoed prompts and all.
    moving = [cursor_run(command, f"Session task#01{n} started in /tmp/s{n}") for n, command in enumerate(tries)]
    assert found(conversation(user("continue working on task 011"), *moving)) == []
