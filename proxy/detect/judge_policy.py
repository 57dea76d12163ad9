"""The judge's policy: when a check is due, what the judge is shown, how an answer becomes a verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass

from proxy.conversation import TOOL, USER, Message

LOOP_CONFIDENCE = 0.9
FIRST_INTERVAL = 10
MIN_INTERVAL, MAX_INTERVAL = 5, 15
WINDOW_MESSAGES = 20


@dataclass(frozen=True)
class JudgeCheck:
    """A finished check, as stored: the task turn it looked at and what the judges answered."""

    task: str
    turn: int
    confidence: float | None  # None: the judge gave no usable answer
    confirm_confidence: float | None = None
    analysis: str = ""

    @property
    def deciding_confidence(self) -> float | None:
        return self.confirm_confidence if self.confirm_confidence is not None else self.confidence

    def is_loop(self, confirm_required: bool) -> bool:
        if self.confidence is None or self.confidence < LOOP_CONFIDENCE:
            return False
        if confirm_required:
            return self.confirm_confidence is not None and self.confirm_confidence >= LOOP_CONFIDENCE
        return True


def interval_after(confidence: float | None) -> int:
    """Turns until the next check: sooner when the judge was less sure all is well."""
    if confidence is None:
        return FIRST_INTERVAL
    # floor(x + 0.5) rounds halves up, as JavaScript's Math.round does.
    return min(MAX_INTERVAL, max(MIN_INTERVAL, math.floor(5 + 10 * (1 - confidence) + 0.5)))


def check_due(turn: int, after_turns: int, checks: list[JudgeCheck]) -> bool:
    """Whether the task, at `turn` assistant turns, is due a judge check."""
    if turn < after_turns:
        return False
    if not checks:
        return True
    answered = [c for c in checks if c.deciding_confidence is not None]
    interval = interval_after(answered[-1].deciding_confidence) if answered else FIRST_INTERVAL
    return turn - checks[-1].turn >= interval


def judge_window(messages: list[Message], task_start: int) -> tuple[str, list[Message]]:
    """The task's original user request and its last messages, with dangling tool calls trimmed."""
    request = ""
    if task_start > 0 and messages[task_start - 1].role == USER:
        request = messages[task_start - 1].text
    window = messages[task_start:][-WINDOW_MESSAGES:]
    answered = {m.call_id for m in window if m.role == TOOL}
    called: set[str] = set()
    trimmed: list[Message] = []
    for message in window:
        if message.role == TOOL and message.call_id not in called:
            continue  # its call fell outside the window
        if message.calls:
            kept = tuple(c for c in message.calls if c.id in answered)
            called.update(c.id for c in kept)
            message = message._replace(calls=kept)
        trimmed.append(message)
    return request, trimmed
