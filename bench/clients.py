"""Clients at volume and clients that misbehave: 1,000 idle keep-alive connections, 500 concurrent streams,
clients leaving mid-stream, clients trickling their headers a byte a second. The proxy's open file
descriptors, memory and event-loop tasks before, during and after; how soon the upstream is let go.

    .venv/bin/python bench/clients.py [--idle 1000] [--streams 500] [--leaving 100] [--trickling 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from overhead import SMALL, Served  # noqa: E402
from scale import rss_mb  # noqa: E402

TASKS = re.compile(rb"^loopwarden_event_loop_tasks (\S+)$", re.MULTILINE)
JSON = {"Content-Type": "application/json"}
STREAM = orjson.dumps({**orjson.loads(SMALL), "stream": True})


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def get_json(url: str):
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return await response.json()


async def loop_tasks(served: Served) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{served.port}/metrics") as response:
        return int(float(TASKS.search(await response.read()).group(1)))


async def upstream_streaming(served: Served) -> int:
    return await get_json(f"http://127.0.0.1:{served.up_port}/bench/streaming")


async def trickle(port: int, held: list[float], closed: list[float]) -> None:
    """A request's head sent a byte a second; when the proxy closes the connection, how long it was held."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(
        b"X-Padding-%d: %s\r\n" % (n, b"a" * 20) for n in range(300))  # hours at a byte a second
    started = time.monotonic()
    try:
        for byte in head:
            writer.write(bytes([byte]))
            await writer.drain()
            try:
                if await asyncio.wait_for(reader.read(1024), 1.0) == b"":
                    break  # closed by the proxy
            except asyncio.TimeoutError:
                continue
            break  # an answer (an error for the head) ends it too
    except ConnectionError:
        pass
    held.append(time.monotonic() - started)
    closed.append(1)
    writer.close()


async def main(idle: int, streams: int, leaving: int, trickling: int) -> None:
    rows = []
    notes = []
    async with Served("clients") as served:
        url = f"{served.url}/chat/completions"
        pid = served.proxy.pid

        async def row(what: str) -> None:
            rows.append(f"| {what} | {fds(pid)} | {rss_mb(pid):.1f} | {await loop_tasks(served)} |")

        await asyncio.sleep(0.5)
        await row("at rest")

        # Idle keep-alive connections: each made one request and stays open.
        sessions = []
        for _ in range(idle):
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            async with session.post(url, data=SMALL, headers=JSON) as response:
                await response.read()
            sessions.append(session)
        await row(f"{idle} idle keep-alive connections open")
        for session in sessions:
            await session.close()
        await asyncio.sleep(1.0)
        await row("after they closed")

        # Concurrent streams, paced (200 chunks, 5 ms apart: about a second each).
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            async def stream() -> bool:
                async with http.post(url, data=STREAM, headers={**JSON, "X-Bench-Pace-Ms": "5"}) as response:
                    data = await response.read()
                    return response.status == 200 and data.endswith(b"data: [DONE]\n\n")

            began = time.perf_counter()
            tasks = [asyncio.create_task(stream()) for _ in range(streams)]
            await asyncio.sleep(0.5)
            await row(f"{streams} streams in flight")
            results = await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - began
        notes.append(f"{sum(results)} of {streams} concurrent streams complete, in {elapsed:.1f} s")
        await asyncio.sleep(1.0)
        await row("after the streams ended")

        # Clients that leave mid-stream, all at once: how soon the upstream sees its streams end.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            responses = [await http.post(url, data=STREAM, headers={**JSON, "X-Bench-Pace-Ms": "20"})
                         for _ in range(leaving)]
            for response in responses:
                await response.content.readany()
            await row(f"{leaving} streams in flight (20 ms a chunk)")
            before = await upstream_streaming(served)
            left = time.monotonic()
            for response in responses:
                response.close()
            while await upstream_streaming(served) > before - leaving:
                await asyncio.sleep(0.01)
            released = time.monotonic() - left
        notes.append(f"{leaving} clients left mid-stream at once ({before} upstream streams open): the upstream "
                     f"saw the last of their streams end {released * 1000:.0f} ms later")
        await asyncio.sleep(1.0)
        await row(f"after {leaving} clients left mid-stream")

        # Clients trickling a request's head, a byte a second.
        held: list[float] = []
        closed: list[float] = []
        tricklers = [asyncio.create_task(trickle(served.port, held, closed)) for _ in range(trickling)]
        await asyncio.sleep(10.0)
        await row(f"{trickling} clients trickling headers, 10 s in")
        await asyncio.gather(*tricklers)
        notes.append(f"{trickling} clients trickling headers a byte a second: the proxy closed each after "
                     f"{min(held):.0f}-{max(held):.0f} s")
        await asyncio.sleep(1.0)
        # By now the pool has also closed the upstream connections idle since the streams (30 s keep-alive).
        await row("after the trickling clients were closed")

    print(f"# Clients at volume ({idle} idle connections, {streams} concurrent streams)\n")
    for note in notes:
        print(f"- {note}")
    print("\n| moment | proxy open file descriptors | proxy RSS MB | event-loop tasks |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--leaving", type=int, default=100)
    parser.add_argument("--trickling", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.idle, args.streams, args.leaving, args.trickling))
