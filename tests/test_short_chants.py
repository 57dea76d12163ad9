"""Short chants: a unit of a few short lines (what the model means to do, a tool's name, a one-word answer) said
over and over in an answer of a few hundred characters, too short a period for the windows and too few lines for
the blocks. Caught in the answer and in the reasoning, on both matchers and through the proxy; what only looks
like it (a refrain, a list, a table, code, a quoted log) is not."""

from __future__ import annotations

import openai
import pytest

from proxy.detect.content_rule import ContentTracker as PureTracker
from proxy.detect.content_rule import short_unit_copies
from tests.fake_upstream import Turn
from tests.test_served_episodes import logged

from tests.test_content import _content, needs_compiled

# Real shapes of this loop: a model narrating a step it never takes, or taking it in words only.
CHECKING = "I'll check the file.\nread_file\nOK\n"  # 34 characters
TESTING = "Let me run the tests again to see.\nrun_tests\nStill failing.\n"  # 60
WAITING = "Waiting for the build to finish.\nbuild status: pending\n"  # 56
FIXING = "I need to fix the import in utils.py.\nedit_file\nDone.\nNow rerun.\n"  # 66


@pytest.fixture(scope="module", params=[
    pytest.param("compiled", marks=needs_compiled),
    "pure"])
def matcher(request):
    return _content.ContentTracker if request.param == "compiled" else PureTracker


def chant_at(text: str, matcher, piece: int = 7) -> int | None:
    """Where a chant completes, in characters, feeding the text in token-sized pieces (None: it does not)."""
    tracker = matcher()
    for start in range(0, len(text), piece):
        if tracker.feed(text[start:start + piece]) is not None:
            return start + piece
    return len(text) if tracker.end_message() is not None else None


@pytest.mark.parametrize("unit", [CHECKING, TESTING, WAITING, FIXING])
def test_a_short_unit_said_eight_times_is_a_chant_at_its_eighth_copy(matcher, unit):
    assert short_unit_copies(10) == 8
    assert chant_at(unit * 7, matcher) is None
    where = chant_at(unit * 10, matcher, piece=1)
    assert len(unit) * 8 - 2 < where <= len(unit) * 8  # the eighth copy's last line completes it
    # Whole answers of a few hundred characters: nothing but the unit.
    assert 250 < len(unit * 8) < 600 and chant_at(unit * 8, matcher) is not None


def test_what_is_reported_is_the_unit_and_how_often_it_came(matcher):
    tracker = matcher()
    found = [tracker.feed(line + "\n") for line in (TESTING * 9).splitlines()]
    chant = next(c for c in found if c is not None)
    assert chant.repeated == TESTING.strip() and chant.occurrences == 8


def test_after_an_introduction_and_split_anywhere_it_is_the_same_chant(matcher):
    intro = ("The tests failed on the import of `parse_config`. I will look at the module and try to fix it, then "
             "run the tests again until they pass.\n\n")
    assert chant_at(intro + CHECKING * 8, matcher, piece=3) is not None
    assert chant_at(intro + CHECKING * 7 + "The file had a typo on line 3; fixed it.\n", matcher) is None


HEALTHY = {
    "a refrain sung three times, a stanza four": (
        "Row, row, row your boat,\nGently down the stream.\n" * 3 + "\n"
        + "Merrily, merrily, merrily, merrily,\nLife is but a dream.\n" * 4),
    "Done. twice": "I updated the parser and the tests.\nDone.\nDone.\n",
    "similar bullets with different content": "".join(
        f"- Checked `{name}`: OK\n- Read `{name}`: 12 lines\n" for name in
        ("a.py", "b.py", "c.py", "d.py", "e.py", "f.py", "g.py", "h.py", "i.py", "j.py")),
    "a numbered list of the same step": "".join(f"{i}. read_file\n{i + 1}. OK\n" for i in range(1, 30, 2)),
    "a table with repeated rows and separators": "| step | tool | result |\n|---|---|---|\n" + (
        "| check | read_file | OK |\n|---|---|---|\n" * 12),
    "a summary table with a wide notes column": (
        "## Summary Table\n\n| Area | Status | Notes/Suggestions" + " " * 66 + "|\n"
        "|---------------------|-------------|" + "-" * 83 + "|\n"
        "| Objective | ✅ Clear | |\n| Breakdown | ✅ Good | Split the CLI flags from the prompts. |\n"),
    "a log quoted in a code block": "The service log shows the retries:\n```\n" + (
        "Retrying connection to db:5432...\nConnection refused\n" * 12) + "```\nThe database is down.\n",
    "repeated code lines": "```js\nimport x from 'x'\n" + "  }\n}\n" * 12 + "import y from 'y'\n" * 10 + "```\n",
    "two long lines said nine times": (
        "I open the settings module again to compare each field with the schema it must follow.\n"
        "The loader reads the file from the working directory, not from the path given on the command line.\n") * 9,
    "headings between the same short steps": "".join(
        f"## Step {i}\nI'll check the file.\nread_file\nOK\n" for i in range(1, 11)),
}


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_what_only_looks_like_a_short_chant_is_not_one(matcher, name):
    assert chant_at(HEALTHY[name], matcher) is None


def test_the_count_follows_the_content_threshold():
    assert [short_unit_copies(t) for t in (2, 3, 5, 10, 20)] == [2, 3, 4, 8, 16]
    assert chant_at(CHECKING * 15, lambda: PureTracker(threshold=20)) is None  # lenient where a person asked for it
    assert chant_at(CHECKING * 4, lambda: PureTracker(threshold=5)) is not None  # the strict preset's 5: 4 copies


# Through the proxy: a streamed answer and a streamed reasoning, each nothing but the unit said over and over.

def client(proxy, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test-1", max_retries=0,
                              default_headers={"X-Loopwarden-Session": session})


@pytest.mark.parametrize("channel", ["content", "reasoning"])
async def test_a_short_chant_streamed_is_cut_at_its_eighth_copy(upstream, proxy, channel):
    if channel == "content":
        upstream.script.append(Turn(content=TESTING * 20, chunk_chars=5))
    else:
        upstream.script.append(Turn(thinking=TESTING * 20, thinking_chars=5, content="The tests pass."))
    text = ""
    async with client(proxy, f"short-{channel}") as openai_client:
        stream = await openai_client.chat.completions.create(
            model="qwen3", messages=[{"role": "user", "content": "Make the tests pass."}], stream=True)
        async for chunk in stream:
            for choice in chunk.choices:
                extra = choice.delta.model_extra or {}
                text += (choice.delta.content or "") if channel == "content" else extra.get("reasoning_content") or ""
    assert TESTING * 7 in text and TESTING * 9 not in text
    (row,) = await logged(proxy, f"short-{channel}", 1)
    assert (row["type"], row["action"], row["detail"]["occurrences"]) == ("content", "cut", 8)
    assert row["detail"].get("channel") == ("reasoning" if channel == "reasoning" else None)
