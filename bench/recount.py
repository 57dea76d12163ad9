"""Detections written beside the overview's counts (a restore, an older replica): what the API says meanwhile.

    .venv/bin/python bench/recount.py [--rows 2000000] [--database-url postgresql+asyncpg://...]

Starts `loopwarden serve` on a fresh log, then writes `--rows` detections straight into its table, as another
tool would, without touching the counts. It then asks `stats` and the timeline every 250 ms until the counts
are whole again, and reports: how soon `complete: false` showed, when the counts were whole, whether any answer
said `complete: true` with a wrong total (never allowed), and the slowest answer of each.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import aiohttp
import orjson
from sqlalchemy import insert
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from overhead import Served  # noqa: E402
from proxy.store.models import Detection  # noqa: E402

BATCH = 20_000


async def write_beside(database_url: str, rows: int) -> float:
    """Insert detections in the table only (no counts), spread over the last 24 hours."""
    engine = create_async_engine(database_url)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    began = time.perf_counter()
    for start in range(0, rows, BATCH):
        batch = [{"created_at": now - timedelta(seconds=(n * 86_400) // rows), "session_id": f"restored-{n % 5000}",
                  "tenant": "t-restored", "task": "task", "model": "m", "type": "tool_call", "action": "warned",
                  "episode": 1, "episode_limit": 2, "turn": 5, "detail": {}, "request_id": None,
                  "tokens_saved_estimate": 0, "recovered": False, "enforced": True, "episode_key": f"restored-{n}"}
                 for n in range(start, min(rows, start + BATCH))]
        for attempt in range(60):  # the proxy may be rebuilding its counts meanwhile (SQLite: one writer)
            try:
                async with engine.begin() as connection:
                    await connection.execute(insert(Detection), batch)
                break
            except OperationalError:
                await asyncio.sleep(1)
    await engine.dispose()
    return time.perf_counter() - began


async def ask(http: aiohttp.ClientSession, url: str) -> tuple[dict, float]:
    began = time.perf_counter()
    async with http.get(url) as response:
        body = orjson.loads(await response.read())
    return body, time.perf_counter() - began


async def main(rows: int, database_url: str | None, limit: float) -> None:
    async with Served("recount", database_url=database_url) as served:
        root = served.url[:-3]
        wrote = await write_beside(served.database_url, rows)
        print(f"wrote {rows} detections beside the counts in {wrote:.1f} s", flush=True)
        began = time.perf_counter()
        first_incomplete = whole_at = None
        wrong, slowest = 0, {"stats": 0.0, "timeline": 0.0}
        async with aiohttp.ClientSession() as http:
            while time.perf_counter() - began < limit:
                stats, took = await ask(http, f"{root}/loopwarden/api/stats")
                slowest["stats"] = max(slowest["stats"], took)
                timeline, took = await ask(http, f"{root}/loopwarden/api/timeline")
                slowest["timeline"] = max(slowest["timeline"], took)
                at = time.perf_counter() - began
                if not stats["complete"] and first_incomplete is None:
                    first_incomplete = at
                if stats["complete"] and stats["detections"] != rows:
                    wrong += 1
                if stats["complete"] and stats["detections"] == rows and timeline["complete"]:
                    whole_at = at
                    break
                await asyncio.sleep(0.25)
        print(orjson.dumps({
            "rows": rows, "database": served.database_url.split(":")[0],
            "first_complete_false_s": None if first_incomplete is None else round(first_incomplete, 1),
            "whole_again_s": None if whole_at is None else round(whole_at, 1),
            "complete_true_with_a_wrong_total": wrong,
            "slowest_stats_ms": round(slowest["stats"] * 1000), "slowest_timeline_ms": round(slowest["timeline"] * 1000),
        }).decode(), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--database-url")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds to wait for the counts")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.rows, arguments.database_url, arguments.limit))
