"""Published runs of real agents, labelled by hand: every loop warned, no benign run flagged."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from proxy.detect.engine import DetectConfig
from proxy.replay import read_records, replay

CORPUS = Path(__file__).parent / "corpus"
LABELS = orjson.loads((CORPUS / "labels.json").read_bytes())


def test_every_run_in_the_corpus_is_labelled_and_every_label_has_a_run():
    runs = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.json") if p.name != "labels.json"}
    assert runs == set(LABELS)
    assert {"loop", "benign"} == {label["label"] for label in LABELS.values()}
    assert len({label["agent"].split(" (")[0] for label in LABELS.values()}) >= 3
    # A loop says how many times it repeats (bench/corpus.py reports the loops repeating 5 times or more apart).
    assert all(isinstance(label.get("repeats"), int) and label["repeats"] >= 2
               for label in LABELS.values() if label["label"] == "loop")
    assert not any("repeats" in label for label in LABELS.values() if label["label"] == "benign")


# The runs the rules were written with ("tuned": no part named) must each get their label's verdict. The runs
# added later ("unseen": to tune on next; "held-out": never to tune on, chosen by source) are measured, not held
# to it run by run (bench/corpus.py reports recall on each part apart); a benign run of any part is never flagged.
TUNED = sorted(run for run, label in LABELS.items() if "part" not in label)
BENIGN = sorted(run for run, label in LABELS.items() if label["label"] == "benign")


def episodes_of(run: str, config: DetectConfig) -> list[dict]:
    (record,), errors = read_records([str(CORPUS / run)])
    assert errors == []
    return replay(config, record).episodes


@pytest.mark.parametrize("run", TUNED)
def test_a_labelled_run_gets_the_verdict_its_label_gives(run):
    episodes = episodes_of(run, DetectConfig(tool_call_threshold=5))
    if LABELS[run]["label"] == "loop":
        assert episodes and episodes[0]["action"] == "warned", f"{run}: a labelled loop was not warned"
    else:
        assert episodes == [], f"{run}: a benign run was flagged: {episodes}"


# Benign runs the default settings still warn, never stopped, and why: false positives known and counted
# (bench/corpus.py lists them, BENCHMARKS.md reports them), not hidden. A run leaves this list when a rule stops
# warning it (the test below then fails until it is taken out); none may join it unseen, and none may be stopped.
STILL_WARNED = {  # run: (the strength of its evidence, why)
    "mini-swe-agent-gemini3/pylint-dev__pylint-8898.json": (
        "weak", "pylint run on one file with five option values in a row, the same report each time: probing an "
        "option"),
}


@pytest.mark.parametrize("run", BENIGN)
def test_no_benign_run_of_any_part_is_flagged_with_the_default_settings(run):
    found = episodes_of(run, DetectConfig())
    if run in STILL_WARNED:
        assert found, f"{run} is no longer warned: take it out of STILL_WARNED"
        strength, _why = STILL_WARNED[run]
        assert {(e["action"], e["detail"]["strength"]) for e in found} == {("warned", strength)}, found  # never stopped
    else:
        assert found == [], f"{run}: a benign run was flagged"


def test_the_held_out_part_is_a_third_chosen_by_source():
    parts = {label.get("part", "tuned") for label in LABELS.values()}
    assert parts == {"tuned", "unseen", "held-out"}
    sources: dict[str, set[str]] = {}
    for run, label in LABELS.items():
        sources.setdefault(run.split("/")[0], set()).add(label.get("part", "tuned"))
    assert all(len(found) == 1 for found in sources.values())  # a source is in one part only
    held_out = sum(label.get("part") == "held-out" for label in LABELS.values())
    assert len(LABELS) / 4 <= held_out <= len(LABELS) / 2
