"""The web page on a big log: detections over 30 days in SQLite or PostgreSQL, the overview loaded in
headless Chromium.

    .venv/bin/python bench/page.py [--rows N] [--database sqlite|postgresql]

Seeds the log through the batched writer (as the proxy writes it, the overview's counts with it), starts
`loopwarden serve` on it, and times, five times each: the overview's three API calls (stats, timeline,
recent detections) from a client for the last 24 hours and for 30 days, and the page in Chromium from
navigation to the recent detections and the chart drawn. PostgreSQL: a fresh database on
LOOPWARDEN_BENCH_POSTGRES_URL's server (default the local test server).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from outage import fresh_postgres_database  # noqa: E402
from overhead import free_port  # noqa: E402

from proxy.store.database import run_migrations  # noqa: E402
from proxy.store.writer import LogWriter, utcnow  # noqa: E402

TYPES = ["tool_call", "tool_cycle", "tool_error", "content", "llm"]
MODELS = ["gpt-test", "claude-test", "qwen-test"]


async def seed(url: str, rows: int) -> None:
    await asyncio.to_thread(run_migrations, url)
    writer = LogWriter(url, capacity=20_000)
    writer.start()
    rng = random.Random(3)
    now = utcnow()
    for n in range(rows):
        if n % 10_000 == 0:
            await writer.flush()
        session = f"session-{n % 2000}"
        writer.add_detection({
            "created_at": now - timedelta(seconds=rng.randint(0, 30 * 86400)), "session_id": session,
            "tenant": "bench", "task": f"task-{n // 3}", "model": rng.choice(MODELS), "type": rng.choice(TYPES),
            "action": ["warned", "warned", "stopped", "cut"][n % 4], "episode": n % 3 + 1, "episode_limit": 2,
            "turn": rng.randint(5, 60), "detail": {"tool": "read_file", "arguments": '{"path":"src/a.py"}',
                                                   "repeats": 5, "result": "def main(): ..."},
            "request_id": None, "tokens_saved_estimate": 100, "episode_key": f"bench-{n}"})
        if n < 2000:
            writer.session_seen("bench", session, 40, "gpt-test")
    await writer.close(60)


async def ready(root: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(f"{root}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{root} did not come up")


async def main(rows: int, database: str) -> None:
    if database == "postgresql":
        url = await fresh_postgres_database(
            os.environ.get("LOOPWARDEN_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"))
    else:
        url = f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='lw-page-')}/page.db"
    started = time.perf_counter()
    await seed(url, rows)
    print(f"# The page on {rows:,} detections over 30 days in {database} "
          f"(seeded in {time.perf_counter() - started:.0f} s)\n")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port), "--database-url", url,
                                "--log-level", "warning", "--llm-check", "false"], cwd=ROOT)
    root = f"http://127.0.0.1:{port}"
    try:
        await ready(root)
        api: dict[str, list[float]] = {"24h": [], "30d": []}
        async with aiohttp.ClientSession() as http:
            for _ in range(5):
                for period in api:
                    began = time.perf_counter()
                    for path in (f"stats?since={period}", f"timeline?since={period}&buckets=48",
                                 f"detections?since={period}&limit=50"):
                        async with http.get(f"{root}/loopwarden/api/{path}") as response:
                            await response.read()
                            assert response.status == 200, path
                    api[period].append(time.perf_counter() - began)
        from playwright.async_api import async_playwright

        loads: dict[str, list[float]] = {"24h": [], "30d": []}
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            for _ in range(5):
                for period in loads:
                    page = await browser.new_page()
                    began = time.perf_counter()
                    await page.goto(f"{root}/loopwarden/#since={period}")
                    await page.wait_for_selector("#recent tbody tr td.evidence")
                    await page.wait_for_selector("#chart rect")
                    loads[period].append(time.perf_counter() - began)
                    await page.close()
            await browser.close()
        print("| measure | median ms | worst ms |\n|---|---|---|")
        for period, label in (("24h", "last 24 hours"), ("30d", "all 30 days")):
            print(f"| the overview's three API calls one after another (stats, timeline, detections), {label} | "
                  f"{statistics.median(api[period]) * 1000:.0f} | {max(api[period]) * 1000:.0f} |")
        for period, label in (("24h", "last 24 hours"), ("30d", "all 30 days")):
            print(f"| the page in Chromium, navigation to table and chart drawn ({label}) | "
                  f"{statistics.median(loads[period]) * 1000:.0f} | {max(loads[period]) * 1000:.0f} |")
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.rows, arguments.database))
