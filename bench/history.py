"""One long conversation: what its requests cost on a freshly started replica and on a warm one.

    .venv/bin/python bench/history.py [--messages 2000] [--replicas 5]

A coding agent's conversation grown to 2,000 messages (tool results of about 2.5 KB each, so several MB
per request). For each of `--replicas` freshly started `loopwarden serve` processes, its first request
(nothing cached: the whole history is analysed) is timed, then the next requests of the same conversation
(two messages more each, the fold cached). Each is compared with the same body sent straight to the
upstream, so "added" is what loopwarden costs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from overhead import Served  # noqa: E402

WARM_REQUESTS = 10


def long_conversation(messages: int) -> list[dict]:
    """Distinct reads of distinct files, each answered with about 2.5 KB of source."""
    result = [{"role": "system", "content": "You are a careful coding agent."},
              {"role": "user", "content": "Refactor the storage layer and keep the tests green."}]
    step = 0
    while len(result) < messages:
        call_id = f"call_{step}"
        result.append({"role": "assistant", "content": f"Reading module {step} next.",
                       "tool_calls": [{"id": call_id, "type": "function", "function": {
                           "name": "read_file", "arguments": orjson.dumps({"path": f"src/m{step}.py"}).decode()}}]})
        source = "".join(f"def handler_{step}_{line}(request):\n    return respond(request, {line * step})\n"
                         for line in range(40))
        result.append({"role": "tool", "tool_call_id": call_id, "content": source})
        step += 1
    return result[:messages]


async def timed(http: aiohttp.ClientSession, url: str, body: bytes) -> float:
    started = time.perf_counter()
    async with http.post(url + "/chat/completions", data=body,
                         headers={"Content-Type": "application/json",
                                  "X-Loopwarden-Session": "history-bench"}) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.read())[:200]!r}")
    return time.perf_counter() - started


async def direct_time(http: aiohttp.ClientSession, url: str, body: bytes) -> float:
    return statistics.median([await timed(http, url, body) for _ in range(5)])


async def main(messages: int, replicas: int) -> None:
    history = long_conversation(messages + 2 * WARM_REQUESTS)
    bodies = [orjson.dumps({"model": "bench", "messages": history[:messages + 2 * n]})
              for n in range(WARM_REQUESTS + 1)]
    print(f"# One conversation of {messages:,} messages ({len(bodies[0]) / 1e6:.1f} MB per request), "
          f"{replicas} fresh replicas\n")
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(replicas):
        async with Served("history") as served, aiohttp.ClientSession() as http:
            upstream = f"http://127.0.0.1:{served.up_port}/v1"
            direct = [await direct_time(http, upstream, body) for body in bodies]
            cold.append(await timed(http, served.url, bodies[0]) - direct[0])
            for n in range(1, WARM_REQUESTS + 1):
                warm.append(await timed(http, served.url, bodies[n]) - direct[n])
    print("| request | added p50 ms | added max ms | samples |\n|---|---|---|---|")
    for name, values in (("first, on a fresh replica", cold), ("next ones, warm", warm)):
        print(f"| {name} | {statistics.median(values) * 1000:.1f} | {max(values) * 1000:.1f} | {len(values)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.replicas))
