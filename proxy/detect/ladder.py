"""The ladder: what an episode comes to (a warning or the stop), by its rung and the strength of its evidence.

The one table a precision change touches. Evidence is `strong` (the same call with the same result, an edit
re-applied, the same call failing the same way, a cycle, chanting), `weak` (different calls meeting the same
error, the same reply turn after turn) or `judged` (the judge's verdict, which a person turned on). Episodes
1..MAX_WARNINGS warn whatever their evidence; past them strong and judged evidence stops the task, and weak
evidence warns again unless the judge has agreed in the same task: weak evidence alone never stops a task.
The evidence computes its strength from its fields (`evidence.py`); this module is the only one that acts on it
(the engine numbers the episodes and asks here; the warning's "last warning" wording asks here too). Pure code,
no I/O.
"""

from __future__ import annotations

from typing import Protocol, Sequence


class Trip(Protocol):
    """What the ladder reads of a rule's evidence: its type and its strength."""

    type: str
    strength: str


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


def named_after(trips: Sequence[Trip], previous_type: str | None, number: int, limit: int) -> Trip:
    """The evidence an episode is named after, of those one step tripped (in SPEC's order): the rule the task's
    previous episode named, when this step trips it too (a loop warned as tool_error stops as tool_error); else
    the first. On a rung that may stop, weak evidence gives way to stronger evidence the same step holds."""
    chosen = next((trip for trip in trips if trip.type == previous_type), trips[0])
    if number > limit and chosen.strength == WEAK:
        return next((trip for trip in trips if trip.strength != WEAK), chosen)
    return chosen


def judge_agrees(trips: Sequence[Trip]) -> bool:
    """Whether a step's evidence holds the judge's verdict."""
    return any(trip.strength == JUDGED for trip in trips)


def last_warning(number: int, limit: int, strength: str) -> bool:
    """Whether a warning may say it is the last: the next episode would stop, if it repeats this evidence."""
    return number == limit and STOPS[strength, False]


def shown(number: int, limit: int, stopped: bool) -> str:
    """An episode's place on the ladder as people read it: `k/N` for the k-th of N warnings and for the stop that
    follows them (`3/2`); a warning past them, which only weak evidence gives, `k (past N)`, so that it does not
    read as a stop."""
    return f"{number} (past {limit})" if number > limit and not stopped else f"{number}/{limit}"
