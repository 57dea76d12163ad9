"""A soak: a bounded mixed load on one `loopwarden serve` for ten minutes, sampled every 30 seconds.

    .venv/bin/python bench/soak.py [--minutes 10] [--workers 8]

The workers cycle through what agents do: a plain request of a new session; a looping session taken to
its stop (warned, warned again, refused); a 200-chunk stream; a stream that chants and is cut. An operator
refreshes the overview every 10 s as the web page does (stats, timeline and detections for the last hour)
and reads /metrics. Every answer is checked for what it should be (a warning where one is due, the stop,
the cut, a whole stream), and anything else counts as an error. Each window reports requests/s, errors,
the p99 of the agents' non-streamed requests, the slowest overview refresh, and the proxy's resident
memory, open descriptors and event-loop tasks; at the end, the memory slope over the second half.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from clients import fds, loop_tasks  # noqa: E402
from overhead import Served, conversation, pct  # noqa: E402
from scale import rss_mb  # noqa: E402

WINDOW = 30.0
JSON = {"Content-Type": "application/json"}
PLAIN = orjson.dumps({"model": "bench", "messages": conversation(12)})
# With the default ladder 3 identical calls are the first episode, each further one another: warned, warned,
# stopped.
LOOP_STEPS = [orjson.dumps({"model": "bench", "messages": conversation(n, looping=True)}) for n in (8, 10, 12)]
STREAM = orjson.dumps({"model": "bench", "stream": True, "messages": conversation(4)})


class Window:
    def __init__(self) -> None:
        self.requests = 0
        self.errors: list[str] = []
        self.latencies: list[float] = []  # the agents' non-streamed requests
        self.refreshes: list[float] = []  # the operator's overview, whole


class Soak:
    def __init__(self, served: Served, http: aiohttp.ClientSession) -> None:
        self.served = served
        self.http = http
        self.window = Window()
        self.sessions = itertools.count()

    def error(self, what: str) -> None:
        self.window.errors.append(what)

    async def post(self, body: bytes, session: str, headers: dict | None = None) -> tuple[int, dict, bytes, float]:
        started = time.perf_counter()
        async with self.http.post(f"{self.served.url}/chat/completions", data=body,
                                  headers={**JSON, "X-Loopwarden-Session": session, **(headers or {})}) as response:
            content = await response.read()
            self.window.requests += 1
            return response.status, dict(response.headers), content, time.perf_counter() - started

    async def plain(self) -> None:
        status, headers, _, took = await self.post(PLAIN, f"plain-{next(self.sessions)}")
        self.window.latencies.append(took)
        if status != 200 or "X-Loopwarden-Warning" in headers:
            self.error(f"plain: {status}")

    async def loop(self) -> None:
        session = f"loop-{next(self.sessions)}"
        for step, body in enumerate(LOOP_STEPS):
            status, headers, content, took = await self.post(body, session)
            self.window.latencies.append(took)
            expected = 200 if step < 2 else 400
            if status != expected or (step < 2 and headers.get("X-Loopwarden-Warning") != f"{step + 1}/2 tool_call") \
                    or (step == 2 and orjson.loads(content)["error"]["code"] != "loop_detected"):
                self.error(f"loop step {step}: {status} {headers.get('X-Loopwarden-Warning')}")

    async def stream(self, chant: bool) -> None:
        status, _, content, _ = await self.post(STREAM, f"stream-{next(self.sessions)}",
                                                {"X-Bench-Chant": "1"} if chant else None)
        events = content.count(b"\n\ndata: ") + 1
        if status != 200 or not content.endswith(b"data: [DONE]\n\n"):
            self.error(f"stream: {status}, ended {content[-40:]!r}")
        elif chant and (b"loopwarden" not in content or events > 40):
            self.error(f"chant not cut: {events} events")
        elif not chant and events != 201:
            self.error(f"stream: {events} events")

    async def refresh(self) -> None:
        started = time.perf_counter()
        for path in ("/loopwarden/api/stats?since=1h", "/loopwarden/api/timeline?since=1h",
                     "/loopwarden/api/detections?since=1h&limit=50", "/metrics"):
            async with self.http.get(f"http://127.0.0.1:{self.served.port}{path}") as response:
                await response.read()
                self.window.requests += 1
                if response.status != 200:
                    self.error(f"{path}: {response.status}")
        self.window.refreshes.append(time.perf_counter() - started)

    async def guarded(self, scenario) -> None:
        try:
            await scenario()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
            self.error(f"{type(exc).__name__}: {exc}")

    async def worker(self, deadline: float) -> None:
        scenarios = (self.plain, self.plain, self.loop, lambda: self.stream(False), lambda: self.stream(True),
                     self.plain)
        for scenario in itertools.cycle(scenarios):
            if time.monotonic() >= deadline:
                return
            await self.guarded(scenario)

    async def operator(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            await self.guarded(self.refresh)
            await asyncio.sleep(max(0.0, min(10.0, deadline - time.monotonic())))


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, MB)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    return sum((x - mx) * (y - my) for x, y in points) / (sum((x - mx) ** 2 for x, _ in points) or 1)


async def main(minutes: float, workers: int) -> None:
    async with Served("soak") as served, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=workers * 2), timeout=aiohttp.ClientTimeout(total=30)) as http:
        soak = Soak(served, http)
        pid = served.proxy.pid
        print(f"# Soak: {minutes:g} minutes, {workers} workers, mixed load\n")
        print("| minute | requests/s | errors | agents' p99 ms | slowest overview ms | RSS MB | descriptors "
              "| loop tasks |")
        print("|---|---|---|---|---|---|---|---|")
        print(f"| 0 | | | | | {rss_mb(pid):.1f} | {fds(pid)} | {await loop_tasks(served)} |", flush=True)
        started = time.monotonic()
        deadline = started + minutes * 60
        running = [asyncio.create_task(soak.worker(deadline)) for _ in range(workers)]
        running.append(asyncio.create_task(soak.operator(deadline)))
        memory: list[tuple[float, float]] = []
        p99s: list[float] = []
        errors: list[str] = []
        window_began = started
        while not all(task.done() for task in running):
            await asyncio.wait(running, timeout=WINDOW)
            window, soak.window = soak.window, Window()
            now = time.monotonic()
            length, window_began = now - window_began, now
            if length < 1.0:  # the last requests finishing after the deadline
                errors += window.errors
                continue
            at = (now - started) / 60
            rss = rss_mb(pid)
            memory.append((at, rss))
            p99 = pct(window.latencies, .99) * 1000 if window.latencies else 0.0
            p99s.append(p99)
            errors += window.errors
            slowest = max(window.refreshes, default=0.0) * 1000
            print(f"| {at:.1f} | {window.requests / length:.0f} | {len(window.errors)} | {p99:.1f} | {slowest:.0f} | "
                  f"{rss:.1f} | {fds(pid)} | {await loop_tasks(served)} |", flush=True)
        await asyncio.gather(*running)
        second_half = [point for point in memory if point[0] >= minutes / 2]
        print(f"\nRSS slope over the second half: {slope(second_half):+.2f} MB/minute; "
              f"p99 first window {p99s[0]:.1f} ms, last {p99s[-1]:.1f} ms; errors: {len(errors)}")
        for line in sorted(set(errors))[:20]:
            print(f"    {line}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.minutes, args.workers))
