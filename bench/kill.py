"""Durability of the detection log: detections logged at a high rate, then the proxy killed.

    .venv/bin/python bench/kill.py [--seconds 5] [--workers 16]

Starts `loopwarden serve` on a fresh SQLite log in front of the benchmark's lean upstream, and sends
requests that each carry a new warning (a new session whose 12-message conversation loops), from several
workers at once. Every answer with `X-Loopwarden-Warning` is one record the proxy owes the log. After the
given time it stops the proxy with SIGKILL (and, in a second run, SIGTERM) and counts the rows that reached
the database.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sqlite3
import sys
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from overhead import Served, conversation  # noqa: E402

LOOPING = orjson.dumps({"model": "bench", "messages": conversation(8, looping=True)})  # one warning each


async def run(stop: signal.Signals, seconds: float, workers: int) -> tuple[int, int]:
    owed = 0
    async with Served("kill") as served:
        deadline = time.monotonic() + seconds
        counter = iter(range(10**9))

        async def worker(http: aiohttp.ClientSession) -> None:
            nonlocal owed
            while time.monotonic() < deadline:
                async with http.post(f"{served.url}/chat/completions", data=LOOPING,
                                     headers={"Content-Type": "application/json",
                                              "X-Loopwarden-Session": f"kill-{next(counter)}"}) as response:
                    await response.read()
                    if "X-Loopwarden-Warning" in response.headers:
                        owed += 1

        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(worker(http) for _ in range(workers)))
        served.proxy.send_signal(stop)
        served.proxy.wait(timeout=60)
    written = sqlite3.connect(served.database).execute("SELECT count(*) FROM detections").fetchone()[0]
    return owed, written


async def main(seconds: float, workers: int) -> None:
    print(f"# Durability of the log ({workers} workers for {seconds:g} s, then the signal)\n")
    print("| stopped by | records owed | records written | lost |\n|---|---|---|---|")
    for stop in (signal.SIGKILL, signal.SIGTERM):
        owed, written = await run(stop, seconds, workers)
        print(f"| {stop.name} | {owed} | {written} | {owed - written} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.workers))
