"""What loopwarden costs an agent, measured in one run against the same upstream.

    .venv/bin/python bench/overhead.py [--quick] [--reasoning-only] [--relay-only]

Targets, in separate processes on this machine: a lean upstream, a bare aiohttp
relay (the least any forwarding proxy costs), and loopwarden. The load comes
from this process over keep-alive connections. Every figure is compared within
the run, so machine speed cancels out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
SMALL = orjson.dumps({"model": "bench", "messages": [{"role": "system", "content": "You are an agent."},
                                                      {"role": "user", "content": "Fix the failing test."}]})
MESSAGES_SMALL = orjson.dumps({"model": "bench", "max_tokens": 1024, "system": "You are an agent.",
                               "messages": [{"role": "user", "content": "Fix the failing test."}]})
RESPONSES_SMALL = orjson.dumps({"model": "bench", "instructions": "You are an agent.", "store": False,
                                "input": [{"role": "user", "content": "Fix the failing test."}]})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.post(url + "/chat/completions", data=SMALL,
                                     headers={"Content-Type": "application/json"}) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


class Served:
    """The lean upstream and `loopwarden serve` in front of it, as processes, on a fresh SQLite log (or the
    database given)."""

    def __init__(self, name: str, database_url: str | None = None, log_level: str = "error") -> None:
        self.tmp = tempfile.mkdtemp(prefix=f"lw-{name}-")
        self.database = f"{self.tmp}/{name}.db"
        self.database_url = database_url or f"sqlite+aiosqlite:///{self.database}"
        self.up_port, self.port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = f"{self.tmp}/proxy.log"  # the proxy's own log lines
        self.upstream = subprocess.Popen([sys.executable, str(ROOT / "bench/servers.py"), "upstream",
                                          str(self.up_port)])
        with open(self.log, "w") as log:
            self.proxy = subprocess.Popen(
                [sys.executable, "-m", "proxy", "serve", "--port", str(self.port), "--upstream",
                 f"http://127.0.0.1:{self.up_port}/v1", "--database-url", self.database_url,
                 "--log-level", log_level, "--llm-check", "false"], cwd=ROOT, stderr=log)

    async def __aenter__(self) -> "Served":
        await wait_ready(f"http://127.0.0.1:{self.up_port}/v1")
        await wait_ready(self.url)
        return self

    async def __aexit__(self, *exc) -> None:
        for process in (self.proxy, self.upstream):
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=30)


def conversation(messages: int, *, looping: bool = False, tag: str = "") -> list[dict]:
    """An agent conversation with tool calls: distinct calls, or one call repeated (a loop)."""
    result = [{"role": "system", "content": "You are a careful coding agent." + tag},
              {"role": "user", "content": "Refactor the storage layer and keep the tests green."}]
    step = 0
    while len(result) < messages:
        path = "src/app.py" if looping else f"src/module_{step}.py"
        call_id = f"call_{step}"
        result.append({"role": "assistant", "content": f"Looking at {path} next." if not looping else None,
                       "tool_calls": [{"id": call_id, "type": "function",
                                       "function": {"name": "read_file", "arguments": orjson.dumps({"path": path})
                                                    .decode()}}]})
        body = "same contents\n" * 20 if looping else f"# module {step}\n" + "def f():\n    return 1\n" * 15
        result.append({"role": "tool", "tool_call_id": call_id, "content": body})
        step += 1
    return result[:messages]


def text_conversation(messages: int) -> list[dict]:
    """The same agent acting in text (ReAct): its actions in the assistant's text, observations as user messages."""
    result = [{"role": "system", "content": "You are a careful coding agent. Use Thought/Action/Action Input."},
              {"role": "user", "content": "Refactor the storage layer and keep the tests green."}]
    step = 0
    while len(result) < messages:
        path = f"src/module_{step}.py"
        result.append({"role": "assistant", "content": f"Thought: Looking at {path} next.\nAction: read_file\n"
                                                       f"Action Input: {orjson.dumps({'path': path}).decode()}"})
        body = f"# module {step}\n" + "def f():\n    return 1\n" * 15
        result.append({"role": "user", "content": f"Observation: {body}"})
        step += 1
    return result[:messages]


class Timer:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http

    async def once(self, url: str, body: bytes, headers: dict | None = None, path: str = "/chat/completions"
                   ) -> float:
        started = time.perf_counter()
        async with self.http.post(url + path, data=body,
                                  headers={"Content-Type": "application/json", **(headers or {})}) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"{url}: HTTP {response.status}")
        return time.perf_counter() - started

    async def stream(self, url: str, pace_ms: float = 0, body: bytes | None = None,
                     path: str = "/chat/completions", headers: dict | None = None) -> tuple[float, float]:
        body = body or orjson.dumps({**orjson.loads(SMALL), "stream": True})
        started = time.perf_counter()
        first = None
        async with self.http.post(url + path, data=body,
                                  headers={"Content-Type": "application/json",
                                           "X-Bench-Pace-Ms": str(pace_ms), **(headers or {})}) as response:
            async for _ in response.content.iter_any():
                if first is None:
                    first = time.perf_counter() - started
        return first or 0.0, time.perf_counter() - started


async def writer_throughput(url: str, records: int) -> float:
    """Records per second through the batched writer into a freshly migrated database."""
    from proxy.store.database import run_migrations
    from proxy.store.writer import LogWriter, utcnow

    await asyncio.to_thread(run_migrations, url)
    writer = LogWriter(url, capacity=records)
    writer.start()
    run = time.time_ns()
    for n in range(records):
        writer.add_detection({
            "created_at": utcnow(), "session_id": f"s{n % 100}", "tenant": "bench", "task": "t", "model": "m",
            "type": "tool_call", "action": "warned", "episode": 1, "episode_limit": 2, "turn": 5,
            "detail": {"tool": "read_file", "arguments": '{"path":"a.py"}'}, "request_id": None,
            "tokens_saved_estimate": 0, "episode_key": f"bench-{run}-{n}"})
    started = time.perf_counter()
    await writer.flush()
    elapsed = time.perf_counter() - started
    await writer.close()
    return records / elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float) -> str:
    return f"{value * 1000:.3f}"


async def sequential(timer: Timer, targets: dict[str, str], rounds: int, body: bytes = SMALL,
                     headers_for=None) -> dict[str, list[float]]:
    """Concurrency 1, targets interleaved round by round so drift hits them alike."""
    samples: dict[str, list[float]] = {name: [] for name in targets}
    for i in range(rounds):
        for name, url in targets.items():
            headers = headers_for(name, i) if headers_for else None
            samples[name].append(await timer.once(url, body, headers))
    return samples


async def concurrent(timer: Timer, url: str, workers: int, total: int) -> tuple[list[float], float]:
    samples: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            samples.append(await timer.once(url, SMALL))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return samples, total / (time.perf_counter() - started)


async def dialect_overhead(timer: Timer, targets: dict[str, str], api: str, path: str, small: bytes, rounds: int,
                           streams: int) -> None:
    """Another dialect's requests: non-streaming at concurrency 1, then 200 text deltas streamed at once."""
    print(f"\n## {api}, non-streaming, concurrency 1 ({rounds} requests each, interleaved)\n")
    samples: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(rounds):
        for name, url in targets.items():
            samples[name].append(await timer.once(url, small, path=path))
    print("| target | p50 ms | p99 ms | added p50 ms |\n|---|---|---|---|")
    for name in targets:
        print(f"| {name} | {ms(pct(samples[name], .5))} | {ms(pct(samples[name], .99))} | "
              f"{ms(pct(samples[name], .5) - pct(samples['direct'], .5))} |")
    added_lw = pct(samples["loopwarden"], .5) - pct(samples["direct"], .5)
    added_relay = pct(samples["relay"], .5) - pct(samples["direct"], .5)
    print(f"\nloopwarden's added p50 is {added_lw / added_relay:.2f}x the bare relay's\n")

    print(f"## {api}, streaming 200 text deltas as fast as the upstream writes ({streams} streams each, "
          f"interleaved)\n")
    await stream_table(timer, targets, streams, orjson.dumps({**orjson.loads(small), "stream": True}), path)


async def stream_table(timer: Timer, targets: dict[str, str], streams: int, body: bytes | None = None,
                       path: str = "/chat/completions", pace: float = 0) -> None:
    """Streams to every target in turn: the first event and the whole stream, against the direct upstream."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    for _ in range(streams):
        for name, url in targets.items():
            results[name].append(await timer.stream(url, pace, body=body, path=path))
    print("| target | first event p50 ms | total p50 ms | total vs direct | added p50 ms |\n|---|---|---|---|---|")
    direct_total = statistics.median(t for _, t in results["direct"])
    for name in targets:
        first = statistics.median(f for f, _ in results[name])
        whole = statistics.median(t for _, t in results[name])
        print(f"| {name} | {ms(first)} | {ms(whole)} | {whole / direct_total:.3f}x | {ms(whole - direct_total)} |")
    added_lw = statistics.median(t for _, t in results["loopwarden"]) - direct_total
    added_relay = statistics.median(t for _, t in results["relay"]) - direct_total
    print(f"\nloopwarden's added total is {added_lw / added_relay:.2f}x the bare relay's\n")


async def reasoning_streams(timer: Timer, targets: dict[str, str], streams: int) -> None:
    """Streams whose first three quarters are `reasoning_content` deltas (which loopwarden watches too), against
    streams of the same size whose tokens are all `content`: the cost of watching the reasoning."""
    print(f"\n## Streaming with reasoning deltas, 200 chunks as fast as the upstream writes ({streams} streams "
          "each, interleaved)\n")
    kinds = {"with reasoning": {"X-Bench-Reasoning": "yes"}, "same size, no reasoning": {"X-Bench-Reasoning": "no"}}
    results: dict[tuple[str, str], list[float]] = {(name, kind): [] for name in ("direct", "loopwarden")
                                                   for kind in kinds}
    for _ in range(streams):
        for kind, headers in kinds.items():
            for name in ("direct", "loopwarden"):
                results[name, kind].append((await timer.stream(targets[name], headers=headers))[1])
    print("| stream | direct total p50 ms | loopwarden total p50 ms | loopwarden added p50 ms |\n|---|---|---|---|")
    added = {}
    for kind in kinds:
        direct, proxied = (statistics.median(results[name, kind]) for name in ("direct", "loopwarden"))
        added[kind] = proxied - direct
        print(f"| {kind} | {ms(direct)} | {ms(proxied)} | {ms(proxied - direct)} |")
    with_reasoning, without = (statistics.median(results["loopwarden", kind]) for kind in kinds)
    print(f"\nthrough loopwarden, a stream with reasoning deltas takes {with_reasoning / without:.3f}x the time of "
          "one of the same size without them\n")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has spent, all its threads."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def against_the_relay(timer: Timer, targets: dict[str, str], pids: dict[str, int], scale: float) -> None:
    """The comparison with a bare relay on either loop: added p50 at concurrency 1 (interleaved), then
    requests/s and CPU per request at concurrency 16 (each target's own process)."""
    rounds = int(2000 * scale)
    c1 = await sequential(timer, targets, rounds)
    total = int(8000 * scale)
    print(f"## Against the bare relay: concurrency 1 ({rounds} requests each, interleaved), "
          f"then concurrency 16 ({total} requests each)\n")
    print("| target | added p50 ms (c1) | vs relay | requests/s (c16) | CPU ms per request (c16) | p99 ms (c16) |")
    print("|---|---|---|---|---|---|")
    direct = pct(c1["direct"], .5)
    relay_added = pct(c1["relay"], .5) - direct
    for name, url in targets.items():
        before = cpu_seconds(pids[name])
        samples, rps = await concurrent(timer, url, 16, total)
        cpu = (cpu_seconds(pids[name]) - before) / total
        added = pct(c1[name], .5) - direct
        print(f"| {name} | {ms(added)} | {added / relay_added if name != 'direct' else 0:.2f}x | {rps:.0f} | "
              f"{cpu * 1000:.3f} | {ms(pct(samples, .99))} |")
    print()


async def run(quick: bool, reasoning_only: bool = False, relay_only: bool = False) -> None:
    scale = 0.2 if quick else 1.0
    processes = []
    tmp = tempfile.mkdtemp(prefix="lw-bench-")
    try:
        up_port, relay_port, lw_port = free_port(), free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}/v1"
        python = sys.executable
        processes.append(subprocess.Popen([python, str(ROOT / "bench/servers.py"), "upstream", str(up_port)]))
        await wait_ready(upstream)
        processes.append(subprocess.Popen([python, str(ROOT / "bench/servers.py"), "relay", str(relay_port),
                                           upstream]))
        uvloop_relay_port = free_port()
        processes.append(subprocess.Popen([python, str(ROOT / "bench/servers.py"), "relay-uvloop",
                                           str(uvloop_relay_port), upstream]))
        processes.append(subprocess.Popen(
            [python, "-m", "proxy", "serve", "--port", str(lw_port), "--upstream", upstream,
             "--anthropic-upstream-url", upstream, "--log-level",
             "warning", "--database-url", f"sqlite+aiosqlite:///{tmp}/bench.db", "--llm-check", "false"],
            cwd=ROOT))
        targets = {"direct": upstream, "relay": f"http://127.0.0.1:{relay_port}/v1",
                   "loopwarden": f"http://127.0.0.1:{lw_port}/v1"}
        relay_targets = {**targets, "relay (uvloop)": f"http://127.0.0.1:{uvloop_relay_port}/v1"}
        pids = {"direct": processes[0].pid, "relay": processes[1].pid, "relay (uvloop)": processes[2].pid,
                "loopwarden": processes[3].pid}
        for url in relay_targets.values():
            await wait_ready(url)

        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as http:
            timer = Timer(http)
            await sequential(timer, targets, 200)  # warm-up
            print(f"# loopwarden overhead benchmark ({os.cpu_count()} cores, Python {sys.version.split()[0]})\n")
            if reasoning_only:
                await reasoning_streams(timer, targets, int(300 * scale))
                return
            await against_the_relay(timer, relay_targets, pids, scale)
            if relay_only:
                return

            rounds = int(2000 * scale)
            c1 = await sequential(timer, targets, rounds)
            print(f"## Non-streaming, concurrency 1 ({rounds} requests each, interleaved)\n")
            print("| target | p50 ms | p99 ms | added p50 ms | added p99 ms |\n|---|---|---|---|---|")
            for name in targets:
                print(f"| {name} | {ms(pct(c1[name], .5))} | {ms(pct(c1[name], .99))} | "
                      f"{ms(pct(c1[name], .5) - pct(c1['direct'], .5))} | "
                      f"{ms(pct(c1[name], .99) - pct(c1['direct'], .99))} |")
            added_lw = pct(c1["loopwarden"], .5) - pct(c1["direct"], .5)
            added_relay = pct(c1["relay"], .5) - pct(c1["direct"], .5)
            print(f"\nloopwarden's added p50 is {added_lw / added_relay:.2f}x the bare relay's\n")

            total = int(6000 * scale)
            print(f"## Non-streaming, concurrency 32 ({total} requests each)\n")
            print("| target | p50 ms | p99 ms | requests/s |\n|---|---|---|---|")
            for name, url in targets.items():
                samples, rps = await concurrent(timer, url, 32, total)
                print(f"| {name} | {ms(pct(samples, .5))} | {ms(pct(samples, .99))} | {rps:.0f} |")

            for pace, streams in ((0, int(300 * scale)), (5, max(4, int(20 * scale)))):
                what = "as fast as the upstream can write" if not pace else f"one chunk every {pace} ms"
                print(f"\n## Streaming, 200 chunks, {what} ({streams} streams each, interleaved)\n")
                await stream_table(timer, targets, streams, pace=pace)
            await reasoning_streams(timer, targets, int(300 * scale))
            for api, path, small in (("Responses API", "/responses", RESPONSES_SMALL),
                                     ("Messages API", "/messages", MESSAGES_SMALL)):
                await dialect_overhead(timer, targets, api, path, small, int(2000 * scale), int(300 * scale))

            print("\n## Detection on a 200-message conversation with tool calls, and acting in text\n")
            bodies = [orjson.dumps({"model": "bench", "messages": conversation(n)}) for n in range(160, 201, 2)]
            text_bodies = [orjson.dumps({"model": "bench", "messages": text_conversation(n)})
                           for n in range(160, 201, 2)]
            rounds = int(1000 * scale)
            sessions = max(1, rounds // len(bodies))
            lw = targets["loopwarden"]
            samples: dict[str, list[float]] = {"direct": [], "detection off": [], "detection on": [],
                                               "detection on, acting in text": []}
            for s in range(sessions):
                for body, text_body in zip(bodies, text_bodies):
                    session = {"X-Loopwarden-Session": f"bench-{s}"}
                    samples["direct"].append(await timer.once(upstream, body))
                    samples["detection off"].append(await timer.once(lw, body, {**session,
                                                                                "X-Loopwarden-Disable": "1"}))
                    samples["detection on"].append(await timer.once(lw, body, session))
                    samples["detection on, acting in text"].append(
                        await timer.once(lw, text_body, {"X-Loopwarden-Session": f"bench-text-{s}"}))
            print("Each session's conversation grows by one step per request, as an agent's does.\n")
            print("| case | p50 ms | added p50 ms |\n|---|---|---|")
            base = pct(samples["direct"], .5)
            for name, values in samples.items():
                print(f"| {name} | {ms(pct(values, .5))} | {ms(pct(values, .5) - base)} |")
            off = pct(samples["detection off"], .5) - base
            on = pct(samples["detection on"], .5) - base
            text = pct(samples["detection on, acting in text"], .5) - base
            print(f"\ndetection on adds {on / off:.2f}x the added latency of plain forwarding; "
                  f"acting in text costs {text / on:.2f}x acting with tool calls\n")

            count = int(10_000 * scale)
            print(f"## The log: {count} requests that each log a new detection, vs {count} that log nothing\n")
            print("Both sets are new sessions with an 8-message conversation, so both are analysed from "
                  "scratch; only the first set loops (three identical calls: one warning each with the default "
                  "ladder, written to the log).\n")
            looping = orjson.dumps({"model": "bench", "messages": conversation(8, looping=True)})
            calm = orjson.dumps({"model": "bench", "messages": conversation(8)})
            logged, quiet = [], []
            for i in range(count):
                logged.append(await timer.once(lw, looping, {"X-Loopwarden-Session": f"log-{i}"}))
                quiet.append(await timer.once(lw, calm, {"X-Loopwarden-Session": f"calm-{i}"}))
            print("| case | p50 ms | p99 ms |\n|---|---|---|")
            print(f"| each request logs a detection | {ms(pct(logged, .5))} | {ms(pct(logged, .99))} |")
            print(f"| no detection, nothing logged | {ms(pct(quiet, .5))} | {ms(pct(quiet, .99))} |")
            await asyncio.sleep(1.0)  # the writer flushes every quarter second
            async with http.get(lw.replace("/v1", "/loopwarden/api/stats")) as response:
                stats = await response.json()
            print(f"\ndetections in the log afterwards: {stats['detections']}")
            print("\n## Writer throughput\n\n| database | records/s |\n|---|---|")
            for name, url in (("SQLite", f"sqlite+aiosqlite:///{tmp}/writer.db"),
                              ("PostgreSQL", os.environ.get("LOOPWARDEN_BENCH_POSTGRES_URL"))):
                if not url:
                    print(f"| {name} | not measured (set LOOPWARDEN_BENCH_POSTGRES_URL) |")
                    continue
                try:
                    print(f"| {name} | {await writer_throughput(url, int(20_000 * scale)):.0f} |")
                except Exception as exc:  # a database that cannot be reached is a line, not a traceback
                    print(f"| {name} | not measured ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}) |")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a fifth of the requests, for a fast look")
    parser.add_argument("--reasoning-only", action="store_true",
                        help="only the streams with reasoning deltas, against the same size without")
    parser.add_argument("--relay-only", action="store_true",
                        help="only the comparison with the bare relay on both loops (latency, requests/s, CPU)")
    arguments = parser.parse_args()
    asyncio.run(run(arguments.quick, arguments.reasoning_only, arguments.relay_only))
