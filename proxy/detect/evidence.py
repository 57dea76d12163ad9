"""What a rule found, typed, one class per rule: the sentence the model and the person are told (`describe`), what
the warning advises (`advice`), the evidence in a few words for an alert or a trace (`gist`), one short line for
the CLI's lists (`line`), the log's `detail` (`logged`, read back by `from_logged`), and how strong the evidence
is (`strength`, computed from its fields, so a row logged before it was recorded reads the same)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

from proxy.detect.ladder import JUDGED, STRENGTHS, STRONG, WEAK


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


@dataclass(frozen=True)
class _Call:
    """A call a rule names: the tool and its arguments (shortened) and, for one call, the start of its result."""

    tool: str
    arguments: str
    repeats: int
    result: str | None

    def gist(self) -> str:
        return self.arguments

    def line(self) -> str:
        return _short(f"{self.tool} {self.arguments}", 60)

    def _logged(self) -> dict:
        return {"tool": self.tool, "arguments": self.arguments, "repeats": self.repeats}

    def _with_result(self, detail: dict) -> dict:
        if self.result:
            detail["result"] = self.result
        return detail


@dataclass(frozen=True)
class RepeatedCall(_Call):
    type: ClassVar[str] = "tool_call"
    advice: ClassVar[str] = ("Calling it again will not change the outcome. Use what the result already told you, "
                             "or change the arguments, use another tool, or take a different approach.")
    same_result: bool = True
    idle: bool = False  # calls that each did nothing, in different forms (an empty command, `true`, `echo`)

    @property
    def strength(self) -> str:
        """The same call with the same result, or an edit re-applied, is strong; calls that each did nothing, in
        forms that differ, are weak."""
        return WEAK if self.idle else STRONG

    def describe(self) -> str:
        if self.idle:
            return (f"your last {self.repeats} calls of `{self.tool}` did nothing ({self.arguments}); "
                    "no work has been done by them")
        outcome = "and got the same result each time" if self.same_result else \
            "(its result changed, but repeating the identical call is not making progress)"
        return f"you called `{self.tool}` with {self.arguments} {self.repeats} times in a row {outcome}"

    def logged(self) -> dict:
        detail = {**self._logged(), "same_result": self.same_result}
        if self.idle:
            detail["idle"] = True
        return self._with_result(detail)


@dataclass(frozen=True)
class Cycle(_Call):
    type: ClassVar[str] = "tool_cycle"
    advice: ClassVar[str] = ("The cycle is not making progress. Break it: change what you do at one of its steps, "
                             "or take a different approach.")
    cycle: tuple[str, ...] = ()
    cycle_arguments: tuple[str, ...] = ()
    same_result: bool = True
    strength: ClassVar[str] = STRONG

    def describe(self) -> str:
        arguments = self.cycle_arguments or ("",) * len(self.cycle)
        steps = " → ".join(f"`{name}` with {args}" for name, args in zip(self.cycle, arguments))
        outcome = "with the same results" if self.same_result else \
            "(their results changed, but going round the same calls again and again is not making progress)"
        return f"you repeated the same cycle of tool calls ({steps}) {self.repeats} times {outcome}"

    def line(self) -> str:
        return _short(" → ".join(self.cycle), 60)

    def logged(self) -> dict:
        detail = {**self._logged(), "cycle": list(self.cycle), "cycle_arguments": list(self.cycle_arguments)}
        if not self.same_result:
            detail["same_result"] = False
        return self._with_result(detail)


@dataclass(frozen=True)
class RepeatedError(_Call):
    type: ClassVar[str] = "tool_error"
    advice: ClassVar[str] = ("Retrying will fail the same way. Read the error, fix its cause or change what you do, "
                             "or take a different approach.")
    error: str = ""
    calls: tuple[tuple[str, str], ...] = ()  # the calls the error answered, when they differed: (tool, arguments)
    alike: bool = False  # those calls differed only in numbers and white space (`# attempt 3`, then `# attempt 4`)

    @property
    def strength(self) -> str:
        """The same call failing the same way (numbers and white space aside) is strong; different calls meeting
        one error are weak."""
        return WEAK if self.calls and not self.alike else STRONG

    def describe(self) -> str:
        if self.calls:
            calls = ", ".join(f"`{tool}` with {arguments}" for tool, arguments in self.calls)
            return (f"the same error answered your last {self.repeats} calls, though they differed (the last were "
                    f"{calls}): {self.error}")
        return f"`{self.tool}` with {self.arguments} failed {self.repeats} times with the same error: {self.error}"

    def gist(self) -> str:
        return self.error or self.arguments

    def logged(self) -> dict:
        detail = {**self._logged(), "error": self.error}
        if self.calls:
            detail["calls"] = [{"tool": tool, "arguments": arguments} for tool, arguments in self.calls]
        if self.alike:
            detail["alike"] = True
        return self._with_result(detail)


@dataclass(frozen=True)
class RepeatedReply:
    type: ClassVar[str] = "reply"
    advice: ClassVar[str] = ("Saying it again will not move the task on. Answer what was asked, take an action the "
                             "task needs, or finish with your result.")
    reply: str
    repeats: int
    strength: ClassVar[str] = WEAK  # a harness or a person may ask alike, and be answered alike

    def describe(self) -> str:
        return f"you gave the same reply {self.repeats} times in a row: \"{self.reply}\""

    def gist(self) -> str:
        return self.reply

    def line(self) -> str:
        return _short(f'"{self.reply}"', 60)

    def logged(self) -> dict:
        return {"reply": self.reply, "repeats": self.repeats}


REASONING = "reasoning"  # the channel of a model's reasoning (the answer is the other)


@dataclass(frozen=True)
class Chanting:
    type: ClassVar[str] = "content"
    advice: ClassVar[str] = "Stop repeating it. Continue with new content, or finish your answer."
    repeated: str
    occurrences: int
    channel: str | None = None  # REASONING when the chant was in the model's reasoning
    strength: ClassVar[str] = STRONG

    def describe(self) -> str:
        where = "reasoning" if self.channel == REASONING else "reply"
        repeated = self.repeated.strip()
        return f"your {where} keeps repeating the same text" + (f": \"{repeated}\"" if repeated else "")

    def gist(self) -> str:
        return self.repeated

    def line(self) -> str:
        text = f'"{self.repeated}"'
        if self.channel:
            return f"[{self.channel}] " + _short(text, 48)
        return _short(text, 60)

    def logged(self) -> dict:
        detail: dict = {"repeated": self.repeated, "occurrences": self.occurrences}
        if self.channel == REASONING:
            detail["channel"] = REASONING
        return detail


@dataclass(frozen=True)
class Verdict:
    """A judge model's finding that the task no longer progresses."""

    type: ClassVar[str] = "llm"
    advice: ClassVar[str] = "Step back, summarise what you have learned, and take a different approach."
    confidence: float
    analysis: str
    strength: ClassVar[str] = JUDGED

    def describe(self) -> str:
        return f"a review of this task found it is no longer making progress ({self.analysis or 'no detail'})"

    def gist(self) -> str:
        return self.analysis

    def line(self) -> str:
        return _short(self.analysis, 60)

    def logged(self) -> dict:
        return {"confidence": self.confidence, "analysis": self.analysis}


Evidence = Union[RepeatedCall, Cycle, RepeatedError, RepeatedReply, Chanting, Verdict]


def from_logged(kind: str, detail: dict | None) -> Evidence | None:
    """The evidence a log row's `detail` records (None for a row this version cannot read: another type, or a
    detail missing what its rule needs)."""
    detail = detail or {}
    try:
        if kind in ("tool_call", "tool_cycle", "tool_error"):
            common = {"tool": str(detail["tool"]), "arguments": str(detail.get("arguments", "")),
                      "repeats": int(detail.get("repeats") or 0), "result": detail.get("result")}
            if kind == "tool_call":
                return RepeatedCall(**common, same_result=bool(detail.get("same_result", True)),
                                    idle=bool(detail.get("idle", False)))
            if kind == "tool_cycle":
                return Cycle(**common, cycle=tuple(map(str, detail["cycle"])),
                             cycle_arguments=tuple(map(str, detail.get("cycle_arguments") or ())),
                             same_result=bool(detail.get("same_result", True)))
            return RepeatedError(**common, error=str(detail["error"]),
                                 calls=tuple((str(c["tool"]), str(c["arguments"])) for c in detail.get("calls") or ()),
                                 alike=bool(detail.get("alike", False)))
        if kind == "reply":
            return RepeatedReply(str(detail["reply"]), int(detail["repeats"]))
        if kind == "content":
            return Chanting(str(detail["repeated"]), int(detail["occurrences"]), detail.get("channel"))
        if kind == "llm":
            return Verdict(float(detail.get("confidence") or 0), str(detail.get("analysis") or ""))
    except (KeyError, TypeError, ValueError):
        return None
    return None


def strength_of(kind: str, detail: dict | None) -> str | None:
    """A log row's evidence strength: as recorded, or (a row logged before it was) computed from its detail;
    None for a detail this version cannot read."""
    recorded = (detail or {}).get("strength")
    if recorded in STRENGTHS:
        return recorded
    evidence = from_logged(kind, detail)
    return evidence.strength if evidence is not None else None
