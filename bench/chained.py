"""What the read-your-writes guarantee of chained Responses costs: a request whose response the service keeps
(`store` on, continued with `previous_response_id`) is answered only once its record is written, so any replica
can read it. Measured against the same requests with `store: false`, on one replica (SQLite, PostgreSQL) and
on three replicas of one PostgreSQL taken in turn.

    python bench/chained.py [--quick]      # LOOPWARDEN_BENCH_POSTGRES_URL adds the PostgreSQL rows
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time

import aiohttp
import orjson
from overhead import ROOT, free_port, pct, wait_ready


def body(store: bool, previous: str | None, step: int) -> bytes:
    request = {"model": "bench", "instructions": "You are an agent.", "store": store,
               "input": [{"role": "user", "content": f"Step {step}: carry on with the next file."}]}
    if previous is not None:
        request["previous_response_id"] = previous
    return orjson.dumps(request)


async def measure(urls: list[str], rounds: int) -> dict[bool, list[float]]:
    """Requests with `store` on (each continuing the one before, a new conversation every 10) and off,
    interleaved, each to the next replica."""
    samples: dict[bool, list[float]] = {True: [], False: []}
    previous = None
    async with aiohttp.ClientSession() as http:
        for i in range(rounds):
            for store in (True, False):
                started = time.perf_counter()
                async with http.post(urls[i % len(urls)] + "/responses",
                                     data=body(store, previous if store and i % 10 else None, i),
                                     headers={"Content-Type": "application/json"}) as response:
                    answer = orjson.loads(await response.read())
                    assert response.status == 200, answer
                samples[store].append(time.perf_counter() - started)
                if store:
                    previous = answer["id"]
    return samples


async def run(quick: bool) -> None:
    rounds = 300 if quick else 1500
    processes = []
    tmp = tempfile.mkdtemp(prefix="lw-chained-")
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}/v1"
    processes.append(subprocess.Popen([sys.executable, str(ROOT / "bench/servers.py"), "upstream", str(up_port)]))
    await wait_ready(upstream)
    setups = [("one replica, SQLite", f"sqlite+aiosqlite:///{tmp}/one.db", 1)]
    postgres = os.environ.get("LOOPWARDEN_BENCH_POSTGRES_URL")
    if postgres:
        setups += [("one replica, PostgreSQL", postgres, 1), ("three replicas, PostgreSQL, in turn", postgres, 3)]
    print("| setup | store off p50 ms | store on, chained p50 ms | added p50 ms | store off p99 ms | "
          "store on p99 ms |\n|---|---|---|---|---|---|")
    try:
        for name, database, count in setups:
            subprocess.run([sys.executable, "-m", "proxy", "migrate", "--database-url", database], cwd=ROOT,
                           check=True, capture_output=True)
            ports = [free_port() for _ in range(count)]
            replicas = [subprocess.Popen(
                [sys.executable, "-m", "proxy", "serve", "--no-migrate", "--port", str(port), "--upstream", upstream,
                 "--database-url", database, "--llm-check", "false", "--log-level", "error"], cwd=ROOT)
                for port in ports]
            urls = [f"http://127.0.0.1:{port}/v1" for port in ports]
            try:
                for url in urls:
                    await wait_ready(url)
                await measure(urls, 50)  # warm-up
                samples = await measure(urls, rounds)
            finally:
                for replica in replicas:
                    replica.terminate()
                    replica.wait(timeout=30)
            off, on = samples[False], samples[True]
            print(f"| {name} | {pct(off, .5) * 1000:.3f} | {pct(on, .5) * 1000:.3f} | "
                  f"{(pct(on, .5) - pct(off, .5)) * 1000:.3f} | {pct(off, .99) * 1000:.3f} | "
                  f"{pct(on, .99) * 1000:.3f} |")
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    asyncio.run(run(parser.parse_args().quick))
