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


@pytest.mark.parametrize("run", sorted(LABELS))
def test_a_labelled_run_gets_the_verdict_its_label_gives(run):
    (record,), errors = read_records([str(CORPUS / run)])
    assert errors == []
    episodes = replay(DetectConfig(tool_call_threshold=5), record).episodes
    if LABELS[run]["label"] == "loop":
        assert episodes and episodes[0]["action"] == "warned", f"{run}: a labelled loop was not warned"
    else:
        assert episodes == [], f"{run}: a benign run was flagged: {episodes}"
