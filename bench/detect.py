"""The detection engine's speed, against a straightforward reference implementation, in one run.

    .venv/bin/python bench/detect.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_content import ReferenceContent  # noqa: E402

from proxy.conversation import ToolCall  # noqa: E402
from proxy.detect.content import COMPILED, ContentTracker, PureContentTracker  # noqa: E402
from proxy.detect.engine import DetectConfig, analyze  # noqa: E402
from proxy.detect.steps import make_call  # noqa: E402
from proxy.detect.normalize import is_error_form  # noqa: E402
from proxy.detect.tools import ToolTracker  # noqa: E402
from proxy.wire.chat import ChatDialect  # noqa: E402

WORDS = ("the", "file", "config", "loader", "returns", "value", "when", "tests", "module", "change", "build",
         "cache", "parser", "error-free", "update", "server", "client", "request", "path", "line")


def prose(size: int, seed: int = 1) -> str:
    """Varied text with no repeated 50-character window to speak of: the detector's normal diet."""
    rng = random.Random(seed)
    parts, total = [], 0
    while total < size:
        word = f"{rng.choice(WORDS)}{rng.randint(0, 999)}"
        parts.append(word)
        total += len(word) + 1
        if rng.random() < 0.08:
            parts.append(".\n")
    return " ".join(parts)[:size]


def split(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def measure(make, deltas: list[str]) -> tuple[float, object]:
    detector = make()
    feed = detector.feed if hasattr(detector, "feed") else detector.add
    started = time.perf_counter()
    for delta in deltas:
        feed(delta)
    return time.perf_counter() - started, detector


def held_bytes(make, deltas: list[str]) -> int:
    """Memory a tracker holds after the deltas (its arrays are allocated through Python's allocator)."""
    tracemalloc.start()
    tracker = make()
    for delta in deltas:
        tracker.feed(delta)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held


def shared_cases() -> list[tuple[str, list[str]]]:
    sentence = "The same fifty characters appear again and again.."
    pattern = ("When I run the migration it fails with a lock timeout, so I will retry the migration after "
               "waiting for the lock to be released by the other job. ")
    return [
        ("same sentence x12", [sentence] * 12),
        ("150-char pattern x20", [pattern] * 20),
        ("random prose", split(prose(20_000, 3), 7)),
        ("fenced repetition", ["```\n"] + ["print('a line of code that repeats itself')\n"] * 20 + ["```\n"]),
        ("chanting after a closed fence", ["```\nx = 1\n```\n"] + [sentence] * 12),
        ("looping lines", ["I will not output any text.\nI will just end the turn.\n"] * 20),
    ]


def pure_throughput(text: str) -> None:
    """The plain Python matcher (proxy/detect/content_rule.py, used when the compiled one is not built) on the
    same text, beside the matcher in use."""
    print("### The plain Python matcher (no C compiler at install)\n")
    print("| deltas | matcher in use MB/s | plain MB/s | plain µs per delta | plain characters/s | in use / plain |")
    print("|---|---|---|---|---|---|")
    for label, deltas in (("token-sized (4 chars)", split(text, 4)), ("1 KB", split(text, 1024))):
        ours, _ = measure(ContentTracker, deltas)
        pure, _ = measure(PureContentTracker, deltas)
        print(f"| {label} | {len(text) / ours / 1e6:.2f} | {len(text) / pure / 1e6:.2f} | "
              f"{pure / len(deltas) * 1e6:.2f} | {len(text) / pure:,.0f} | {pure / ours:.0f}x |")
    print(f"\nmemory held after the same text: {held_bytes(PureContentTracker, split(text, 4)) / 1024:.0f} KiB "
          f"(the matcher in use: {held_bytes(ContentTracker, split(text, 4)) / 1024:.0f} KiB)\n")


def first_hit(make, deltas: list[str]) -> int | None:
    detector = make()
    feed = detector.feed if hasattr(detector, "feed") else detector.add
    for i, delta in enumerate(deltas):
        if feed(delta):
            return i
    return None


def main(quick: bool) -> None:
    size = 200_000 if quick else 1_000_000
    text = prose(size)
    print("# loopwarden detection benchmark\n")
    if not COMPILED:
        print("(the compiled content matcher is not in use: the loopwarden columns are the plain Python one's)\n")
    print("## Verdicts on shared cases (index of the delta that completes the loop)\n")
    print("| case | loopwarden | plain Python matcher | reference | same |\n|---|---|---|---|---|")
    agree = True
    for name, deltas in shared_cases():
        ours, pure = first_hit(ContentTracker, deltas), first_hit(PureContentTracker, deltas)
        theirs = first_hit(ReferenceContent, deltas)
        agree &= ours == pure == theirs
        print(f"| {name} | {ours} | {pure} | {theirs} | {'yes' if ours == pure == theirs else 'NO'} |")
    print(f"\nall shared cases agree: {agree}\n")

    print(f"## Content layer throughput ({size // 1000} KB of varied prose)\n")
    print("| deltas | loopwarden MB/s | µs per delta | reference MB/s | µs per delta | speed-up |")
    print("|---|---|---|---|---|---|")
    for label, deltas in (("token-sized (4 chars)", split(text, 4)), ("1 KB", split(text, 1024)),
                          (f"one {size // 1000} KB message", [text])):
        ours, tracker = measure(ContentTracker, deltas)
        mb = len(text) / 1e6
        row = f"| {label} | {mb / ours:.2f} | {ours / len(deltas) * 1e6:.2f} |"
        if len(deltas) == 1:
            # The reference truncates its history to 5000 characters before indexing: it would look
            # at only the end of one big message, so its time says nothing comparable.
            print(row + " n/a | n/a | n/a |")
            continue
        # The reference is measured on the first 50 KB (it is slow) and scaled to the whole text.
        sample = []
        while sum(map(len, sample)) < 50_000 and len(sample) < len(deltas):
            sample.append(deltas[len(sample)])
        theirs, _ = measure(ReferenceContent, sample)
        theirs *= len(text) / sum(len(d) for d in sample)
        print(row + f" {mb / theirs:.2f} | {theirs / len(deltas) * 1e6:.2f} | {theirs / ours:.1f}x |")
    print(f"\nstate held after {size // 1000} KB: {tracker.state_size} characters and index entries, "
          f"{held_bytes(ContentTracker, split(text, 4)) / 1024:.0f} KiB (bounded by the window, whatever the length)\n")
    pure_throughput(text)

    calls = 20_000 if not quick else 4_000
    result = "def handler(request):\n    return respond(request, status=200)\n" * 8
    results = {f"c{i}": (f"{result}# {i % 7}", False) for i in range(calls)}
    print("## Tool layer\n")
    # A result is masked and hashed only when its call is compared with an earlier one of the same name and
    # arguments: distinct calls never are, a call repeated always is.
    for label, paths in (("each new to the calls before it", 50), ("the same call again and again", 1)):
        raws = [ToolCall(f"c{i}", "read_file", f'{{"path": "src/m{i % paths}.py"}}') for i in range(calls)]
        tracker_tools = ToolTracker()
        started = time.perf_counter()
        for raw in raws:
            tracker_tools.add(make_call(raw, results), 5)
        elapsed = time.perf_counter() - started
        print(f"- {calls} calls with ~{len(result)}-character results, {label}: {elapsed / calls * 1e6:.1f} µs "
              f"per call")
    print()
    error_forms(quick)


def error_forms(quick: bool) -> None:
    """What telling an error by its form costs per tool result (SPEC §5: the forms real tools print)."""
    fixtures = Path(__file__).parent.parent / "tests" / "fixtures" / "tool_output"
    reports = [p.read_text() for p in sorted(fixtures.glob("*.txt"))]
    log = "\n".join(f"2026-11-20 09:14:{i % 60:02d} INFO request {i} served in {i % 17} ms" for i in range(300))
    long_run = "".join(f"tests/test_m{i}.py ........\n" for i in range(300)) + \
        (fixtures / "pytest.fail.txt").read_text()
    source = "def handler(request):\n    return respond(request, status=200)\n" * 8
    cases = [("a source file (496 characters)", [source]),
             ("a 20 KB log", [log]), ("a 12 KB failing pytest run", [long_run]),
             (f"tool output fixtures ({len(reports)}, failing and passing)", reports)]
    print("## Telling an error by its form\n")
    print("| result | µs per result |\n|---|---|")
    for name, results in cases:
        rounds = (20_000 if not quick else 2_000) // len(results)
        started = time.perf_counter()
        for _ in range(rounds):
            for result in results:
                is_error_form(result)
        print(f"| {name} | {(time.perf_counter() - started) / (rounds * len(results)) * 1e6:.1f} |")
    print()


def histories(quick: bool) -> None:
    """The engine on a 200-message history, from scratch (a fresh replica) and with the fold cached (the
    next request of a running session): tool calls against the same agent acting in text."""
    from overhead import conversation, text_conversation

    config = DetectConfig()
    rounds = 50 if quick else 200
    print("## A 200-message history: tool calls and acting in text\n")
    print("| history | from scratch µs | next request, cached µs |\n|---|---|---|")
    figures = {}
    for name, build in (("tool calls", conversation), ("acting in text (ReAct)", text_conversation)):
        full, before = build(200), build(198)
        started = time.perf_counter()
        for _ in range(rounds):
            analyze(config, ChatDialect.read({"messages": full}).messages)  # read as the proxy reads it
        cold = (time.perf_counter() - started) / rounds
        warm = 0.0
        for _ in range(rounds):
            _, cache = analyze(config, ChatDialect.read({"messages": before}).messages)  # one step shorter
            started = time.perf_counter()
            analyze(config, ChatDialect.read({"messages": full}).messages, cache=cache)
            warm += time.perf_counter() - started
        warm /= rounds
        figures[name] = cold
        print(f"| {name} | {cold * 1e6:.0f} | {warm * 1e6:.0f} |")
    ratio = figures["acting in text (ReAct)"] / figures["tool calls"]
    print(f"\nacting in text costs {ratio:.2f}x tool calls from scratch\n")


def replay_throughput(quick: bool) -> None:
    """`loopwarden replay`'s engine on many recorded conversations: 20 agent turns each, a third of them looping."""
    from overhead import conversation

    from proxy.replay import Record, replay

    count = 500 if quick else 2000
    records = [Record(f"bench:{i}", ChatDialect.read({"messages": conversation(42, looping=i % 3 == 0, tag=str(i))})
                      .messages, False) for i in range(count)]
    config = DetectConfig()
    started = time.perf_counter()
    found = sum(len(replay(config, record).episodes) for record in records)
    elapsed = time.perf_counter() - started
    print("## Replay\n")
    print(f"{count} conversations of 20 turns ({found} episodes found): {count / elapsed:.0f} conversations/s\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    main(quick)
    histories(quick)
    replay_throughput(quick)
