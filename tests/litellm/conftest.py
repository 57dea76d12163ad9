"""LiteLLM's proxy, run from its own command line with loopwarden's guardrail in its config.yaml, in front of the
scripted upstream (tests/fake_upstream.py, on a thread of its own), driven by the `openai` SDK."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.agents import REQUIRE_AGENTS
from tests.agents.scripted_upstream import SENTENCE
from tests.fake_upstream import FakeUpstream, Turn

LITELLM = shutil.which("litellm", path=str(Path(sys.executable).parent))
MASTER_KEY = "sk-loopwarden-test-master"
TOOL = "read_file"

if LITELLM is None:
    if REQUIRE_AGENTS:
        raise RuntimeError("LiteLLM's proxy is not installed: `make litellm-check` installs it (.venv-litellm)")
    pytest.skip("LiteLLM's proxy is not installed here: `make litellm-check` installs it and runs these",
                allow_module_level=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ScriptedModels:
    """The scripted upstream on its own loop and thread, answering by model: `loop` always calls the same tool,
    `chant` streams one sentence until cut, `flaky` fails its first request (for LiteLLM's retries), `broken`
    always fails (for its fallbacks), anything else answers in plain text."""

    def __init__(self) -> None:
        self.upstream = FakeUpstream()
        self.upstream.responder = self.answer
        self.flaky_seen = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def answer(self, body: dict) -> Turn:
        model = body.get("model")
        if model == "loop":
            return Turn(tool_calls=[(TOOL, {"path": "/tmp/a.txt"})], chunk_chars=5)
        if model == "chant":
            return Turn(content=SENTENCE * 200, chunk_chars=6, delay=0.005)
        if model == "flaky":
            self.flaky_seen += 1
            if self.flaky_seen == 1:
                return Turn(status=500, error={"error": {"message": "try again", "type": "server_error"}})
        if model == "broken":
            return Turn(status=500, error={"error": {"message": "down", "type": "server_error"}})
        return Turn(content="All done: the file holds the configuration.")

    def start(self) -> "ScriptedModels":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.upstream.start(), self.loop).result(10)
        return self

    def bodies(self, model: str) -> list[dict]:
        return [r.json for r in list(self.upstream.requests) if r.path.endswith("/chat/completions")
                and r.json.get("model") == model]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.upstream.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


CONFIG = """\
model_list:
{models}
litellm_settings:
  num_retries: 0
  fallbacks: [{{"broken": ["answer"]}}]
router_settings:
  retry_policy: {{"InternalServerErrorRetries": 2}}
guardrails:
  - guardrail_name: loopwarden
    litellm_params:
      guardrail: proxy.integrations.litellm.LoopwardenGuardrail
      mode: [pre_call, post_call]
      default_on: true
general_settings:
  master_key: {master_key}
"""
MODEL = """\
  - model_name: {name}
    litellm_params:
      model: openai/{name}
      api_base: {base}
      api_key: upstream-key
"""


class LiteLLMProxy:
    """LiteLLM's proxy as a process, from its command line."""

    def __init__(self, workdir: Path, upstream_url: str, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        models = "".join(MODEL.format(name=name, base=upstream_url)
                         for name in ("loop", "chant", "answer", "flaky", "broken"))
        config = workdir / "config.yaml"
        config.write_text(CONFIG.format(models=models, master_key=MASTER_KEY))
        self.log = open(workdir / "litellm.log", "wb")
        environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
        environ.update({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
                        "PYTHONPATH": str(Path(__file__).parents[2]), **env})
        self.process = subprocess.Popen([LITELLM, "--config", str(config), "--host", "127.0.0.1",
                                         "--port", str(self.port)], cwd=workdir, env=environ,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        self.workdir = workdir

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"LiteLLM's proxy exited: {(self.workdir / 'litellm.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health/liveliness", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("LiteLLM's proxy did not come up")

    def output(self) -> str:
        return (self.workdir / "litellm.log").read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="session")
def models():
    scripted = ScriptedModels().start()
    yield scripted
    scripted.stop()


def _proxy(tmp_path_factory, models: ScriptedModels, name: str, env: dict[str, str]):
    workdir = tmp_path_factory.mktemp(name)
    env = {"LOOPWARDEN_DATABASE_URL": f"sqlite+aiosqlite:///{workdir / 'loopwarden.db'}", **env}
    proxy = LiteLLMProxy(workdir, models.upstream.url, env)
    try:
        proxy.wait_ready()
    except BaseException:
        proxy.stop()
        raise
    proxy.database_url = env["LOOPWARDEN_DATABASE_URL"]
    return proxy


@pytest.fixture(scope="session")
def litellm_proxy(tmp_path_factory, models):
    proxy = _proxy(tmp_path_factory, models, "enforce", {})
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def failing_db_proxy(tmp_path_factory, models):
    """The log on a PostgreSQL nobody listens on."""
    proxy = _proxy(tmp_path_factory, models, "failing-db",
                   {"LOOPWARDEN_DATABASE_URL": f"postgresql+asyncpg://nobody@127.0.0.1:{free_port()}/none"})
    yield proxy
    proxy.stop()
