"""The tool tracker on its own: streaks, cycles, results that change, errors, exempt calls."""

from __future__ import annotations

from proxy.detect.tools import Call, ToolTracker


def add_all(tracker: ToolTracker, calls: list[Call], threshold: int = 5) -> list[list[str]]:
    return [[f.type for f in tracker.add(call, threshold)] for call in calls]


def test_the_fifth_identical_call_with_the_same_result_is_a_loop():
    found = add_all(ToolTracker(), [Call("ls", "{}", "a.py") for _ in range(6)])
    assert found == [[], [], [], [], ["tool_call"], ["tool_call"]]


def test_a_result_that_changes_restarts_the_streak_until_three_times_the_threshold():
    found = add_all(ToolTracker(), [Call("poll", "{}", f"progress {i}%") for i in range(15)])
    assert found[:14] == [[]] * 14 and found[14] == ["tool_call"]


def test_two_calls_in_turn_are_a_cycle_on_the_tenth():
    calls = [Call("read", '{"p":1}', "x") if i % 2 == 0 else Call("run", "{}", "1 failed") for i in range(10)]
    found = add_all(ToolTracker(), calls)
    assert found[:9] == [[]] * 9 and found[9] == ["tool_cycle"]


def test_the_same_error_three_times_whatever_came_between():
    tracker = ToolTracker()
    failing = Call("run_tests", "{}", "Error: 2 failed", "Error: 2 failed")
    found = add_all(tracker, [failing, Call("read", '{"p":1}', "x"), failing, Call("read", '{"p":2}', "y"), failing])
    assert found == [[], [], [], [], ["tool_error"]]


def test_an_exempt_call_breaks_every_streak():
    tracker = ToolTracker()
    assert add_all(tracker, [Call("ls", "{}", "a.py") for _ in range(4)]) == [[]] * 4
    tracker.skip()
    assert add_all(tracker, [Call("ls", "{}", "a.py") for _ in range(4)]) == [[]] * 4


def test_a_clone_goes_on_alone():
    tracker = ToolTracker()
    add_all(tracker, [Call("ls", "{}", "a.py") for _ in range(4)])
    other = tracker.clone()
    assert add_all(other, [Call("ls", "{}", "a.py")]) == [["tool_call"]]
    assert add_all(tracker, [Call("cat", "{}", "b")]) == [[]]
