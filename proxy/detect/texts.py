"""What the model and the client are told: the injected warnings and the stop's message."""

from __future__ import annotations

from proxy.detect.engine import CUT_NOTICE_PREFIX, INJECTED_PREFIX, Episode


def describe(episode: Episode) -> str:
    """What repeats, in one sentence."""
    d = episode.detail
    if episode.type == "tool_call":
        outcome = "and got the same result each time" if d.get("same_result", True) else \
            "(its result changed, but repeating the identical call is not making progress)"
        return f"you called `{d['tool']}` with {d['arguments']} {d['repeats']} times in a row {outcome}"
    if episode.type == "tool_cycle":
        arguments = d.get("cycle_arguments") or [""] * len(d["cycle"])
        steps = " → ".join(f"`{name}` with {args}" for name, args in zip(d["cycle"], arguments))
        outcome = "with the same results" if d.get("same_result", True) else \
            "(their results changed, but going round the same calls again and again is not making progress)"
        return f"you repeated the same cycle of tool calls ({steps}) {d['repeats']} times {outcome}"
    if episode.type == "tool_error" and d.get("calls"):
        calls = ", ".join(f"`{c['tool']}` with {c['arguments']}" for c in d["calls"])
        return (f"the same error answered your last {d['repeats']} calls, though they differed (the last were "
                f"{calls}): {d['error']}")
    if episode.type == "tool_error":
        return (f"`{d['tool']}` with {d['arguments']} failed {d['repeats']} times with the same error: "
                f"{d['error']}")
    if episode.type == "reply":
        return f"you gave the same reply {d['repeats']} times in a row: \"{d['reply']}\""
    if episode.type == "content":
        where = "reasoning" if d.get("channel") == "reasoning" else "reply"
        repeated = d["repeated"].strip()
        return f"your {where} keeps repeating the same text" + (f": \"{repeated}\"" if repeated else "")
    return f"a review of this task found it is no longer making progress ({d.get('analysis') or 'no detail'})"


def evidence(detail: dict) -> str:
    """The episode's evidence in a few words, for an alert or a trace: the error, the chanted text, the
    repeated call's arguments, or the judge's analysis."""
    return str(detail.get("error") or detail.get("repeated") or detail.get("arguments") or detail.get("analysis")
               or "")


_ADVICE = {
    "tool_call": "Calling it again will not change the outcome. Use what the result already told you, "
                 "or change the arguments, use another tool, or take a different approach.",
    "tool_cycle": "The cycle is not making progress. Break it: change what you do at one of its steps, "
                  "or take a different approach.",
    "tool_error": "Retrying will fail the same way. Read the error, fix its cause or change "
                  "what you do, or take a different approach.",
    "reply": "Saying it again will not move the task on. Answer what was asked, take an action the task needs, "
             "or finish with your result.",
    "content": "Stop repeating it. Continue with new content, or finish your answer.",
    "llm": "Step back, summarise what you have learned, and take a different approach.",
}


def warning_text(episode: Episode) -> str:
    last = " This is the last warning: the next repeat ends the task." if episode.number == episode.limit else ""
    return (f"{INJECTED_PREFIX}Loop detected ({episode.number}/{episode.limit}): {describe(episode)}. "
            f"{_ADVICE[episode.type]}{last}")


def stop_text(episode: Episode, resume_link: str | None = None) -> str:
    """The stop's message, for the person running the agent: with the link that lets the session go on."""
    warned = f"after {episode.limit} warning{'s' if episode.limit != 1 else ''}" if episode.limit else "at once"
    resume = f" To let it go on as it was, open {resume_link}" if resume_link else ""
    return (f"{INJECTED_PREFIX}Loop detected ({episode.type}): {describe(episode)}. The task was stopped "
            f"{warned}; the request was not sent upstream. Send a new user message to start a new task.{resume}")


def cut_notice(episode: Episode) -> str:
    """The last text delta of a cut stream: why the text stops here (and, cut inside the reasoning, that the
    reasoning repeated: the answer holds only this notice, and later requests read the cut from it)."""
    where = " in the reasoning" if episode.detail.get("channel") == "reasoning" else ""
    return f"\n\n{CUT_NOTICE_PREFIX} the same text repeated {episode.detail.get('occurrences', 0)} times{where}."
