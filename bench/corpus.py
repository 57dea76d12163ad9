"""Recall per agent and the benign count on the labelled real-run corpus, and what the captured agents' requests
give when replayed.

    .venv/bin/python bench/corpus.py [--captures]

The corpus (`tests/corpus/`, labels in `labels.json`): each run replayed with the default ladder and with the
ladder of five, by part (the runs the rules were written with, runs added to tune on next, and a held-out third
chosen by source that no rule is tuned on); a loop counts as warned when its first episode is a warning. With `--captures`,
each captured agent's requests (`tests/fixtures/agents/*.jsonl`, one line per request of one run) replayed: the
episodes of its last request (the whole history the run sent).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.detect.engine import DetectConfig  # noqa: E402
from proxy.replay import read_records, replay  # noqa: E402

CORPUS = ROOT / "tests" / "corpus"
CAPTURES = ROOT / "tests" / "fixtures" / "agents"


PARTS = ("tuned", "unseen", "held-out")  # written with; added, to tune on next; never to tune on (by source)
LONG_LOOP = 5  # a loop labelled as repeating this many times or more (`repeats`) is one every ladder should catch
LADDERS = {"the default ladder (3)": DetectConfig(), "the ladder of five (before 2026-11-26)":
           DetectConfig(tool_call_threshold=5)}


def corpus() -> None:
    """Recall and benign runs flagged, by part and by agent, under each ladder."""
    labels = orjson.loads((CORPUS / "labels.json").read_bytes())
    for name, config in LADDERS.items():
        rows: dict[tuple[str, str], list[int]] = {}
        flagged = []
        for run, label in sorted(labels.items()):
            (record,), errors = read_records([str(CORPUS / run)])
            episodes = replay(config, record).episodes
            agent = label["agent"].split(" (")[0].split(" with ")[0].split(",")[0]
            row = rows.setdefault((label.get("part", "tuned"), agent), [0, 0, 0, 0, 0, 0, 0])
            row[0] += 1
            if label["label"] == "loop":
                warned = bool(episodes and episodes[0]["action"] == "warned")
                row[1] += 1
                row[2] += warned
                if label["repeats"] >= LONG_LOOP:
                    row[5] += 1
                    row[6] += warned
            else:
                row[3] += 1
                row[4] += bool(episodes)
                if episodes:
                    flagged.append(f"{run}: {[(e['type'], e['action']) for e in episodes]}")
        print(f"\n{name}\n")
        print(f"| part | agent | runs | labelled loops | warned | of them repeating {LONG_LOOP}+ times: warned | "
              "benign runs | flagged |")
        print("|---|---|---|---|---|---|---|---|")
        for part in PARTS:
            total = [0] * 7
            for (row_part, agent), row in sorted(rows.items()):
                if row_part == part:
                    total = [a + b for a, b in zip(total, row)]
                    print(f"| {part} | {agent} | {row[0]} | {row[1]} | {row[2] if row[1] else '–'} | "
                          f"{f'{row[6]}/{row[5]}' if row[5] else '–'} | {row[3]} | {row[4]} |")
            recall = f"{total[2] / total[1]:.0%}" if total[1] else "–"
            long_recall = f"{total[6]}/{total[5]} ({total[6] / total[5]:.0%})" if total[5] else "–"
            print(f"| **{part}** | all | {total[0]} | {total[1]} | {total[2]} ({recall}) | {long_recall} | {total[3]} | "
                  f"{total[4]} |")
        for line in flagged:
            print(f"  flagged: {line}")


def captures() -> None:
    for path in sorted(CAPTURES.glob("*.jsonl")):
        records, errors = read_records([str(path)])
        last = replay(DetectConfig(), records[-1])
        found = ", ".join(f"{e['action']} {e['type']} (turn {e['turn']})" for e in last.episodes) or "nothing"
        print(f"{path.stem}: {len(records)} requests; the last replayed: {found}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", action="store_true")
    args = parser.parse_args()
    corpus()
    if args.captures:
        captures()


if __name__ == "__main__":
    main()
