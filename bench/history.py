"""One long conversation: what its requests cost on a freshly started replica and on a warm one.

    .venv/bin/python bench/history.py [--messages 2000] [--replicas 5]
    .venv/bin/python bench/history.py --against-relay [--sizes 40,400,2000]

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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from overhead import Served, cpu_seconds, free_port, wait_ready  # noqa: E402

WARM_REQUESTS = 10


def long_conversation(messages: int, task: str = "the storage layer") -> list[dict]:
    """Distinct reads of distinct files, each answered with about 2.5 KB of source."""
    result = [{"role": "system", "content": "You are a careful coding agent."},
              {"role": "user", "content": f"Refactor {task} and keep the tests green."}]
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


async def timed(http: aiohttp.ClientSession, url: str, body: bytes, session: str = "history-bench") -> float:
    started = time.perf_counter()
    async with http.post(url + "/chat/completions", data=body,
                         headers={"Content-Type": "application/json",
                                  "X-Loopwarden-Session": session}) as response:
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
    unseen: list[float] = []
    for replica in range(replicas):
        async with Served("history") as served, aiohttp.ClientSession() as http:
            upstream = f"http://127.0.0.1:{served.up_port}/v1"
            direct = [await direct_time(http, upstream, body) for body in bodies]
            cold.append(await timed(http, served.url, bodies[0]) - direct[0])
            for n in range(1, WARM_REQUESTS + 1):
                warm.append(await timed(http, served.url, bodies[n]) - direct[n])
            for other in range(3):  # conversations this replica has not seen, as long (a session moved here)
                body = orjson.dumps({"model": "bench", "messages": long_conversation(
                    messages, f"module {replica}-{other}")})
                took = await timed(http, served.url, body, f"unseen-{replica}-{other}")
                unseen.append(took - await direct_time(http, upstream, body))
    print("| request | added p50 ms | added max ms | samples |\n|---|---|---|---|")
    for name, values in (("first, on a fresh replica", cold), ("next ones, warm", warm),
                         ("first of a conversation not seen before, on a warm replica", unseen)):
        print(f"| {name} | {statistics.median(values) * 1000:.1f} | {max(values) * 1000:.1f} | {len(values)} |")


def as_messages_api(history: list[dict]) -> dict:
    """The same conversation as Claude Code sends it on the Messages API: tool_use and tool_result blocks."""
    system, messages = history[0]["content"], []
    for message in history[1:]:
        if message["role"] == "assistant":
            call = message["tool_calls"][0]
            messages.append({"role": "assistant", "content": [
                {"type": "text", "text": message["content"]},
                {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                 "input": orjson.loads(call["function"]["arguments"])}]})
        elif message["role"] == "tool":
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": message["content"]}]})
        else:
            messages.append({"role": "user", "content": [{"type": "text", "text": message["content"]}]})
    return {"model": "bench", "max_tokens": 1024, "system": system, "messages": messages}


def as_responses_api(history: list[dict]) -> dict:
    """The same conversation as Codex CLI sends it on the Responses API (nothing kept by the service): message,
    function_call and function_call_output items."""
    items = []
    for message in history[1:]:
        if message["role"] == "assistant":
            call = message["tool_calls"][0]
            items += [{"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": message["content"]}]},
                      {"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                       "arguments": call["function"]["arguments"]}]
        elif message["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": message["content"]})
        else:
            items.append({"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": message["content"]}]})
    return {"model": "bench", "instructions": history[0]["content"], "input": items, "store": False}


def as_gemini_api(history: list[dict]) -> dict:
    """The same conversation as Gemini CLI sends it: model turns with functionCall parts, user turns with
    functionResponse parts."""
    contents = []
    for message in history[1:]:
        if message["role"] == "assistant":
            call = message["tool_calls"][0]["function"]
            contents.append({"role": "model", "parts": [{"text": message["content"]}, {"functionCall": {
                "name": call["name"], "args": orjson.loads(call["arguments"])}}]})
        elif message["role"] == "tool":
            contents.append({"role": "user", "parts": [{"functionResponse": {
                "name": "read_file", "response": {"output": message["content"]}}}]})
        else:
            contents.append({"role": "user", "parts": [{"text": message["content"]}]})
    return {"contents": contents, "systemInstruction": {"parts": [{"text": history[0]["content"]}]}}


DIALECTS = {  # name: (path, the body of the first n messages of a history)
    "chat": ("/v1/chat/completions", lambda history, n: {"model": "bench", "messages": history[:n]}),
    "Responses": ("/v1/responses", lambda history, n: as_responses_api(history[:n])),
    "Messages": ("/v1/messages", lambda history, n: as_messages_api(history[:n])),
    "Gemini": ("/v1beta/models/bench:generateContent", lambda history, n: as_gemini_api(history[:n])),
}


async def against_the_relay(sizes: list[int], requests: int, run: int) -> dict[tuple[str, int], tuple]:
    """Per dialect and length, a session growing two messages a request, sent to the upstream directly, through
    the bare relay and through loopwarden (warm: the session seen before): each process's CPU per request and
    the added time (median against direct), by (dialect, messages): (MB, relay CPU, loopwarden CPU, relay added,
    loopwarden added)."""
    results = {}
    python, tmp = sys.executable, Path(tempfile.mkdtemp(prefix="lw-history-"))
    up_port, relay_port, lw_port = free_port(), free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    processes = [subprocess.Popen([python, str(ROOT / "bench/servers.py"), "upstream", str(up_port)])]
    try:
        await wait_ready(upstream)
        processes.append(subprocess.Popen([python, str(ROOT / "bench/servers.py"), "relay", str(relay_port),
                                           upstream]))
        processes.append(subprocess.Popen(
            [python, "-m", "proxy", "serve", "--port", str(lw_port), "--upstream", upstream,
             "--anthropic-upstream-url", upstream, "--gemini-upstream-url", upstream.removesuffix("/v1"),
             "--log-level", "warning", "--llm-check", "false",
             "--database-url", f"sqlite+aiosqlite:///{tmp}/bench.db"], cwd=ROOT))
        targets = {"direct": (f"http://127.0.0.1:{up_port}", processes[0].pid),
                   "relay": (f"http://127.0.0.1:{relay_port}", processes[1].pid),
                   "loopwarden": (f"http://127.0.0.1:{lw_port}", processes[2].pid)}
        for url, _ in targets.values():
            await wait_ready(url + "/v1")
        async with aiohttp.ClientSession() as http:
            for dialect, (path, body_of) in DIALECTS.items():
                for size in sizes:
                    history = long_conversation(size + 2 * (requests + 1))
                    bodies = [orjson.dumps(body_of(history, size + 2 * n)) for n in range(requests + 1)]
                    walls, cpus = {}, {}
                    for name, (url, pid) in targets.items():
                        session = f"history-{dialect}-{size}-{name}-{run}"
                        await post(http, url + path, bodies[0], session)  # seen before: the warm case
                        spent, took = cpu_seconds(pid), []
                        for body in bodies[1:]:
                            started = time.perf_counter()
                            await post(http, url + path, body, session)
                            took.append(time.perf_counter() - started)
                        cpus[name] = (cpu_seconds(pid) - spent) / requests * 1000
                        walls[name] = statistics.median(took) * 1000
                    results[dialect, size] = (len(bodies[-1]) / 1e6, cpus["relay"], cpus["loopwarden"],
                                              walls["relay"] - walls["direct"], walls["loopwarden"] - walls["direct"])
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
    return results


def relay_table(runs: list[dict[tuple[str, int], tuple]]) -> None:
    """The median of each figure over the runs, and how the added time grows from the shortest length to each."""
    print(f"Medians of {len(runs)} run(s).\n\n| dialect | messages | MB | relay CPU ms | loopwarden CPU ms | ratio | "
          "relay added ms | loopwarden added ms | added growth from the shortest, against the relay's |\n"
          "|---|---|---|---|---|---|---|---|---|")
    shortest: dict[str, tuple] = {}
    for (dialect, size) in runs[0]:
        mb, relay_cpu, lw_cpu, relay_added, lw_added = (statistics.median(run[dialect, size][k] for run in runs)
                                                        for k in range(5))
        growth = ""
        if dialect not in shortest:
            shortest[dialect] = (relay_added, lw_added)
        elif relay_added > shortest[dialect][0]:
            growth = f"{(lw_added - shortest[dialect][1]) / (relay_added - shortest[dialect][0]):.2f}x"
        ratio = f"{lw_cpu / relay_cpu:.1f}x" if relay_cpu else "n/a"  # under a clock tick: too few requests
        print(f"| {dialect} | {size:,} | {mb:.2f} | {relay_cpu:.1f} | {lw_cpu:.1f} | {ratio} | "
              f"{relay_added:.1f} | {lw_added:.1f} | {growth} |", flush=True)


async def post(http: aiohttp.ClientSession, url: str, body: bytes, session: str) -> None:
    """A request as its dialect's clients send it (the Messages API's version header, the Gemini API's key)."""
    headers = {"Content-Type": "application/json", "X-Loopwarden-Session": session}
    headers.update({"anthropic-version": "2023-06-01"} if url.endswith("/messages") else
                   {"x-goog-api-key": "bench"} if ":generateContent" in url else {})
    async with http.post(url, data=body, headers=headers) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status} from {url}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=5)
    parser.add_argument("--against-relay", action="store_true",
                        help="per dialect, a warm session's CPU and added time against a bare relay")
    parser.add_argument("--sizes", default="40,400,2000,5000")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3, help="--against-relay: runs, each figure their median")
    args = parser.parse_args()
    if args.against_relay:
        sizes = [int(size) for size in args.sizes.split(",")]
        relay_table([asyncio.run(against_the_relay(sizes, args.requests, run)) for run in range(args.runs)])
    else:
        asyncio.run(main(args.messages, args.replicas))
