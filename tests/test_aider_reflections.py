"""aider's own loops, in the messages its versions send: its reflected messages are user messages. The same
failed-match report after the same SEARCH/REPLACE block until its `Only 3 reflections allowed, stopping.`, and the
same lint error reported after each edit (`# Fix any errors below, if possible.`, from its `lint_edited`)."""

from __future__ import annotations

from proxy.detect.engine import DetectConfig, episodes
from proxy.detect.text_steps import is_observation
from tests.convo import analyze, assistant, conversation, user

DEFAULT = DetectConfig()

LINT = """# Fix any errors below, if possible.

## Running: /usr/bin/python3 -m flake8 --select=E9,F821,F823,F831,F406,F407,F701,F702,F704,F706 --show-source --isolated app/stats.py

app/stats.py:12:12: F821 undefined name 'np'
    return np.mean(values)
           ^

## See relevant line below marked with █.

app/stats.py:
...⋮...
  9│def mean(values):
 10│    if not values:
 11│        return 0.0
 12█    return np.mean(values)
"""


def edit(search: str, replace: str) -> dict:
    return assistant(f"I'll fix the mean function.\n\napp/stats.py\n```python\n<<<<<<< SEARCH\n{search}=======\n"
                     f"{replace}>>>>>>> REPLACE\n```")


def test_aiders_lint_report_is_its_harness_answering_the_edit():
    assert is_observation(LINT)


def test_the_same_edit_answered_by_the_same_lint_error_is_a_loop_within_one_request():
    # The lint report is the harness's answer: the person's request is one task however many edits it takes.
    parts = [user("Use numpy for the mean in app/stats.py.")]
    for _ in range(3):
        parts += [edit("    return sum(values) / len(values)\n", "    return np.mean(values)\n"), user(LINT)]
    state, _ = analyze(DEFAULT, conversation(*parts))
    assert state.start == 2 and [e.type for e in episodes(DEFAULT, state)] == ["tool_call"]


def test_the_same_block_failing_to_match_until_aider_stops_reflecting_is_warned():
    search, replace = "def mean(values):\n    return sum(values)/len(values)\n", "def mean(values):\n    return 0\n"
    report = ("# 1 SEARCH/REPLACE block failed to match!\n\n## SearchReplaceNoExactMatch: This SEARCH block failed "
              "to exactly match lines in app/stats.py\n<<<<<<< SEARCH\n" + search + "=======\n" + replace +
              ">>>>>>> REPLACE\n\nThe SEARCH section must exactly match an existing block of lines including all "
              "white space, comments, indentation, docstrings, etc\n")
    parts = [user("Make mean return 0 for now.")]
    for _ in range(4):  # the first answer and aider's three reflections
        parts += [edit(search, replace), user(report)]
    state, _ = analyze(DEFAULT, conversation(*parts[:-1]))
    assert [e.type for e in episodes(DEFAULT, state)][:1] in (["tool_call"], ["tool_error"])


def lint_after(line: str) -> str:
    """aider's lint report for app/stats.py whose line 12 now reads `line`: the same finding, the code it quotes
    after it as the edit left it."""
    return ("# Fix any errors below, if possible.\n\n## Running: /usr/bin/python3 -m flake8 "
            "--select=E9,F821,F823,F831,F406,F407,F701,F702,F704,F706 --show-source --isolated app/stats.py\n\n"
            f"app/stats.py:12:12: F821 undefined name 'np'\n{line}\n           ^\n\n"
            "## See relevant line below marked with █.\n\napp/stats.py:\n...⋮...\n  9│def mean(values):\n"
            f" 10│    if not values:\n 11│        return 0.0\n 12█{line}\n")


# Each edit a different way to call numpy, none adding the import: the linter's finding is the same after each.
TRIES = ["    return np.mean(values)", "    return np.average(values)", "    return float(np.mean(values))",
         "    return np.nanmean(values)"]


def test_different_edits_each_answered_by_the_same_lint_finding_are_a_loop():
    parts = [user("Use numpy for the mean in app/stats.py.")]
    before = "    return sum(values) / len(values)"
    for line in TRIES:
        parts += [edit(before + "\n", line + "\n"), user(lint_after(line))]
        before = line
    state, _ = analyze(DEFAULT, conversation(*parts))
    found = episodes(DEFAULT, state)
    assert [e.type for e in found][:1] == ["tool_error"] and not any(e.is_stop for e in found)  # weak: warned


def test_edits_whose_lint_findings_change_are_work_going_on():
    parts = [user("Use numpy for the mean in app/stats.py.")]
    findings = ["F821 undefined name 'np'", "F401 'numpy' imported but unused", "E999 SyntaxError: invalid syntax",
                "F841 local variable 'total' is assigned to but never used"]
    before = "    return sum(values) / len(values)"
    for line, finding in zip(TRIES, findings):
        report = lint_after(line).replace("F821 undefined name 'np'", finding)
        parts += [edit(before + "\n", line + "\n"), user(report)]
        before = line
    state, _ = analyze(DEFAULT, conversation(*parts))
    assert episodes(DEFAULT, state) == []
