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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from overhead import conversation, free_port, wait_ready  # noqa: E402

LOOPING = orjson.dumps({"model": "bench", "messages": conversation(12, looping=True)})


async def run(stop: signal.Signals, seconds: float, workers: int) -> tuple[int, int]:
    tmp = tempfile.mkdtemp(prefix="lw-kill-")
    up_port, lw_port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "bench/servers.py"), "upstream", str(up_port)])
    proxy = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(lw_port), "--upstream",
                              f"http://127.0.0.1:{up_port}/v1", "--database-url", f"sqlite+aiosqlite:///{tmp}/kill.db",
                              "--log-level", "error", "--llm-check", "false"], cwd=ROOT)
    owed = 0
    try:
        await wait_ready(f"http://127.0.0.1:{up_port}/v1")
        await wait_ready(f"http://127.0.0.1:{lw_port}/v1")
        deadline = time.monotonic() + seconds
        counter = iter(range(10**9))

        async def worker(http: aiohttp.ClientSession) -> None:
            nonlocal owed
            while time.monotonic() < deadline:
                async with http.post(f"http://127.0.0.1:{lw_port}/v1/chat/completions", data=LOOPING,
                                     headers={"Content-Type": "application/json",
                                              "X-Loopwarden-Session": f"kill-{next(counter)}"}) as response:
                    await response.read()
                    if "X-Loopwarden-Warning" in response.headers:
                        owed += 1

        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(worker(http) for _ in range(workers)))
        proxy.send_signal(stop)
        proxy.wait(timeout=60)
    finally:
        for process in (proxy, upstream):
            if process.poll() is None:
                process.kill()
            process.wait()
    written = sqlite3.connect(f"{tmp}/kill.db").execute("SELECT count(*) FROM detections").fetchone()[0]
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
