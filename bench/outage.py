"""The log's database unavailable under load: SQLite held locked by another process, PostgreSQL stopped and
started again.

    .venv/bin/python bench/outage.py [--outage 30] [--rate 200] [--only sqlite|postgresql]

`loopwarden serve` in front of the benchmark's lean upstream gets a steady load of requests that each
carry a new warning (a new session whose conversation loops): one record owed to the log per answer with
`X-Loopwarden-Warning`. After a few seconds the database goes away for `--outage` seconds; the load goes
on through it and for a while after. Then the proxy is stopped with SIGTERM and the rows are counted.
PostgreSQL is `LOOPWARDEN_BENCH_POSTGRES_URL` (default: the local server), in a database made for the
run; stopping it needs `pg_ctlcluster`, so that part runs where the server is local.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from overhead import Served, conversation, pct  # noqa: E402

from proxy.store.database import create_engine  # noqa: E402
from proxy.store.models import Detection  # noqa: E402

LOOPING = orjson.dumps({"model": "bench", "messages": conversation(8, looping=True)})  # one warning each
BEFORE, AFTER = 5.0, 15.0  # seconds of load before the outage and after it


async def load(served: Served, rate: float, seconds: float, outage: tuple[float, float]) -> dict:
    """Requests at a steady rate, each a new session; latencies by phase, failures, records owed."""
    phases: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    failures = owed = 0
    started = time.monotonic()
    counter = 0

    async def one(http: aiohttp.ClientSession, n: int) -> None:
        nonlocal failures, owed
        sent = time.monotonic()
        try:
            async with http.post(f"{served.url}/chat/completions", data=LOOPING,
                                 headers={"Content-Type": "application/json",
                                          "X-Loopwarden-Session": f"outage-{n}"}) as response:
                await response.read()
                if response.status != 200:
                    failures += 1
                    return
                owed += "X-Loopwarden-Warning" in response.headers
        except aiohttp.ClientError:
            failures += 1
            return
        at = sent - started
        phase = "before" if at < outage[0] else "during" if at < outage[1] else "after"
        phases[phase].append(time.monotonic() - sent)

    async with aiohttp.ClientSession() as http:
        tasks = []
        while (now := time.monotonic() - started) < seconds:
            tasks.append(asyncio.create_task(one(http, counter)))
            counter += 1
            await asyncio.sleep(max(0.0, counter / rate - now))
        await asyncio.gather(*tasks)
    return {"phases": phases, "failures": failures, "owed": owed, "sent": counter}


async def count_rows(url: str) -> int:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            return (await connection.execute(select(func.count()).select_from(Detection))).scalar()
    finally:
        await engine.dispose()


def hold_sqlite_lock(path: str, seconds: float) -> subprocess.Popen:
    """Another process takes the database's write lock and keeps it."""
    script = ("import sqlite3, sys, time\n"
              "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True)\n"
              "time.sleep(float(sys.argv[2])); c.execute('COMMIT')\n")
    holder = subprocess.Popen([sys.executable, "-c", script, path, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def postgres_cluster(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action], check=True,
                   capture_output=True)


async def fresh_postgres_database(url: str) -> str:
    name = f"loopwarden_outage_{os.getpid()}"
    admin = create_engine(url)
    try:
        async with admin.connect() as connection:
            connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
            await connection.execute(text(f"DROP DATABASE IF EXISTS {name}"))
            await connection.execute(text(f"CREATE DATABASE {name}"))
    finally:
        await admin.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def run(kind: str, outage: float, rate: float, url: str) -> dict:
    seconds = BEFORE + outage + AFTER
    async with Served("outage", url, log_level="warning") as served:
        loading = asyncio.create_task(load(served, rate, seconds, (BEFORE, BEFORE + outage)))
        await asyncio.sleep(BEFORE)
        if kind == "sqlite":
            holder = hold_sqlite_lock(served.database, outage)
            await asyncio.to_thread(holder.wait)
        else:
            await asyncio.to_thread(postgres_cluster, "stop")  # the load goes on meanwhile
            await asyncio.sleep(outage)
            await asyncio.to_thread(postgres_cluster, "start")
        result = await loading
        served.proxy.send_signal(signal.SIGTERM)
        served.proxy.wait(timeout=60)
        result["written"] = await count_rows(served.database_url)
        result["log"] = [line.strip() for line in open(served.log) if "loopwarden" in line]
    return result


async def main(outage: float, rate: float, only: str | None) -> None:
    print(f"# The log's database away for {outage:g} s under {rate:g} requests/s, each owing a record\n")
    print("| outage | requests | failed | p99 ms before / during / after | records owed | written | lost |")
    print("|---|---|---|---|---|---|---|")
    runs = []
    if only in (None, "sqlite"):
        runs.append(("SQLite held locked by another process", "sqlite", None))
    if only in (None, "postgresql"):
        base = os.environ.get("LOOPWARDEN_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
        runs.append(("PostgreSQL stopped, then started", "postgresql", await fresh_postgres_database(base)))
    logs = []
    for label, kind, url in runs:
        result = await run(kind, outage, rate, url)
        p99 = " / ".join(f"{pct(v, .99) * 1000:.1f}" if v else "-" for v in result["phases"].values())
        print(f"| {label} | {result['sent']} | {result['failures']} | {p99} | {result['owed']} | "
              f"{result['written']} | {result['owed'] - result['written']} |", flush=True)
        logs.append((label, result["log"]))
    for label, lines in logs:
        print(f"\nThe proxy's log, {label}:\n")
        for line in lines:
            print(f"    {line}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outage", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    args = parser.parse_args()
    asyncio.run(main(args.outage, args.rate, args.only))
