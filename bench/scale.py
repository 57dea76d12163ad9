"""Memory over many sessions: 200,000 distinct sessions through one `loopwarden serve`, RSS sampled.

    .venv/bin/python bench/scale.py [--sessions 200000] [--concurrency 16]

Each session sends one request: a 12-message conversation with tool calls, half of them looping (so
half log a warning). The proxy's resident memory is read from /proc every 20,000 sessions; every
per-session structure is bounded, so it should level off.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from overhead import Served, conversation  # noqa: E402


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU time of the process's main thread (the event loop) and of all its other threads (the log writer,
    the database drivers' threads)."""
    ticks = os.sysconf("SC_CLK_TCK")
    main = others = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        used = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
        if int(tid) == pid:
            main += used
        else:
            others += used
    return main, others


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def main(sessions: int, concurrency: int) -> None:
    bodies = [orjson.dumps({"model": "bench", "messages": conversation(12, looping=looping)})
              for looping in (False, True)]
    async with Served("scale") as served:
        pid = served.proxy.pid
        print(f"# {sessions:,} distinct sessions, {concurrency} at a time\n")
        print("| sessions | proxy RSS MB | requests/s since the last row | event-loop CPU µs per request "
              "| other threads' CPU µs per request |\n|---|---|---|---|---|")
        print(f"| 0 | {rss_mb(pid):.1f} | | | |")
        cpu_mark = cpu_seconds(pid)
        counter = iter(range(sessions))
        done = 0
        mark, began = 0, time.perf_counter()

        async def worker(http: aiohttp.ClientSession) -> None:
            nonlocal done, mark, began, cpu_mark
            for n in counter:
                async with http.post(f"{served.url}/chat/completions", data=bodies[n % 2],
                                     headers={"Content-Type": "application/json",
                                              "X-Loopwarden-Session": f"scale-{n}"}) as response:
                    await response.read()
                done += 1
                if done % 20_000 == 0:
                    now, cpu = time.perf_counter(), cpu_seconds(pid)
                    per_request = [(cpu[i] - cpu_mark[i]) / (done - mark) * 1e6 for i in (0, 1)]
                    print(f"| {done:,} | {rss_mb(pid):.1f} | {(done - mark) / (now - began):.0f} | "
                          f"{per_request[0]:.0f} | {per_request[1]:.0f} |", flush=True)
                    mark, began, cpu_mark = done, now, cpu

        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(worker(http) for _ in range(concurrency)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.concurrency))
