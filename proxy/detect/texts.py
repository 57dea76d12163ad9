"""What the model and the client are told: the injected warnings and the stop's message."""

from __future__ import annotations

from typing import NamedTuple

from proxy.detect import ladder
from proxy.detect.engine import CUT_NOTICE_PREFIX, INJECTED_PREFIX, Episode
from proxy.detect.evidence import REASONING, Evidence


class Told(NamedTuple):
    """What a text needs of an episode, as a log row holds it: its number, the warnings allowed, the evidence."""

    number: int
    limit: int
    evidence: Evidence




def warning_text(episode: Episode | Told) -> str:
    strength = episode.evidence.strength
    last = " This is the last warning: the next repeat ends the task." \
        if ladder.last_warning(episode.number, episode.limit, strength) else ""
    return (f"{INJECTED_PREFIX}Loop detected ({episode.number}/{episode.limit}): {episode.evidence.describe()}. "
            f"{episode.evidence.advice}{last}")


def stop_text(episode: Episode | Told, resume_link: str | None = None) -> str:
    """The stop's message, for the person running the agent: with the link that lets the session go on."""
    given = episode.number - 1  # the limit, or more when weak evidence warned past it
    warned = f"after {given} warning{'s' if given != 1 else ''}" if given > 0 else "at once"
    resume = f" For the person running the agent: open {resume_link} to let it go on as it was." if resume_link else ""
    return (f"{INJECTED_PREFIX}Loop detected ({episode.evidence.type}): {episode.evidence.describe()}. The task was "
            f"stopped {warned}; the request was not sent upstream. Send a new user message to start a new task.{resume}")


def cut_notice(episode: Episode | Told) -> str:
    """The last text delta of a cut stream: why the text stops here (and, cut inside the reasoning, that the
    reasoning repeated: the answer holds only this notice, and later requests read the cut from it)."""
    chant = episode.evidence
    where = " in the reasoning" if chant.channel == REASONING else ""
    return f"\n\n{CUT_NOTICE_PREFIX} the same text repeated {chant.occurrences} times{where}."
