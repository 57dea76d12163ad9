"""Generated bad input at volume: request bodies and upstream streams, counted.

    .venv/bin/python bench/fuzz.py [--requests 10000] [--raw 5000] [--streams 2500] [--database-url URL]

The strategies are the ones `make test` draws a bounded subset of (tests/test_fuzz.py): request bodies, whole
HTTP requests written to a socket (odd methods, paths and encodings, framing, duplicated and huge headers),
and upstream streams. Counts: answers of
the proxy's own making outside the OpenAI error shape, 5xx for a client's mistake, error log records
(tracebacks), requests that did not finish within 10 seconds, and upstream streams not passed on byte for
byte (a stream whose text chants, the same delta over and over, is cut as it should be, and counted apart).

Then the log writer's health (on SQLite by default; `--database-url postgresql+asyncpg://...` for a real
PostgreSQL, whose columns refuse what SQLite takes): whether its writes fail, records set aside or dropped,
every detection the run logged in the table, and a loop of another client after the run logged too.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import start_proxy  # noqa: E402
from tests.fake_upstream import FakeUpstream, Turn  # noqa: E402
from tests.test_fuzz import (  # noqa: E402
    CASES, REQUESTS, STREAMS, Errors, drawn, passed_on, problem, raw_request, send_raw)


async def main(requests: int, raw: int, streams: int, database_url: str | None) -> None:
    upstream = await FakeUpstream().start()
    proxy = await start_proxy(upstream_url=upstream.url, llm_check=False,
                              database_url=database_url or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/fuzz.db")
    errors = Errors()
    logging.getLogger().addHandler(errors)
    counts = {"requests": 0, "not_openai_shape": 0, "server_error_for_client_mistake": 0, "hangs": 0,
              "raw": 0, "streams": 0, "streams_changed": 0, "streams_cut": 0}
    problems: list[tuple[str, bytes]] = []

    def count(found: str | None, request: bytes) -> None:
        if found is not None:
            counts["server_error_for_client_mistake" if found[0] == "5" else "not_openai_shape"] += 1
            problems.append((found, request[:400]))

    began = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for path, data in drawn(CASES, requests):
            counts["requests"] += 1
            before = len(upstream.requests)
            try:
                async with http.post(f"{proxy.url}{path}", data=data,
                                     headers={"Content-Type": "application/json"}) as answer:
                    body = await answer.read()
            except asyncio.TimeoutError:
                counts["hangs"] += 1
                continue
            count(problem(answer.status, body, len(upstream.requests) > before), path.encode() + b" " + data)
        for parts in drawn(REQUESTS, raw):
            counts["raw"] += 1
            before = len(upstream.requests)
            try:
                status, headers, body = await send_raw(proxy.port, parts)
            except asyncio.TimeoutError:
                counts["hangs"] += 1
                continue
            count(problem(status, body, len(upstream.requests) > before, headers.get("content-type", ""), parts[0]),
                  raw_request(*parts))
        for n, stream in enumerate(drawn(STREAMS, streams)):
            counts["streams"] += 1
            upstream.script.append(Turn(raw_body=stream, headers={"Content-Type": "text/event-stream"}))
            path = "/chat/completions" if n % 2 else "/responses"
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}], "input": "go"}
            try:
                async with http.post(f"{proxy.url}{path}", json=body) as answer:
                    got = await answer.read()
                    if answer.status != 200 or not passed_on(stream, got):
                        counts["streams_changed"] += 1
                    elif got != stream:
                        counts["streams_cut"] += 1  # the same text over and over: cut, as it should be
            except asyncio.TimeoutError:
                counts["hangs"] += 1
    logging.getLogger().removeHandler(errors)
    elapsed = time.perf_counter() - began
    health = await writer_health(proxy, upstream)
    await proxy.runner.cleanup()
    await upstream.close()
    print(f"# Generated bad input: {counts['requests']:,} request bodies, {counts['raw']:,} whole requests and "
          f"{counts['streams']:,} upstream streams in {elapsed:.0f} s\n")
    print("| figure | count |\n|---|---|")
    names = {"not_openai_shape": "answers of the proxy's own making outside the OpenAI error shape",
             "server_error_for_client_mistake": "5xx for a client's mistake",
             "hangs": "requests that did not finish within 10 s",
             "streams_changed": "upstream streams not passed on byte for byte (but for a cut)",
             "streams_cut": "upstream streams whose text chanted, cut (not a fault)"}
    for name, label in names.items():
        print(f"| {label} | {counts[name]} |")
    print(f"| error log records (tracebacks) | {len(errors.records)} |")
    print("\n# The log writer after the run\n\n| figure | value |\n|---|---|")
    for label, value in health.items():
        print(f"| {label} | {value} |")
    for found, request in problems[:10]:
        print(f"\n{found}, for:\n    {request!r}")


async def writer_health(proxy, upstream) -> dict[str, object]:
    """The writer once the run is written: failing or not, what it set aside or dropped, the run's detections
    all in the table, and another client's loop after the run logged."""
    from sqlalchemy import func, select

    from proxy.server.app import GUARD, METRICS
    from proxy.store.models import DeadLetter, Detection

    app = proxy.runner.app
    store = app[GUARD].store
    upstream.script.clear()
    upstream.responder = None
    messages = [{"role": "system", "content": "after the fuzz run"}, {"role": "user", "content": "fix it"}]
    async with aiohttp.ClientSession() as http:
        for _ in range(6):  # five identical calls: the sixth request carries the warning, which is logged
            upstream.script.append(Turn(tool_calls=[("read_file", {"path": "a.py"})]))
            async with http.post(f"{proxy.url}/chat/completions", json={"model": "m", "messages": messages},
                                 headers={"Authorization": "Bearer sk-after-the-run",
                                          "X-Loopwarden-Session": "after-the-run"}) as answer:
                message = (await answer.json())["choices"][0]["message"]
            messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "x"}]
    try:
        await asyncio.wait_for(store.writer.flush(), 30)
    except Exception as exc:  # reported below as the writer's state
        print(f"flush failed: {exc}")
    logged = sum(sample.value for metric in app[METRICS].detections.collect() for sample in metric.samples
                 if sample.name.endswith("_total"))
    async with store.engine.connect() as connection:
        rows = (await connection.execute(select(func.count()).select_from(Detection))).scalar()
        rejects = (await connection.execute(select(func.count()).select_from(DeadLetter))).scalar()
        after = (await connection.execute(select(func.count()).select_from(Detection).where(
            Detection.session_id == "after-the-run"))).scalar()
    writer = store.writer
    return {"database": store.engine.dialect.name,
            "writer": f"failing for {writer.failing_for():.0f} s" if writer.failing_for() else "writing",
            "records pending": writer.pending, "records dropped": writer.dropped,
            "records set aside (dead_letters rows)": f"{writer.rejected} ({rejects})",
            "detections logged by the run (metric)": int(logged), "detections in the table": rows,
            "another client's loop after the run logged": "yes" if after else "NO"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--raw", type=int, default=5_000)
    parser.add_argument("--streams", type=int, default=2_500)
    parser.add_argument("--database-url", help="the log's database (default: a temporary SQLite file); a "
                                               "PostgreSQL one is migrated here, and should be empty")
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.raw, args.streams, args.database_url))
