"""CrewAI (1.15) and the OpenHands SDK (1.58), unchanged and at their defaults, stuck on one read through
loopwarden with its default ladder. Each has a guard of its own (CrewAI raises at the 5th identical call, the
OpenHands StuckDetector ends the run at the 4th): loopwarden's first warning reaches the model before either,
and is logged. Their environments are large (about 1 GB and 700 MB; OpenHands needs Python 3.12), so they are
installed by `make agents-frameworks`, not by `make test`; without them these checks are skipped, saying so."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest

from tests.agents.test_cline_mastra import agent_turns, stuck_on, warnings_per_request
from tests.agents.test_reasoning_clients import ROOT, detections

FRAMEWORKS = ROOT / ".venv-frameworks"
HERE = Path(__file__).parent


async def framework(name: str, script: str, base_url: str, path: Path) -> dict:
    python = FRAMEWORKS / name / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{name} is not installed ({python} missing): make agents-frameworks installs it")
    process = await asyncio.create_subprocess_exec(
        str(python), str(HERE / script), base_url, str(path), cwd=path.parent,
        env={"PATH": os.environ["PATH"], "HOME": str(path.parent)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    output, errors = await asyncio.wait_for(process.communicate(), timeout=300)
    assert process.returncode == 0, errors.decode()[-3000:]
    return orjson.loads(output.decode().strip().splitlines()[-1])


def notes(tmp_path: Path) -> Path:
    path = tmp_path / "notes.md"
    path.write_text("| a | b |\n|---|---|\n| 4 | 5 |\n")
    return path


async def test_crewai_is_warned_twice_before_its_own_guard_raises(upstream, proxy_factory, tmp_path):
    proxy = await proxy_factory(upstream.url, preset="default")
    path = notes(tmp_path)
    upstream.responder = stuck_on("read_file", {"path": str(path)})
    result = await framework("crewai", "crewai_read.py", proxy.url, path)
    # CrewAI's guard raised after the tool ran 5 times alike, before a 6th request (which loopwarden would refuse).
    assert result["ran"] == 5 and any("5 times" in error for error in result["errors"]), result
    assert warnings_per_request(agent_turns(upstream, "/v1/chat/completions")) == [0, 0, 0, 1, 2]
    rows = sorted((r["episode"], r["type"], r["action"]) for r in await detections(proxy, 2))
    assert rows == [(1, "tool_call", "warned"), (2, "tool_call", "warned")]


async def test_openhands_is_warned_before_its_stuck_detector_ends_the_run(upstream, proxy_factory, tmp_path):
    proxy = await proxy_factory(upstream.url, preset="default")
    path = notes(tmp_path)
    upstream.responder = stuck_on("file_editor", {"command": "view", "path": str(path)})
    result = await framework("openhands", "openhands_read.py", proxy.url, path)
    assert (result["status"], result["actions"]) == ("stuck", 4), result
    # The request after the 3rd identical view carried the first warning; the 4th view ended the run.
    assert warnings_per_request(agent_turns(upstream, "/v1/chat/completions")) == [0, 0, 0, 1]
    rows = [(r["episode"], r["type"], r["action"]) for r in await detections(proxy, 1)]
    assert rows == [(1, "tool_call", "warned")]
