"""What hostile input costs the proxy: memory for huge model names, time for an endless upstream line.

    .venv/bin/python bench/hostile.py [--names 100] [--name-mb 10] [--line-mb 60] [--answer-mb 300]

Starts `loopwarden serve` (a process) on a fresh SQLite log in front of the benchmark's lean upstream, then:
1. sends `--names` requests, each with a distinct model name of `--name-mb` MB, and reports the proxy's
   resident memory before and after (the target: under 150 MB of growth for 100 names of 10 MB);
2. asks for a stream whose first `data:` line is `--line-mb` MB long with no line end until its last byte,
   while another client asks `/healthz` every 10 ms: the time the stream took, and the slowest `/healthz`
   (the targets: under 5 s, and under 50 ms);
3. asks for a non-streamed answer of `--answer-mb` MB: relayed as it comes past what is inspected, so the
   proxy's memory stays near where it was.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from overhead import Served  # noqa: E402

MESSAGES = [{"role": "user", "content": "hello"}]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def model_names(served: Served, client: aiohttp.ClientSession, names: int, name_mb: int) -> dict:
    for n in range(20):  # warm up: every path taken once
        async with client.post(f"{served.url}/chat/completions", json={"model": f"warm-{n}", "messages": MESSAGES}) as r:
            await r.read()
    before = rss_mb(served.proxy.pid)
    statuses: dict[str, int] = {}
    for n in range(names):
        name = f"{n:04d}" + "m" * (name_mb * 1024 * 1024)
        body = orjson.dumps({"model": name, "messages": MESSAGES})
        async with client.post(f"{served.url}/chat/completions", data=body,
                             headers={"Content-Type": "application/json"}) as response:
            await response.read()
            statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
        del body, name
        gc.collect()
    await asyncio.sleep(1)
    after = rss_mb(served.proxy.pid)
    return {"names": names, "name_mb": name_mb, "statuses": statuses, "rss_before_mb": round(before, 1),
            "rss_after_mb": round(after, 1), "growth_mb": round(after - before, 1)}


def probe_health(url: str, done: threading.Event, times: list[float]) -> None:
    """Ask `/healthz` every 10 ms until done, from a thread of its own (the client reading the long stream
    must not delay the probe)."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    while not done.is_set():
        began = time.perf_counter()
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        times.append(time.perf_counter() - began)
        time.sleep(0.01)
    connection.close()


async def endless_line(served: Served, client: aiohttp.ClientSession, line_mb: int) -> dict:
    done = threading.Event()
    health: list[float] = []
    prober = threading.Thread(target=probe_health, args=(served.url, done, health))
    prober.start()
    await asyncio.sleep(0.2)
    began = time.perf_counter()
    size = 0
    async with client.post(f"{served.url}/chat/completions", json={"model": "m", "messages": MESSAGES,
                                                                   "stream": True},
                           headers={"X-Bench-Endless-MB": str(line_mb)}) as response:
        async for chunk in response.content.iter_any():
            size += len(chunk)
    took = time.perf_counter() - began
    done.set()
    prober.join()
    health.sort()
    return {"line_mb": line_mb, "bytes_relayed": size, "seconds": round(took, 2), "healthz_probes": len(health),
            "healthz_p50_ms": round(health[len(health) // 2] * 1000, 1),
            "healthz_max_ms": round(health[-1] * 1000, 1), "proxy_rss_mb": round(rss_mb(served.proxy.pid), 1)}


async def large_answer(served: Served, client: aiohttp.ClientSession, answer_mb: int) -> dict:
    """A non-streamed answer of `answer_mb` MB: relayed whole, and the proxy's memory at its peak."""
    peak = rss_mb(served.proxy.pid)
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(served.proxy.pid))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    began = time.perf_counter()
    size = 0
    async with client.post(f"{served.url}/chat/completions", json={"model": "m", "messages": MESSAGES},
                           headers={"X-Bench-Answer-MB": str(answer_mb)}) as response:
        async for chunk in response.content.iter_any():
            size += len(chunk)
    took = time.perf_counter() - began
    done.set()
    await watcher
    return {"answer_mb": answer_mb, "bytes_relayed": size, "seconds": round(took, 2),
            "proxy_peak_rss_mb": round(peak, 1)}


async def main(names: int, name_mb: int, line_mb: int, answer_mb: int) -> None:
    async with Served("hostile") as served:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as client:
            print(orjson.dumps(await model_names(served, client, names, name_mb)).decode(), flush=True)
            print(orjson.dumps(await endless_line(served, client, line_mb)).decode(), flush=True)
            print(orjson.dumps(await large_answer(served, client, answer_mb)).decode(), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", type=int, default=100)
    parser.add_argument("--name-mb", type=int, default=10)
    parser.add_argument("--line-mb", type=int, default=60)
    parser.add_argument("--answer-mb", type=int, default=300)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.names, arguments.name_mb, arguments.line_mb, arguments.answer_mb))
