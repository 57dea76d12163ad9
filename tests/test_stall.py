"""Nothing a client sends can stall the proxy: every rule reads its input in linear time, and a conversation
never seen before is read within a bounded budget. Each check here failed before its fix: an 8,000-digit
error froze every client for seconds, and a long history was folded whole on first sight."""

from __future__ import annotations

import asyncio
import gc
import io
import time

import aiohttp
import orjson
import pytest

from proxy import agents
from proxy.detect import engine, normalize, speakers, steps, text_steps, tools
from proxy.detect.content import ContentTracker
from proxy.detect.engine import DetectConfig, episodes
from tests.convo import analyze, assistant, conversation, neutral, step, user

# A masking or error-form pattern reads 100 KB in a few milliseconds; a backtracking one takes minutes. The bound
# sits far from both, so a busy machine does not fail it and a stall always does.
BOUND_S = 1.0
SIZE = 100_000
RUNS = ["0", "7", "1.", "1:", "1-", "1 ", " ", "\t", "\n", ".", ":", "-", "=", "/", "\\", "a1", "f", "x1", "id ",
        "ID: ", "pid ", "\x1b[", "\x1b]", "line 1", "Error ", "FAILED ", "1 failed, ", "a(", "a:1", " in ", "T1",
        "[", "]", "a[", "]x", "\nAction: ", "Action 1: a[", "Observation 1: ", "Current Task: ", "<session_context>",
        "<read_file>\n", "<a_b>", "</a_b", "[read_file for ", "[a] Result", "1 fail\n", "# fail 1", "ℹ fail ",
        "\nObservation:", "Action: a\nObservation: ", "a@", "a@b:", "quota ", "a.b@", "<function=a>",
        "<parameter=a>", "</parameter>", "<function=a><parameter=b>"]
# The content layer in plain Python reads 100,000 one-character lines in code in about a second on a slow machine
# (each line its own step); a quadratic read of them takes minutes.
CONTENT_BOUND_S = 5.0
PREFIXES = ["", "Error: ", "Traceback (most recent call last)\n", "id: ", "line 1", "exit code ", "FAILED ", "= "]


def adversarial() -> list[str]:
    texts = []
    for run in RUNS:
        body = run * (SIZE // len(run))
        texts += [prefix + body for prefix in PREFIXES]
        texts.append(body + "\n" + body[:2000] + " ms")  # a run that almost ends as a duration
    return texts


def shell_call_target(text: str) -> bytes:
    """What a shell call runs, its command the text: `cd`s, wrappers and options read past."""
    return tools.call_target("bash", orjson.dumps({"command": "cd a && timeout 9 " + text}).decode())


def text_call_target(text: str) -> bytes:
    return tools.call_target(text.split(None, 1)[0] if text.split() else "", text)


def shell_failure(text: str) -> tools.Call:
    """A failed shell call whose output is the text, ended as OpenHands' sandbox ends every result."""
    framed = text + "[Python Interpreter: /usr/bin/python]\nroot@sandbox:/workspace # \n[Command finished with exit code 1]"
    return steps.text_call(text_steps.TextAction("bash", "python3 run.py"), framed, True)


def missing_program(text: str) -> str | None:
    return tools.names_missing_program(text + ": command not found", "bash", '{"command": "update_plan x"}')


@pytest.mark.parametrize("read", [normalize.mask, normalize.is_error_form, normalize.canonical_arguments,
                                  normalize.excerpt, text_steps.read_actions, text_steps.observation_text,
                                  text_steps.is_observation, text_steps.inline_observation, agents.title_of,
                                  text_steps.is_progress_note, tools.shell_target, tools.changes_a_file,
                                  tools.search_words, shell_call_target, text_call_target, tools.numbers_aside,
                                  tools.lines_aside, steps.without_prompt_echo, speakers.person_facts, shell_failure,
                                  tools.is_standing, missing_program],
                         ids=lambda read: read.__name__)
def test_each_masking_and_error_form_reading_is_linear_on_long_runs(read):
    slowest = (0.0, "")
    for text in adversarial():
        began = time.perf_counter()
        read(text)
        slowest = max(slowest, (time.perf_counter() - began, repr(text[:24])))
    assert slowest[0] < BOUND_S, f"{read.__name__} took {slowest[0]:.2f} s on a 100 KB run starting {slowest[1]}"


@pytest.mark.parametrize("run", ["0", " ", "\n", "!", "=-", "abcdefghi", "abcdefgh\n", "a_b\n", "OK.\n",
                                 "- item\n", "| a |\n", "x" * 1999 + "y"])
def test_the_content_layer_is_linear_on_long_runs_in_prose_and_in_code(run):
    # A unit longer than a degenerate one, runs one character short of it, lines that never repeat far enough:
    # every character read once, whichever matcher is in use.
    for opening in ("", "```\n"):
        tracker = ContentTracker()
        began = time.perf_counter()
        tracker.feed(opening + run * (SIZE // len(run)))
        tracker.end_message()
        assert time.perf_counter() - began < CONTENT_BOUND_S, f"{run[:12]!r} after {opening!r}"


def test_a_digit_run_is_still_masked_where_it_is_noise():
    assert normalize.mask("took 12.5 ms at 2026-11-24T01:02:03Z") == "took \x00 at \x00"
    assert normalize.mask("Error: " + "1" * 8000) == "Error: " + "1" * 8000  # a number, not a duration
    assert normalize.mask("line 1234: x") == "line \x00: x"


class _Health:
    """/healthz asked over and over from its own connection while a request is served: the longest wait."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.longest = 0.0
        self.answered = 0

    async def probe(self, done: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as http:
            while not done.is_set():
                began = time.perf_counter()
                async with http.get(f"{self.root}/healthz") as answer:
                    assert answer.status == 200
                self.longest = max(self.longest, time.perf_counter() - began)
                self.answered += 1
                await asyncio.sleep(0.02)


async def _served_while_probed(proxy, body: bytes) -> tuple[int, float, _Health]:
    health = _Health(proxy.root)
    done = asyncio.Event()
    probing = asyncio.create_task(health.probe(done))
    await asyncio.sleep(0.05)
    # The test process holds every earlier test's objects: no part of what this request costs. Frozen, a
    # collection the request's allocations set off walks only what the request made, as in a server's process.
    gc.collect()
    gc.freeze()
    try:
        began = time.perf_counter()
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{proxy.url}/chat/completions", data=io.BytesIO(body), headers={
                    "Content-Type": "application/json", "Authorization": "Bearer sk-stall"}) as answer:
                await answer.read()
                status = answer.status
        took = time.perf_counter() - began
        await asyncio.sleep(0.05)
    finally:
        gc.unfreeze()
    done.set()
    await probing
    return status, took, health


async def test_an_8000_digit_error_is_answered_at_once_and_stalls_no_other_client(upstream, proxy):
    digits = "Error: " + "4" * 8000
    messages = conversation(user("run it"), *[step("run", {"cmd": f"make {k}"}, digits) for k in range(3)],
                            assistant("Result " + "9" * 8000))
    status, took, health = await _served_while_probed(
        proxy, orjson.dumps({"model": "gpt-test", "messages": messages}))
    assert status == 200 and took < 1.0
    assert health.answered >= 2 and health.longest < 0.3, f"/healthz waited {health.longest:.2f} s"


async def test_a_6_mb_history_never_seen_leaves_other_clients_served(upstream, proxy):
    line = "{}. The build reads the configuration file and writes the result {} to the log.\n"
    result = "".join(line.format(k, k * 7919) for k in range(40))  # about 3.3 KB of numbered prose
    parts = [step("read_file", {"path": f"notes/{k}.md"}, result) for k in range(2000)]
    body = orjson.dumps({"model": "gpt-test", "messages": conversation(user("summarise the notes"), *parts)})
    assert len(body) > 6_000_000
    status, _, health = await _served_while_probed(proxy, body)
    assert status == 200
    assert health.answered >= 2 and health.longest < 0.3, f"/healthz waited {health.longest:.2f} s"


def _long_task(loop: list) -> list[dict]:
    work = [step("read_file", {"path": f"src/{k}.py"}, f"contents of module {k}") for k in range(700)]
    return conversation(user("port the modules"), *work, *loop)


def _grown(config: DetectConfig, messages: list[dict]):
    """The fold of every message: the conversation as it grew, request by request, through the cache."""
    read = neutral(messages)
    cache = None
    for end in range(2, len(read) + 1, 2):
        state, cache = engine.analyze(config, read[:end], 0, cache)
    return engine.analyze(config, read, 0, cache)[0]


@pytest.mark.parametrize("loop", [
    [step("read_file", {"path": "cfg.toml"}, "port = 1") for _ in range(7)],
    [step(name, {"q": "x"}, "same") for _ in range(6) for name in ("open", "search")],
    [step("run_tests", {}, "FAILED tests/test_a.py::test_x - assert 1 == 2\n1 failed in 0.1s"),
     step("read_file", {"path": "a.py"}, "x = 1")] * 3,
], ids=["repeated call", "cycle", "error with reads between"])
def test_a_long_task_first_seen_gets_the_verdict_of_reading_every_message(loop):
    config = DetectConfig()
    messages = _long_task(loop)
    assert len(messages) > engine.FIRST_SIGHT_MESSAGES
    first_sight, _ = analyze(config, messages)
    whole = _grown(config, messages)
    found = episodes(config, first_sight)
    assert found  # the loop at the end is seen
    assert first_sight.key == whole.key  # the same task, as the log and the judge name it
    assert [(e.number, e.type, e.message_index, e.step) for e in found] == \
        [(e.number, e.type, e.message_index, e.step) for e in episodes(config, whole)]


def test_first_sight_reads_a_bounded_window_of_a_long_task():
    messages = _long_task([])
    read = neutral(messages)
    begin, state = engine._first_sight(DetectConfig(), read, 0, len(read))
    assert begin >= len(read) - engine.FIRST_SIGHT_MESSAGES and read[begin].role != "tool"
    assert state.start == 2  # the task the person's prompt opened, not one opened at the window
