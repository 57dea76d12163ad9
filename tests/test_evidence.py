"""Each rule's evidence, typed: what it tells, and the log's detail read back as the same evidence."""

import pytest

from proxy.commands import _summary
from proxy.detect.evidence import (Chanting, Cycle, RepeatedCall, RepeatedError, RepeatedReply, Verdict,
                                   from_logged, strength_of)
from proxy.detect.texts import Told, stop_text, warning_text
from proxy.server.alerts import alert_payload

EVIDENCE = [
    RepeatedCall("read_file", '{"path":"a.py"}', 3, "import os …", same_result=True),
    RepeatedCall("read_file", '{"path":"a.py"}', 4, None, same_result=False),
    Cycle("open", '{"a":1}', 3, None, cycle=("open", "close"), cycle_arguments=('{"a":1}', "{}")),
    Cycle("open", '{"a":1}', 3, "ok", cycle=("open", "close"), cycle_arguments=("{}", "{}"), same_result=False),
    RepeatedError("bash", '{"command":"pytest"}', 3, None, error="1 failed"),
    RepeatedError("bash", '{"command":"pytest -x"}', 3, None, error="1 failed",
                  calls=(("bash", '{"command":"pytest"}'), ("bash", '{"command":"pytest -x"}'))),
    RepeatedReply("Could you tell me which file?", 3),
    RepeatedError("python", "# attempt 4", 3, None, error="KeyError: 'Weight_in_lbs'",
                  calls=(("python", "# attempt 3"), ("python", "# attempt 4")), alike=True),
    Chanting("the same line again", 10),
    Chanting("hmm, ", 12, "reasoning"),
    Verdict(0.93, "the agent re-reads one file"),
]


@pytest.mark.parametrize("evidence", EVIDENCE, ids=lambda e: e.type)
def test_the_logged_detail_reads_back_as_the_same_evidence(evidence):
    assert from_logged(evidence.type, evidence.logged()) == evidence
    # The log adds the request's API to the detail: read back, it is not the rule's.
    assert from_logged(evidence.type, {**evidence.logged(), "api": "chat"}) == evidence


def test_the_logged_detail_keeps_the_keys_the_api_has_always_shown():
    assert RepeatedCall("t", "{}", 3, None).logged() == {"tool": "t", "arguments": "{}", "repeats": 3,
                                                         "same_result": True}
    assert set(EVIDENCE[5].logged()) == {"tool", "arguments", "repeats", "error", "calls"}
    assert EVIDENCE[5].logged()["calls"][0] == {"tool": "bash", "arguments": '{"command":"pytest"}'}
    assert "same_result" not in EVIDENCE[2].logged() and EVIDENCE[3].logged()["same_result"] is False
    assert EVIDENCE[9].logged() == {"repeated": "hmm, ", "occurrences": 12, "channel": "reasoning"}


@pytest.mark.parametrize("kind, detail", [
    ("tool_call", {"arguments": "{}", "repeats": 3}),  # no tool
    ("tool_error", {"tool": "t", "arguments": "{}", "repeats": "three", "error": "x"}),
    ("content", None),
    ("judge", {"analysis": "a rule this version does not know"}),
])
def test_a_detail_this_version_cannot_read_is_no_evidence(kind, detail):
    assert from_logged(kind, detail) is None


def test_the_warning_and_the_stop_say_what_repeats_and_what_to_do():
    told = Told(1, 2, EVIDENCE[6])
    text = warning_text(told)
    assert text.startswith("[loopwarden] Loop detected (1/2): you gave the same reply 3 times in a row")
    assert "Answer what was asked" in text
    assert "last warning" in warning_text(Told(2, 2, EVIDENCE[0]))
    stop = stop_text(Told(3, 2, EVIDENCE[4]))
    assert "(tool_error)" in stop and "failed 3 times with the same error: 1 failed" in stop


def test_a_repeated_reply_shows_its_words_in_the_lists_and_the_alert():
    row = {"type": "reply", "detail": {**EVIDENCE[6].logged(), "api": "chat"}}
    assert _summary(row) == '"Could you tell me which file?"'
    alert = alert_payload({**row, "session_id": "s", "tenant": "t", "model": "m", "action": "warned",
                           "episode": 1, "episode_limit": 2, "turn": 4, "tokens_saved_estimate": 0,
                           "enforced": True, "created_at": __import__("datetime").datetime(2026, 1, 1)}, None)
    assert alert["evidence"] == "Could you tell me which file?" and alert["api"] == "chat"
    assert _summary({"type": "content", "detail": EVIDENCE[9].logged()}) == '[reasoning] "hmm, "'
    assert _summary({"type": "tool_cycle", "detail": EVIDENCE[2].logged()}) == "open → close"


def test_each_evidence_has_the_strength_its_fields_say():
    assert [evidence.strength for evidence in EVIDENCE] == [
        "strong", "strong", "strong", "strong",  # the same call with the same result, a cycle
        "strong", "weak",  # the same call failing alike; different calls meeting one error
        "weak",  # the same reply
        "strong",  # calls differing only in numbers, failing alike: the same call again
        "strong", "strong", "judged"]
    # A row logged before the strength was recorded reads the same; one that records it is taken at its word.
    assert strength_of("tool_error", EVIDENCE[5].logged()) == "weak"
    assert strength_of("reply", {**EVIDENCE[6].logged(), "strength": "weak"}) == "weak"
    assert strength_of("judge", {"analysis": "a rule this version does not know"}) is None


def test_the_strength_is_shown_by_the_alert_the_cli_and_the_api():
    from datetime import datetime
    from types import SimpleNamespace

    from proxy.commands import _episode, _strength
    from proxy.store.queries import detection_dict

    row = {"type": "tool_error", "detail": {**EVIDENCE[5].logged(), "strength": "weak", "api": "chat"},
           "session_id": "s", "tenant": "t", "model": "m", "action": "warned", "episode": 3, "episode_limit": 2,
           "turn": 9, "tokens_saved_estimate": 0, "enforced": True, "created_at": datetime(2026, 1, 1)}
    alert = alert_payload(row, None)
    assert alert["strength"] == "weak" and "(weak evidence)" in alert["text"]
    # A weak warning past the warnings allowed is a warning, shown as such; the stop is the stop.
    assert (_episode(row), _strength(row)) == ("3 (past 2)", "weak")
    assert "episode 3 (past 2)" in alert["text"]
    stopped = alert_payload({**row, "action": "stopped", "detail": EVIDENCE[4].logged()}, None)
    assert "episode 3/2" in stopped["text"]
    assert _episode({**row, "action": "stopped", "detail": EVIDENCE[4].logged()}) == "stop"
    assert _strength({**row, "detail": EVIDENCE[4].logged()}) == "strong"  # logged before it was recorded
    api = detection_dict(SimpleNamespace(id=1, created_at=None, task="k", request_id=None, recovered=False,
                                         mark=None, marked_at=None, mark_note=None, episode_key="e", **{
        k: v for k, v in row.items() if k not in ("created_at",)}))
    assert api["strength"] == "weak"
