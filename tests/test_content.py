"""The content layer (chanting): the reference's behaviours, without its bugs, split-independent; each behaviour
checked on both matchers (the compiled one and the plain Python one), and the two held to the same verdicts."""

from __future__ import annotations

import os
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from proxy.detect import content, content_rule
from proxy.detect.content_rule import ContentTracker as PureTracker

try:
    from proxy.detect import _content
except ImportError:  # built without a C compiler
    _content = None

NOT_BUILT = "the compiled matcher (proxy/detect/_content.pyx) is not built: the install found no C compiler"
if _content is None and os.environ.get("LOOPWARDEN_REQUIRE_COMPILED") == "1":  # CI has a compiler: fail, never skip
    raise RuntimeError(NOT_BUILT)
needs_compiled = pytest.mark.skipif(_content is None, reason=NOT_BUILT)

SENTENCE = "This is a sentence that repeats over and over now. "  # 51 characters


# Module-scoped, so that the property tests (which hypothesis runs many times per test) can take it.
@pytest.fixture(scope="module", params=[pytest.param("compiled", marks=needs_compiled), "pure"])
def matcher(request):
    """Each matcher's ContentTracker class: the behaviours below hold for both."""
    return _content.ContentTracker if request.param == "compiled" else PureTracker


def first_chant(deltas: list[str], tracker) -> int | None:
    """Index of the delta that completed a chant, or None."""
    for i, delta in enumerate(deltas):
        if tracker.feed(delta) is not None:
            return i
    return None


def chant_position(text: str, matcher) -> int | None:
    """The character at which a chant is found, feeding one character at a time."""
    return first_chant(list(text), matcher())


def test_random_text_never_chants(matcher):
    rng = random.Random(7)
    deltas = ["".join(rng.choice(string.ascii_letters + " .,") for _ in range(10)) for _ in range(1000)]
    assert first_chant(deltas, matcher()) is None


def test_same_sentence_ten_times_chants_on_the_tenth(matcher):
    sentence = "The same fifty characters appear again and again.."
    assert len(sentence) == 50
    assert first_chant([sentence] * 9, matcher()) is None
    assert first_chant([sentence] * 10, matcher()) == 9


def test_reports_the_repeated_text(matcher):
    tracker = matcher()
    found = None
    for _ in range(12):
        found = found or tracker.feed(SENTENCE)
    assert found is not None
    assert found.repeated.strip() == SENTENCE.strip()


def test_long_shared_prefix_lines_are_not_chanting(matcher):
    lines = [f"projects/my-project/locations/us-central1/services/service-number-{i}\n" for i in range(15)]
    assert first_chant(lines, matcher()) is None
    assert first_chant([f"- {line}" for line in lines], matcher()) is None


def test_sentence_separated_by_random_text_is_not_chanting(matcher):
    rng = random.Random(3)
    deltas = []
    for _ in range(15):
        deltas.append(SENTENCE)
        deltas.append("".join(rng.choice(string.ascii_letters + " ") for _ in range(500)))
    assert first_chant(deltas, matcher()) is None


def test_long_pattern_caught_within_twelve_repeats(matcher):
    pattern = ("When I run the migration it fails with a lock timeout, so I will retry the migration after "
               "waiting for the lock to be released by the other job. ")
    assert 140 <= len(pattern) <= 170
    found = first_chant([pattern] * 20, matcher())
    assert found is not None and found < 12


@pytest.mark.parametrize(
    "unit, within",
    [
        ("I will not output any text.\nI will just end the turn.\nI will not output any text.\n"
         "I will just end the turn.\nI am done.\n", 15),
        ("I have added all the requested logs and verified the test file. I will now mark the task as "
         "complete.\n  ", 15),
        ("Thinking... Done. ", 30),
        ("I need to check the file. The file does not exist. I will create the file. ", 15),
    ],
)
def test_real_model_loops_are_caught(matcher, unit, within):
    found = first_chant([unit] * 40, matcher())
    assert found is not None and found < within


def test_token_sized_deltas_with_lone_punctuation_are_caught(matcher):
    # The reference resets on a lone "." delta; classifying by line does not.
    tokens = []
    for _ in range(20):
        tokens += ["I", " will", " check", " the", " file", " again", " now", ".", " It", " failed", "."]
    assert first_chant(tokens, matcher()) is not None


def test_repetition_inside_code_fence_is_ignored(matcher):
    assert first_chant(["```python\n"] + ["print('hello world, this line repeats itself')\n"] * 30, matcher()) is None


def test_sentences_then_fence_then_more_is_not_chanting(matcher):
    assert first_chant([SENTENCE] * 8 + ["\n```\n"] + [SENTENCE] * 10, matcher()) is None


def test_open_fence_then_sentences_is_not_chanting(matcher):
    assert first_chant(["```\n"] + [SENTENCE] * 15, matcher()) is None


def test_several_fence_transitions_are_not_chanting(matcher):
    deltas = []
    for _ in range(5):
        deltas += ["```\n", "code line that repeats and repeats and repeats ok\n" * 3, "```\n", "Some prose.\n"]
    assert first_chant(deltas, matcher()) is None


def test_looping_text_after_a_closed_block_is_caught(matcher):
    deltas = ["```\nx = 1\n```\n"] + [SENTENCE] * 12
    assert first_chant(deltas, matcher()) is not None


def test_identical_code_lines_in_a_block_are_ignored(matcher):
    assert first_chant(["```js\n"] + ["for (let i = 0; i < 10; i++) { console.log(i); }\n"] * 20, matcher()) is None


@pytest.mark.parametrize("marker", ["```\n", "| a | b |\n", "|---|---|\n", "+---+---+\n", "* item\n",
                                    "- item\n", "+ item\n", "1. item\n", "42. item\n", "# Title\n",
                                    "### Title\n", "###### Title\n", "> quoted\n"])
def test_a_structural_line_restarts_the_count(matcher, marker):
    line = SENTENCE.strip() + "\n"
    assert first_chant([line] * 9 + [marker] + [line] * 9, matcher()) is None
    assert first_chant([line] * 9 + ["just prose\n"] + [line] * 9, matcher()) is not None


@pytest.mark.parametrize("divider", ["-" * 50 + "\n", "╭─" * 25 + "\n", "=" * 60 + "\n"])
def test_dividers_are_not_chanting(matcher, divider):
    assert first_chant([divider] * 15, matcher()) is None


def test_empty_text_is_nothing(matcher):
    assert first_chant(["", "", ""], matcher()) is None
    assert matcher().end_message() is None


def test_reset_forgets_earlier_repeats(matcher):
    tracker = matcher()
    assert first_chant([SENTENCE] * 9, tracker) is None
    tracker.reset()
    assert first_chant([SENTENCE] * 9, tracker) is None


# The reference's bugs, which loopwarden does not copy.

def test_dash_bullets_are_list_items_like_star_bullets(matcher):
    bullet = "- Updated the configuration loader to read the new file\n"
    assert first_chant([bullet] * 15, matcher()) is None
    assert first_chant([bullet.replace("-", "*", 1)] * 15, matcher()) is None


def test_a_lone_punctuation_delta_does_not_reset_tracking(matcher):
    deltas = []
    for _ in range(12):
        deltas += ["I am going to retry the failing step one more time", "."]
    assert first_chant(deltas, matcher()) is not None


def test_unclosed_fence_does_not_outlive_the_tracker(matcher):
    # Each task gets a fresh tracker (the engine's job); a new tracker is never in code.
    stale = matcher()
    stale.feed("```\n")
    assert first_chant([SENTENCE] * 12, matcher()) is not None


# Split independence.

CHANTING = ("Intro line.\n" + "- a list item\n" + "Let me try that again. " * 14 + "\n```\nx\n```\n"
            + "Checking the output once more... " * 12)
CALM = "".join(f"Line {i}: a different sentence about file_{i}.py and its contents.\n" for i in range(40))


@given(st.sampled_from([CHANTING, CALM]), st.lists(st.integers(min_value=1, max_value=len(CHANTING)), max_size=40))
@settings(max_examples=300, deadline=None)
def test_verdict_and_position_do_not_depend_on_the_split(matcher, text, cuts):
    position = chant_position(text, matcher)
    bounds = sorted({c for c in cuts if c < len(text)}) + [len(text)]
    deltas, start = [], 0
    for bound in bounds:
        deltas.append(text[start:bound])
        start = bound
    found = first_chant(deltas, matcher())
    if position is None:
        assert found is None
    else:
        assert found is not None
        # The chant is found in the delta that holds the character where it completes.
        delta_start = sum(len(d) for d in deltas[:found])
        assert delta_start <= position < delta_start + len(deltas[found])


def test_memory_is_bounded_whatever_the_length(matcher):
    tracker = matcher()
    rng = random.Random(1)
    for _ in range(2000):
        tracker.feed("".join(rng.choice(string.ascii_lowercase + " ") for _ in range(100)) + "\n")
    assert tracker.state_size < 10 * 2 * 2300


# The index against the rule written out by brute force.

def brute_force_chant(text: str, size: int, threshold: int) -> tuple[int, str] | None:
    """The first window (in order) whose last `threshold` occurrences chant, found by rescanning."""
    for p in range(len(text) - size + 1):
        window = text[p:p + size]
        occurrences = [q for q in range(p + 1) if text[q:q + size] == window]
        if len(occurrences) < threshold:
            continue
        recent = occurrences[-threshold:]
        if recent[-1] - recent[0] > size * 5 * (threshold - 1):
            continue
        if len({text[a:b] for a, b in zip(recent, recent[1:])}) > threshold // 2:
            continue
        gap = text[recent[-2]:recent[-1]]
        return p + size - 1, gap if len(gap) >= size else window
    return None


@given(st.text(alphabet="ab ", min_size=1, max_size=400), st.sampled_from([(4, 3), (6, 4), (3, 5), (8, 2)]),
       st.integers(min_value=1, max_value=9))
@settings(max_examples=400, deadline=None)
def test_index_agrees_with_brute_force(matcher, body, size_and_threshold, step):
    # Prose only ("a" first, no newline), so every character is counted (runs of spaces as one); short windows and
    # small thresholds make repeats common and push the text through several trims.
    size, threshold = size_and_threshold
    text = "a" + body
    tracker = matcher(chunk_size=size, threshold=threshold)
    found_at, found = None, None
    for start in range(0, len(text), step):
        found = tracker.feed(text[start:start + step])
        if found is not None:
            found_at = start
            break
    # White space is folded: a run of it counts as one character, at the run's first position.
    counted, positions = [], []
    for i, c in enumerate(text):
        if c == " " and counted and counted[-1] == " ":
            continue
        counted.append(c)
        positions.append(i)
    expected = brute_force_chant("".join(counted), size, threshold)
    if expected is None:
        assert found is None
    else:
        end, repeated = expected
        assert found is not None and found_at <= positions[end] < found_at + step
        assert found.repeated == repeated


def test_chant_is_found_far_into_a_long_run_of_prose(matcher):
    rng = random.Random(5)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(4000)]
    calm = " ".join(words)  # 20k+ characters with no structure: the kept text is trimmed many times
    tracker = matcher()
    assert all(tracker.feed(calm[i:i + 3]) is None for i in range(0, len(calm), 3))
    found = first_chant([SENTENCE] * 12, tracker)
    assert found == 9
    assert tracker.state_size == 0  # the chant restarted the tracking


def test_a_clone_goes_its_own_way(matcher):
    tracker = matcher()
    first_chant([SENTENCE] * 6, tracker)
    twin = tracker.clone()
    assert first_chant([SENTENCE] * 4, twin) == 3
    # The original never saw the twin's four: it needs four of its own.
    assert first_chant([SENTENCE] * 3, tracker) is None
    assert first_chant([SENTENCE], tracker) == 0


def test_characters_beyond_latin_are_compared_exactly(matcher):
    line = "同じ文を何度も繰り返しています。もう一度試します 🙂🔁 "
    assert first_chant([line] * 3 + [line.replace("🙂", "🙃")] * 7, matcher()) is None
    found = None
    tracker = matcher()
    for _ in range(30):
        found = found or tracker.feed(line)
    assert found is not None and line.strip() in found.repeated + found.repeated


def test_threshold_can_change_between_messages(matcher):
    tracker = matcher(threshold=10, max_threshold=14)
    tracker.threshold = 14
    assert first_chant([SENTENCE] * 13, tracker) is None
    assert first_chant([SENTENCE], tracker) == 0


def test_chunk_size_must_be_positive(matcher):
    with pytest.raises(ValueError):
        matcher(chunk_size=0)


def test_memory_is_given_back_on_reset(matcher):
    import tracemalloc

    # The plain matcher holds more (a Python object per character and window) and is slower under tracemalloc:
    # fewer trackers show the same.
    count = 200 if matcher is not PureTracker else 20
    tracemalloc.start()
    try:
        trackers = [matcher() for _ in range(count)]
        baseline = tracemalloc.get_traced_memory()[0]
        rng = random.Random(2)
        prose = " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(6)) for _ in range(600))
        for tracker in trackers:
            tracker.feed(prose)  # a long run without repeats: each tracker's index grows to its cap
        grown = tracemalloc.get_traced_memory()[0]
        for tracker in trackers:
            tracker.reset()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert grown - baseline > count * 50_000
    assert after - baseline < count * 1_000


@pytest.mark.parametrize("blank", [
    " " * 60 + "\n",  # indentation alone
    "\n" * 60,  # runs of empty lines
    "\t\t\t\t\t\t\t\t\t\t\t\t\n" * 6,
    " " * 300,  # a line of nothing but spaces, longer than the classification window
])
def test_blank_text_is_never_chanting(matcher, blank):
    assert first_chant([blank] * 40, matcher()) is None


def test_a_long_traceback_with_deep_indentation_is_not_chanting(matcher):
    frames = "".join(f"{' ' * 48}File \"/srv/app/module_{i}.py\", line {i * 7}, in handler_{i}\n"
                     f"{' ' * 52}result = dispatch(request, context)\n" for i in range(40))
    assert first_chant([frames[i:i + 5] for i in range(0, len(frames), 5)], matcher()) is None


def test_white_space_runs_count_as_one_so_a_chant_spread_with_spaces_is_found(matcher):
    # The excerpt of a chant is never blank, and padding does not hide the chant.
    tracker = matcher()
    found = None
    for _ in range(12):
        found = found or tracker.feed("I will    check the file again    now.   " + " " * 20 + "\n")
    assert found is not None and found.repeated.strip()


QUOTED_TRACEBACK = (
    "The run failed here:\n\nTraceback (most recent call last):\n  File \"/app/report.py\", line 12, in <module>\n"
    "    totals = summarise(load_rows(path), by=\"region\", include_archived=False)\n"
    "             " + "^" * 68 + "\n"
    "  File \"/app/report.py\", line 7, in summarise\n    return {key: sum(row[key] for row in rows)}\n"
    "                      ~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    "KeyError: 'region'\n\nThe rows carry `Region`, not `region`; I will change the key.\n")


def test_a_traceback_quoted_with_its_caret_lines_is_not_chanting(matcher):
    assert first_chant(list(QUOTED_TRACEBACK), matcher()) is None
    assert first_chant([QUOTED_TRACEBACK], matcher()) is None


@pytest.mark.parametrize("line", ["^" * 80, "~" * 60 + "^" * 20, "." * 70, "!" * 55, "…" * 52, "═" * 60, "•" * 51])
def test_a_line_of_one_repeated_symbol_restarts_the_tracking_like_a_divider(matcher, line):
    sentence = SENTENCE.strip() + "\n"
    assert first_chant([line + "\n"] * 15, matcher()) is None
    assert first_chant([sentence] * 9 + [line + "\n"] + [sentence] * 9, matcher()) is None
    assert first_chant([sentence] * 9 + ["a line of prose\n"] + [sentence] * 9, matcher()) is not None


# Out of the windows' reach: a short line said over and over, a long block repeated, a degenerate run.

def test_a_short_line_said_over_and_over_is_chanting(matcher):
    found = matcher()
    position = next(i for i, delta in enumerate(["OK.\n"] * 12) if found.feed(delta) is not None)
    assert position == 9  # the 10th time, CONTENT_LOOP_THRESHOLD
    tracker = matcher()
    chants = [tracker.feed(delta) for delta in ["I will try again.\n", "\n"] * 10]
    assert [c for c in chants if c] == [content_rule.Chant("I will try again.", 10)]
    assert first_chant(["OK.\n"] * 9 + ["Done with that.\n"] + ["OK.\n"] * 9, matcher()) is None
    # A list item, heading or table row starts the tracking afresh, as for the windows.
    assert first_chant(["- OK\n"] * 15, matcher()) is None
    assert first_chant(["| ok | ok |\n"] * 15, matcher()) is None


LONG_LINES = ["I open the settings module again to compare each field with the schema it must follow.\n",
              "The loader reads the file from the working directory, not from the path given on the command line.\n",
              "So the values in the test fixture never reach the parser, and the defaults are used instead.\n",
              "Let me check whether the environment variable overrides the path before the loader runs at all.\n",
              "If it does, the fixture should set it, and the assertion about the timeout would then hold.\n",
              "I will look at how the configuration object is built in the application factory to be sure.\n"]


def test_a_block_of_lines_repeated_three_times_back_to_back_is_chanting(matcher):
    block = "".join(LONG_LINES)  # 600 characters: its repeats are too far apart for the windows
    assert first_chant([block] * 2, matcher()) is None
    tracker = matcher()
    found = [tracker.feed(line) for line in LONG_LINES * 3]
    assert found.index(next(c for c in found if c)) == 17  # the last line of the third copy
    chant = next(c for c in found if c)
    assert chant.occurrences == 3 and chant.repeated.startswith("I open the settings") and chant.repeated.count("\n") == 5
    # A block of four lines, or copies with a line changed, are not; nor is a block that is two lines said
    # over and over (that is the windows' to find, if they do).
    assert first_chant(LONG_LINES[:4] * 4, matcher()) is None
    assert first_chant(LONG_LINES[:2] * 9, matcher()) is None
    changed = LONG_LINES[:5] + ["This time I read the schema first, then the settings module.\n"]
    assert first_chant(LONG_LINES + changed + LONG_LINES, matcher()) is None


@pytest.mark.parametrize("unit", ["!", "=-", "?!", "0", "…", "ha ", "<br>", "-+-+-+-*"])
def test_a_degenerate_run_of_any_unit_is_chanting(matcher, unit):
    times = -(-2000 // len(unit))
    # Inside code, where the windows count nothing, at DEGENERATE_CHARS; as a line of its own, by then at the
    # latest (a divider's shape is counted by nothing else; a line of prose is by the windows, sooner).
    assert first_chant(["```\n"] + [unit] * times, matcher()) == times
    assert first_chant(["```\n"] + [unit] * (1990 // len(unit)) + ["\n"], matcher()) is None
    assert 0 < first_chant([unit] * times, matcher()) <= times


def test_a_degenerate_run_across_code_lines_is_chanting_and_long_dividers_are_not(matcher):
    assert first_chant(["```\n"] + ["0\n"] * 1200, matcher()) == 1000
    assert first_chant(["-" * 1500 + "\n", "Next part.\n"] * 4, matcher()) is None
    assert first_chant([" " * 5000, "\t" * 3000, "\n" * 3000], matcher()) is None  # blank is never chanting


# The two matchers: the compiled one held to the plain one (the rule as written), call by call.

FRAGMENTS = ["ab", "ab ", "ba", "a", "b", " ", "   ", "\t", "\n", "\n\n", "\r\n", "again ", "check the file. ",
             "- ", "* ", "+ ", "1. ", "12) ", "7", "# ", "##", "> ", "| ", "```", "~~~", "`", "---", "^^^", "~~~^^",
             "...", "!!!", "══", "╭─", "é", "同じ", "🙂", "x = 1", "#" * 7]


def texts(max_size: int):
    """Text made of the pieces the rule reacts to: repeats, white space runs, every kind of line start."""
    return st.one_of(st.lists(st.sampled_from(FRAGMENTS), max_size=max_size // 4).map("".join),
                     st.text(alphabet="ab \n\t-*#`~|>1.)^═🙂", max_size=max_size))


OPERATIONS = st.one_of(
    st.tuples(st.just("feed"), texts(60)),
    st.tuples(st.just("repeat"), st.tuples(texts(30), st.integers(min_value=2, max_value=14))),
    st.tuples(st.just("end_message"), st.none()),
    st.tuples(st.just("reset"), st.none()),
    st.tuples(st.just("clone"), st.none()),
    st.tuples(st.just("switch"), st.integers(min_value=0, max_value=7)),
    st.tuples(st.just("threshold"), st.integers(min_value=1, max_value=9)),
)


def same_step(pair, call):
    """Make the same call on both matchers and hold them to the same answer and the same state held."""
    compiled, pure = pair
    expected, got = call(pure), call(compiled)
    assert got == expected
    assert type(got) is type(expected)
    assert compiled.state_size == pure.state_size
    return got


@needs_compiled
@given(st.integers(min_value=1, max_value=12), st.integers(min_value=1, max_value=6),
       st.one_of(st.none(), st.integers(min_value=0, max_value=10)), st.lists(OPERATIONS, max_size=40))
@settings(max_examples=600, deadline=None)
def test_the_compiled_matcher_gives_the_plain_ones_verdicts(chunk_size, threshold, max_threshold, operations):
    # Short windows and low thresholds make chants common and trims frequent; every feed, end of message, reset
    # and clone is compared, with the threshold changed on the way (beyond max_threshold too).
    pairs = [(_content.ContentTracker(chunk_size, threshold, max_threshold),
              PureTracker(chunk_size, threshold, max_threshold))]
    current = 0
    for operation, argument in operations:
        pair = pairs[current]
        if operation == "feed":
            same_step(pair, lambda tracker: tracker.feed(argument))
        elif operation == "repeat":
            text, times = argument
            for _ in range(times):
                same_step(pair, lambda tracker: tracker.feed(text))
        elif operation == "end_message":
            same_step(pair, lambda tracker: tracker.end_message())
        elif operation == "reset":
            same_step(pair, lambda tracker: tracker.reset())
        elif operation == "clone":
            pairs.append((pair[0].clone(), pair[1].clone()))
            current = len(pairs) - 1
        elif operation == "switch":
            current = argument % len(pairs)
        else:
            for tracker in pair:
                tracker.threshold = argument
        assert pair[0].threshold == pair[1].threshold and pair[0].chunk_size == pair[1].chunk_size


@needs_compiled
@given(st.text(alphabet="abc \n", min_size=1, max_size=3000), st.sampled_from([(3, 2), (4, 3), (5, 4), (8, 10)]),
       st.lists(st.integers(min_value=1, max_value=3000), max_size=60))
@settings(max_examples=300, deadline=None)
def test_the_matchers_agree_on_long_text_split_anywhere(text, size_and_threshold, cuts):
    # Long prose of few letters: many windows recur, far apart and close together, through many trims.
    size, threshold = size_and_threshold
    pair = (_content.ContentTracker(size, threshold), PureTracker(size, threshold))
    start = 0
    for bound in sorted({c for c in cuts if c < len(text)}) + [len(text)]:
        same_step(pair, lambda tracker: tracker.feed(text[start:bound]))
        start = bound
    same_step(pair, lambda tracker: tracker.end_message())


@needs_compiled
@given(st.lists(st.tuples(st.sampled_from(["```\n", "!", "=-", "ab", "0\n", " ", "\n", "x!", "-" * 40]),
                          st.integers(min_value=1, max_value=700)), max_size=12),
       st.integers(min_value=1, max_value=9))
@settings(max_examples=200, deadline=None)
def test_the_matchers_agree_on_degenerate_runs(pieces, step):
    # Runs near DEGENERATE_CHARS of short units, in and out of code, broken by prose, fed in any steps.
    text = "".join(piece * times for piece, times in pieces)
    pair = (_content.ContentTracker(), PureTracker())
    for start in range(0, len(text), step * 97):
        same_step(pair, lambda tracker: tracker.feed(text[start:start + step * 97]))
    same_step(pair, lambda tracker: tracker.end_message())


@needs_compiled
@given(st.one_of(texts(300), st.sampled_from(["", " " * 300, "#" * 6, "~~", "``", "123", "4.", "-" * 300])),
       st.booleans(), st.booleans())
@settings(max_examples=1000, deadline=None)
def test_the_compiled_classification_is_the_rules(line, complete, in_code):
    # The compiled matcher keeps its own copy of the classification, for speed; it must stay the rule's.
    line = line.split("\n")[0] if complete else line.replace("\n", "")
    assert _content.classify(line, complete, in_code) == content_rule.classify(line, complete, in_code)


def test_the_matcher_in_use_is_the_compiled_one_when_built():
    in_use = _content is not None and os.environ.get("LOOPWARDEN_NO_EXTENSIONS") != "1"  # unless told otherwise
    assert content.COMPILED == in_use
    assert content.ContentTracker is (_content.ContentTracker if in_use else PureTracker)
    assert content.Chant is content_rule.Chant and content.GAP_CHUNKS == content_rule.GAP_CHUNKS


def _run(args: list[str], pure: bool) -> subprocess.CompletedProcess:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("LOOPWARDEN_")}
    if pure:
        environment["LOOPWARDEN_PURE_CONTENT"] = "1"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=environment,
                          cwd=Path(__file__).parent.parent, check=False)


def test_the_environment_can_force_the_plain_matcher():
    shown = _run(["-c", "from proxy.detect import content; print(content.COMPILED, content.ContentTracker.__module__)"],
                 pure=True)
    assert shown.stdout.split() == ["False", "proxy.detect.content_rule"], shown.stderr
    every = subprocess.run([sys.executable, "-c", "from proxy.detect import content; print(content.COMPILED)"],
                           capture_output=True, text=True, cwd=Path(__file__).parent.parent, check=False,
                           env={**{k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")},
                                "LOOPWARDEN_NO_EXTENSIONS": "1"})
    assert every.stdout.split() == ["False"], every.stderr  # the switch for every compiled part covers this one


@needs_compiled
@pytest.mark.parametrize("settings_", [[], ["--set", "content_chunk_size=8", "--set", "content_loop_threshold=2"],
                                       ["--set", "content_chunk_size=8", "--set", "content_loop_threshold=3"]],
                         ids=["defaults", "chunk 8, threshold 2", "chunk 8, threshold 3"])
def test_replay_of_the_real_run_corpus_is_the_same_with_either_matcher(settings_):
    # The real runs in tests/corpus (3 MB of agents' text); the smallest chunk and threshold make the content
    # layer find dozens of chants there, the defaults none.
    command = ["-m", "proxy", "replay", "tests/corpus", "--format", "json", *settings_]
    compiled, pure = _run(command, pure=False), _run(command, pure=True)
    assert compiled.returncode == pure.returncode == 0, compiled.stderr + pure.stderr
    assert compiled.stdout == pure.stdout
    assert f'"conversations": {len(list(Path("tests/corpus").rglob("*.json"))) - 1}' in compiled.stdout
    if settings_:
        assert '"type": "content"' in compiled.stdout
