"""Gemini CLI itself (`gemini -p ... --yolo`, pinned in the Makefile) as an API-key user pointed at loopwarden with
GOOGLE_GEMINI_BASE_URL, in a project holding a failing Python test, in front of a scripted Gemini model that runs
the test, reads calc.py, runs the test again, and so on. It runs with the other real-agent checks
(`make agents-check`), which install it with npm."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.agents import REQUIRE_AGENTS
from tests.fake_upstream import Turn
from tests.test_log_api import wait_for

GEMINI = Path(__file__).parents[2] / ".venv-agents" / "node" / "node_modules" / ".bin" / "gemini"
pytestmark = pytest.mark.skipif(not GEMINI.exists() and not REQUIRE_AGENTS,
                                reason="Gemini CLI is not installed (make agents-check installs it with npm)")

CALC = "def add(a, b):\n    return a - b\n"
TEST_CALC = ("import unittest\n\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
             "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n\n\nunittest.main()\n")
RUN_TESTS = ("run_shell_command", {"command": "python3 test_calc.py", "description": "Run the tests"})
READ_CALC = ("read_file", {"file_path": "calc.py"})
ANSWER = "The test fails because add() subtracts: it should return a + b."


def project(tmp_path: Path, calc: str = CALC) -> tuple[Path, Path]:
    """A home holding the API-key settings, and a project holding a failing test (`calc`: its calc.py)."""
    home, workdir = tmp_path / "home", tmp_path / "calc"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text('{"security": {"auth": {"selectedType": "gemini-api-key"}}}')
    workdir.mkdir()
    (workdir / "calc.py").write_text(calc)
    (workdir / "test_calc.py").write_text(TEST_CALC)
    return home, workdir


async def run_gemini(root: str, prompt: str, tmp_path: Path, calc: str = CALC) -> tuple[int, str, str]:
    """Gemini CLI's exit status, stdout and stderr."""
    if not GEMINI.exists():
        pytest.fail(f"no Gemini CLI at {GEMINI}: make agents-check installs it with npm")
    home, workdir = project(tmp_path, calc)
    # The project's test runs with this interpreter, whatever HOME says to a version manager's shims; the
    # CLI's error reports go to the test's own temporary directory.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {"PATH": path, "HOME": str(home), "TMPDIR": str(tmp_path), "TERM": "dumb",
           "GEMINI_API_KEY": "gemini-cli-key", "GOOGLE_GEMINI_BASE_URL": root, "GEMINI_CLI_TRUST_WORKSPACE": "true"}
    process = await asyncio.create_subprocess_exec(
        str(GEMINI), "-p", prompt, "--yolo", cwd=workdir, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        output, errors = await asyncio.wait_for(process.communicate(), timeout=120)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode, output.decode(), errors.decode()


def _fill(schema: dict):
    """A value of the JSON schema a side request asks for (the router's complexity score)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = str(schema.get("type", "")).lower()
    if kind == "object":
        return {name: _fill(inner) for name, inner in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    return "A short task."


def side_answer(body: dict) -> Turn:
    """Gemini CLI's side requests (the router; no tools, JSON mode) answered as their schema asks."""
    config = body.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    return Turn(content=orjson.dumps(_fill(schema)).decode() if schema else "ok")


def responses(body: dict) -> int:
    return sum(1 for content in body["contents"] for part in content.get("parts", []) if "functionResponse" in part)


def main_turns(upstream) -> list[dict]:
    """The agent's own turns (streamed, with its tools), not its side requests."""
    return [r.json for r in upstream.gemini_requests
            if r.path.endswith(":streamGenerateContent") and r.json.get("tools")]


def warnings_after_responses(body: dict) -> list[str]:
    """The loopwarden warnings in `body`, each placed after the function response it follows."""
    found = []
    for content in body["contents"]:
        parts = content.get("parts", [])
        for before, part in zip(parts, parts[1:]):
            if "functionResponse" in before and part.get("text", "").startswith("[loopwarden]"):
                found.append(part["text"])
    return found


async def detections(root: str) -> list[dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{root}/loopwarden/api/detections") as response:
            return (await response.json())["data"]


def warnings(body: dict) -> list[str]:
    return [part["text"] for content in body["contents"] for part in content.get("parts", [])
            if part.get("text", "").startswith("[loopwarden]")]


async def test_gemini_cli_rerunning_a_failing_test_is_warned_then_stopped(upstream, proxy_factory, tmp_path):
    running = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)

    def answer(body: dict) -> Turn:
        if not body.get("tools"):
            return side_answer(body)
        # The test, then calc.py, then the test again: never the same call twice in a row.
        name, arguments = RUN_TESTS if responses(body) % 2 == 0 else READ_CALC
        return Turn(tool_calls=[(name, arguments)])

    upstream.responder = answer
    status, output, errors = await run_gemini(running.root, "Make the tests pass", tmp_path)
    assert status == 1, (output, errors)
    assert "Error when talking to Gemini API" in errors
    assert "[loopwarden] Loop detected (tool_error): `run_shell_command`" in errors
    assert "failed 5 times with the same error" in errors

    seen = main_turns(upstream)
    assert len(seen) == 9  # five test runs, four reads; the answer to the fifth run never reached the upstream
    assert [len(warnings(body)) for body in seen] == [0, 0, 0, 0, 0, 1, 1, 2, 2]
    # The first warning came with the answer to the third failing run, after its function response, and stayed.
    assert responses(seen[5]) == 5
    (first,) = warnings_after_responses(seen[5])
    assert first.startswith("[loopwarden] Loop detected (1/2): `run_shell_command`")
    assert warnings_after_responses(seen[8])[0] == first
    assert warnings_after_responses(seen[8])[1].startswith("[loopwarden] Loop detected (2/2)")
    # Gemini CLI's own loop check (a cycle repeated 5 times, at the tenth call) never had its turn.
    assert "Potential loop detected" not in str(seen[-1]["contents"])
    assert any(not r.json.get("tools") for r in upstream.gemini_requests)  # its router was asked and answered

    async def logged():
        found = await detections(running.root)
        return found if len(found) >= 3 else None

    found = sorted(await wait_for(logged), key=lambda d: d["episode"])
    assert [(d["type"], d["action"], d["detail"]["api"]) for d in found] == [
        ("tool_error", "warned", "gemini"), ("tool_error", "warned", "gemini"), ("tool_error", "stopped", "gemini")]


async def test_gemini_cli_benign_run_ends_with_its_answer(upstream, proxy_factory, tmp_path):
    running = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)

    def answer(body: dict) -> Turn:
        if not body.get("tools"):
            return side_answer(body)
        return Turn(tool_calls=[RUN_TESTS]) if responses(body) == 0 else Turn(content=ANSWER)

    upstream.responder = answer
    status, output, errors = await run_gemini(running.root, "Why does the test fail?", tmp_path)
    assert status == 0, (output, errors)
    assert ANSWER in output
    assert "[loopwarden]" not in output + errors
    seen = main_turns(upstream)
    assert len(seen) == 2 and "Exit Code: 1" in str(seen[1]["contents"])  # the test really ran, and failed
    assert all(warnings(body) == [] for body in seen)
    assert await detections(running.root) == []


async def test_gemini_cli_stuck_on_one_read_gets_the_default_warning_before_its_own_guard(
        upstream, proxy_factory, tmp_path):
    """Gemini CLI gives up on a call repeated 5 times; the default ladder warns after the 3rd."""
    running = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root, preset="default")

    def answer(body: dict) -> Turn:
        return side_answer(body) if not body.get("tools") else Turn(tool_calls=[READ_CALC])

    upstream.responder = answer
    await run_gemini(running.root, "Make the tests pass", tmp_path)
    seen = main_turns(upstream)
    warned = next(k for k, body in enumerate(seen) if warnings(body))
    assert responses(seen[warned]) == 3  # the answer to the third identical read carried the first warning
    (first_warning,) = warnings_after_responses(seen[warned])
    assert first_warning.startswith("[loopwarden] Loop detected (1/2): you called `read_file`")
    # ...before Gemini CLI's own loop check said anything to the model.
    assert "Potential loop detected" not in str(seen[warned]["contents"])

    async def logged():
        found = await detections(running.root)
        return found or None

    first = min(await wait_for(logged), key=lambda d: d["episode"])
    assert (first["type"], first["action"], first["episode"]) == ("tool_call", "warned", 1)


async def test_gemini_cli_replacing_a_line_that_occurs_twice_with_new_text_each_time(upstream, proxy_factory,
                                                                                      tmp_path):
    """The model reads calc.py, then asks Gemini CLI's `replace` to change a line that occurs twice, with other new
    text each time: Gemini CLI refuses each (`Expected 1 occurrence but found 2`). One call failing the same way,
    whatever it would write: warned at the 3rd refusal and the 4th, stopped at the 5th."""
    running = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    fixes = ("return a + b", "return b + a", "return sum((a, b))", "return int(a) + int(b)", "return a.__add__(b)",
             "return (a + b)")
    project_file = "calc.py"

    def answer(body: dict) -> Turn:
        if not body.get("tools"):
            return side_answer(body)
        done = responses(body)
        if done == 0:
            return Turn(tool_calls=[READ_CALC])
        return Turn(tool_calls=[("replace", {"file_path": project_file, "old_string": "    return a - b",
                                             "new_string": f"    {fixes[(done - 1) % len(fixes)]}",
                                             "instruction": "Make add() add."})])

    upstream.responder = answer
    workdir = tmp_path / "calc"
    status, output, errors = await run_gemini(running.root, "Make the tests pass", tmp_path,
                                              calc="def add(a, b):\n    return a - b\n\n\ndef plus(a, b):\n"
                                                   "    return a - b\n")
    assert status == 1, (output, errors)
    assert "[loopwarden] Loop detected (tool_error): `replace`" in errors, errors
    seen = main_turns(upstream)
    assert [len(warnings(body)) for body in seen] == [0, 0, 0, 0, 1, 2]
    assert "Expected 1 occurrence but found 2" in str(seen[-1]["contents"])
    assert (workdir / project_file).read_text().count("return a - b") == 2  # nothing was written
