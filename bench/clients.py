"""Clients at volume: 1,000 idle keep-alive connections, then 500 concurrent streams, then clients that leave
mid-stream; the proxy's open file descriptors and memory before, during and after.

    .venv/bin/python bench/clients.py [--idle 1000] [--streams 500]
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

from overhead import SMALL, Served  # noqa: E402
from scale import rss_mb  # noqa: E402


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def main(idle: int, streams: int) -> None:
    rows = []
    async with Served("clients") as served:
        url = f"{served.url}/chat/completions"
        pid = served.proxy.pid

        def row(what: str) -> None:
            rows.append(f"| {what} | {fds(pid)} | {rss_mb(pid):.1f} |")

        await asyncio.sleep(0.5)
        row("at rest")
        # Idle keep-alive connections: each made one request and stays open.
        sessions = []
        for _ in range(idle):
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            async with session.post(url, data=SMALL, headers={"Content-Type": "application/json"}) as response:
                await response.read()
            sessions.append(session)
        row(f"{idle} idle keep-alive connections open")
        for session in sessions:
            await session.close()
        await asyncio.sleep(1.0)
        row("after they closed")

        # Concurrent streams, paced (200 chunks, 5 ms apart: about a second each).
        body = orjson.dumps({**orjson.loads(SMALL), "stream": True})
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            async def stream() -> bool:
                async with http.post(url, data=body, headers={"Content-Type": "application/json",
                                                              "X-Bench-Pace-Ms": "5"}) as response:
                    data = await response.read()
                    return response.status == 200 and data.endswith(b"data: [DONE]\n\n")

            began = time.perf_counter()
            tasks = [asyncio.create_task(stream()) for _ in range(streams)]
            await asyncio.sleep(0.5)
            row(f"{streams} streams in flight")
            results = await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - began
        await asyncio.sleep(1.0)
        row("after the streams ended")

        # Clients that leave mid-stream: the proxy must let go of the upstream.
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                response = await http.post(url, data=body, headers={"Content-Type": "application/json",
                                                                    "X-Bench-Pace-Ms": "5"})
                await response.content.readany()
                response.close()
        await asyncio.sleep(2.0)
        row("after 100 clients left mid-stream")
        await asyncio.sleep(65.0)  # the pool keeps idle upstream connections 30 s, swept every 30 s
        row("65 s later")
        print(f"# Clients at volume ({idle} idle connections, {streams} concurrent streams)\n")
        print(f"{sum(results)} of {streams} concurrent streams complete, in {elapsed:.1f} s\n")
        print("| moment | proxy open file descriptors | proxy RSS MB |\n|---|---|---|")
        print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(main(args.idle, args.streams))
