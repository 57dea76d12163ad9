"""The ladder: what an episode comes to (a warning or the stop), by its rung and the strength of its evidence.

The one table a precision change touches. Evidence is `strong` (the same call with the same result, an edit
re-applied, the same call failing the same way, a cycle, chanting), `weak` (different calls meeting the same
error, the same reply turn after turn) or `judged` (the judge's verdict, which a person turned on). Episodes
1..MAX_WARNINGS warn whatever their evidence; past them strong and judged evidence stops the task, and weak
evidence warns again unless the judge has agreed in the same task: weak evidence alone never stops a task.
Pure code, no I/O.
"""

from __future__ import annotations

STRONG = "strong"
WEAK = "weak"
JUDGED = "judged"
STRENGTHS = (STRONG, WEAK, JUDGED)

# Past the warnings, whether an episode of this strength stops the task: (strength, the judge agreed) -> stop.
STOPS = {
    (STRONG, False): True, (STRONG, True): True,
    (JUDGED, False): True, (JUDGED, True): True,
    (WEAK, False): False, (WEAK, True): True,
}


def stops(number: int, limit: int, strength: str, judge_agreed: bool = False) -> bool:
    """Whether episode `number` of a task (MAX_WARNINGS `limit`) is its stop."""
    return number > limit and STOPS[strength, judge_agreed]


def last_warning(number: int, limit: int, strength: str) -> bool:
    """Whether a warning may say it is the last: the next episode would stop, if it repeats this evidence."""
    return number == limit and STOPS[strength, False]
