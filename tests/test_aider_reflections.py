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
