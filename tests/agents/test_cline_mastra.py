"""Cline's CLI (`cline --json`, 3.0) and a Mastra agent (`@mastra/core` 0.24), pinned in the Makefile and
unchanged, stuck on one read through loopwarden with its default settings. Cline gives up by itself at the 5th
identical call, Mastra after 5 steps: loopwarden's two warnings (after the 3rd and the 4th read) reach the model
before either, and are logged. With more steps Mastra is stopped by loopwarden (its Responses requests name the
earlier calls only by `item_reference`). `make agents-check` installs both with npm."""

from __future__ import annotations

import orjson
import pytest

from tests.agents.test_reasoning_clients import BIN, ROOT, detections, needs, run
from tests.fake_upstream import Turn

MASTRA_DIR = ROOT / ".venv-agents" / "mastra"
MASTRA_SCRIPT = ROOT / "tests" / "agents" / "mastra_loop.mjs"
WARNING = b"[loopwarden] Loop detected ("


def warnings_per_request(bodies: list[dict]) -> list[int]:
    return [orjson.dumps(body).count(WARNING) for body in bodies]


def stuck_on(tool: str, arguments: dict):
    """A model that calls the same tool alike whenever it is offered, and answers in text otherwise."""
    def answer(body: dict) -> Turn:
        names = [t.get("function", {}).get("name") or t.get("name") for t in body.get("tools") or []]
        return Turn(tool_calls=[(tool, arguments)]) if tool in names else Turn(content="Notes")
    return answer


def agent_turns(upstream, path: str) -> list[dict]:
    return [r.json for r in upstream.requests if r.path == path and r.json.get("tools")]


async def test_cline_is_warned_twice_before_its_own_guard_ends_the_run(upstream, proxy_factory, tmp_path):
    cline = BIN / "cline"
    needs(cline, what="Cline's CLI")
    proxy = await proxy_factory(upstream.url, preset="default")
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    notes = project / "notes.md"
    notes.write_text("| a | b |\n|---|---|\n| 4 | 5 |\n")
    upstream.responder = stuck_on("read_files", {"files": [{"path": str(notes)}]})
    # In-process sessions: by default Cline starts a hub daemon that outlives the run.
    env = {"HOME": str(home), "CLINE_SESSION_BACKEND_MODE": "local"}
    status, _, errors = await run([str(cline), "auth", "-p", "openai", "-k", "sk-local-1", "-m", "gpt-4o", "-b",
                                   proxy.url, "--config", str(home / ".cline")], project, env)
    assert status == 0, errors
    status, output, errors = await run([str(cline), "--config", str(home / ".cline"), "--json",
                                        "Add the two columns of the table in notes.md."], project, env)
    turns = agent_turns(upstream, "/v1/chat/completions")
    # Its guard ends the run at the 5th identical call (exit 0, the call not made); by then the model had both
    # of loopwarden's warnings: after the 3rd read's result and after the 4th.
    assert status == 0 and "consecutive identical calls" in output + errors, output + errors
    assert warnings_per_request(turns) == [0, 0, 0, 1, 2]
    rows = sorted((r["episode"], r["type"], r["action"]) for r in await detections(proxy, 2))
    assert rows == [(1, "tool_call", "warned"), (2, "tool_call", "warned")]


async def mastra(upstream, proxy_factory, tmp_path, api: str, max_steps: int | None) -> tuple[object, dict]:
    needs(MASTRA_DIR / "node_modules" / "@mastra" / "core", what="Mastra")
    proxy = await proxy_factory(upstream.url, preset="default")
    notes = tmp_path / "notes.md"
    notes.write_text("| a | b |\n|---|---|\n| 4 | 5 |\n")
    upstream.responder = stuck_on("read_file", {"path": str(notes)})
    env = {"HOME": str(tmp_path), **({"MAX_STEPS": str(max_steps)} if max_steps else {})}
    # The script is read from stdin beside the installed packages, so that its imports resolve there.
    status, output, errors = await run(["node", "--input-type=module", "-", proxy.url, api, str(notes)],
                                       MASTRA_DIR, env, MASTRA_SCRIPT.read_bytes())
    assert status == 0, errors
    return proxy, orjson.loads(output)


@pytest.mark.parametrize("api, path", [("responses", "/v1/responses"), ("chat", "/v1/chat/completions")])
async def test_mastra_at_its_default_five_steps_is_warned_twice(upstream, proxy_factory, tmp_path, api, path):
    proxy, result = await mastra(upstream, proxy_factory, tmp_path, api, None)
    assert (result["steps"], result["finishReason"], result["ran"]) == (5, "tool-calls", 5)
    assert warnings_per_request(agent_turns(upstream, path)) == [0, 0, 0, 1, 2]
    rows = sorted((r["episode"], r["action"], r["detail"]["api"]) for r in await detections(proxy, 2))
    assert rows == [(1, "warned", api), (2, "warned", api)]


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_mastra_with_more_steps_is_stopped(upstream, proxy_factory, tmp_path, api):
    proxy, result = await mastra(upstream, proxy_factory, tmp_path, api, 10)
    assert result["thrown"].startswith("[loopwarden] Loop detected (tool_call)") and result["status"] == 400
    assert result["ran"] == 5  # the 6th request was refused, and not retried
    rows = sorted((r["episode"], r["action"]) for r in await detections(proxy, 3))
    assert rows == [(1, "warned"), (2, "warned"), (3, "stopped")]
