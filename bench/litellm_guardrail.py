"""What loopwarden's guardrail costs LiteLLM's proxy, measured in one run against the same upstream.

    .venv-litellm/bin/python bench/litellm_guardrail.py [--quick]

Targets, in separate processes on this machine: bench/servers.py's lean upstream, and LiteLLM's proxy three times
in front of it: without a guardrail, with one that does nothing in the same hooks (bench/noop_guardrail.py: what
LiteLLM's guardrail machinery costs), and with loopwarden's. The load comes from this process over
keep-alive connections, the two proxies' requests interleaved; each proxy's CPU time is read from /proc. Needs
LiteLLM's proxy installed (`make litellm-check` installs it into .venv-litellm).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import conversation, cpu_seconds, free_port, ms, pct  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MASTER_KEY = "sk-bench"
CONFIG = """\
model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench
      api_base: {upstream}/v1
      api_key: bench
general_settings:
  master_key: {master_key}
"""
GUARDRAIL = """\
guardrails:
  - guardrail_name: {name}
    litellm_params:
      guardrail: {guardrail}
      mode: [pre_call, post_call]
      default_on: true
"""
GUARDRAILS = {"without": None, "no-op guardrail": "bench.noop_guardrail.NoopGuardrail",
              "loopwarden": "proxy.integrations.litellm.LoopwardenGuardrail"}


def start_litellm(workdir: Path, upstream: str, guardrail: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = workdir / f"config-{port}.yaml"
    config.write_text(CONFIG.format(upstream=upstream, master_key=MASTER_KEY) +
                      (GUARDRAIL.format(name=guardrail.rpartition(".")[2], guardrail=guardrail) if guardrail else ""))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    environ.update({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "PYTHONPATH": str(ROOT),
                    "LOOPWARDEN_DATABASE_URL": f"sqlite+aiosqlite:///{workdir / 'loopwarden.db'}"})
    litellm = shutil.which("litellm", path=str(Path(sys.executable).parent))
    process = subprocess.Popen([litellm, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
                               cwd=workdir, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process, f"http://127.0.0.1:{port}"


async def ready(http: aiohttp.ClientSession, url: str, body: bytes) -> None:
    for _ in range(600):
        try:
            async with http.post(url + "/v1/chat/completions", data=body, headers=HEADERS) as response:
                if response.status == 200:
                    await response.read()
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {MASTER_KEY}"}


async def one(http: aiohttp.ClientSession, url: str, body: bytes) -> float:
    began = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", data=body, headers=HEADERS) as response:
        await response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - began


async def measure(http, targets: dict[str, str], pids: dict[str, int], name: str, bodies: list[bytes],
                  rounds: int) -> None:
    """`rounds` requests to each target, interleaved, cycling through `bodies`: latency and CPU per request."""
    times: dict[str, list[float]] = {target: [] for target in targets}
    cpu = {target: cpu_seconds(pid) for target, pid in pids.items()}
    for i in range(rounds):
        body = bodies[i % len(bodies)]
        order = list(targets.items())
        for target, url in order[i % len(order):] + order[:i % len(order)]:  # each first in turn
            times[target].append(await one(http, url, body))
    cpu = {target: (cpu_seconds(pid) - cpu[target]) / rounds for target, pid in pids.items()}
    bare = statistics.median(times["without"])
    for target in targets:
        p50 = statistics.median(times[target])
        print(f"| {name} | {target} | {ms(p50)} | {ms(pct(times[target], 0.99))} | "
              f"{ms(p50 - bare)} ({(p50 / bare - 1) * 100:+.1f}%) | {cpu[target] * 1000:.2f} | "
              f"{(cpu[target] - cpu['without']) * 1000:+.2f} ({(cpu[target] / cpu['without'] - 1) * 100:+.1f}%) |")


def chat(messages: list[dict], stream: bool = False) -> bytes:
    return orjson.dumps({"model": "bench", "messages": messages, "stream": stream})


async def run(quick: bool, streams_only: bool = False) -> None:
    rounds = 100 if quick else 500
    upstream_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "bench" / "servers.py"), "upstream", str(upstream_port)])
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        processes = {name: start_litellm(workdir, upstream_url, guardrail) for name, guardrail in GUARDRAILS.items()}
        try:
            targets = {name: url for name, (_, url) in processes.items()}
            pids = {name: process.pid for name, (process, _) in processes.items()}
            small = chat([{"role": "system", "content": "You are an agent."},
                          {"role": "user", "content": "Fix the failing test."}])
            async with aiohttp.ClientSession() as http:
                for url in targets.values():
                    await ready(http, url, small)
                    for _ in range(20):  # warm up
                        await one(http, url, small)
                print(f"\nLiteLLM's proxy with and without loopwarden's guardrail ({rounds} requests each, "
                      f"{max(20, rounds // 5)} streams each; interleaved, concurrency 1; times in ms)\n")
                print("| request | LiteLLM | p50 | p99 | added p50 | CPU per request | added CPU |")
                print("|---|---|---|---|---|---|---|")
                if not streams_only:
                    await measure(http, targets, pids, "2 messages", [small], rounds)
                # An agent's conversation, one step (a call and its result) longer each request, up to 200
                # messages, then another agent's, as bench/overhead.py's detection case.
                steps = [chat(conversation(4 + 2 * (i % 98), tag=f" {i // 98}")) for i in range(rounds)]
                if not streams_only:
                    await measure(http, targets, pids, "a conversation with tool calls, growing to 200 messages",
                                  steps, rounds)
                # LiteLLM takes a few hundred ms of CPU over a 200-chunk stream: a fifth as many.
                await measure(http, targets, pids, "streamed (200 chunks), 2 messages",
                              [chat(orjson.loads(small)["messages"], stream=True)], max(20, rounds // 5))
        finally:
            for process, _ in processes.values():
                process.terminate()
            for process, _ in processes.values():
                process.wait(15)
            upstream.terminate()
            upstream.wait(5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a fifth of the requests")
    parser.add_argument("--streams-only", action="store_true", help="only the streamed requests")
    arguments = parser.parse_args()
    asyncio.run(run(arguments.quick, arguments.streams_only))
