"""What the proxy did about an episode, as the log, the API and alerts name it."""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    WARNED = "warned"  # a warning went into the request the model was given
    STOPPED = "stopped"  # the request was refused (or, observed, would have been)
    CUT = "cut"  # the stream was cut where it completed a loop
    LATE = "late"  # found once its task had ended (a person wrote next): nothing reached the model, nothing was cut
