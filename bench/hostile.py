"""What hostile input costs the proxy: memory for huge model names, time for an endless upstream line.

    .venv/bin/python bench/hostile.py [--names 200] [--name-mb 10] [--sessions 100] [--history-mb 5]
                                      [--line-mb 60] [--answer-mb 300] [--memory-only]

Starts `loopwarden serve` (a process) on a fresh SQLite log in front of the benchmark's lean upstream, then:
1. sends `--names` requests, each with a distinct model name of `--name-mb` MB, then `--sessions` sessions each
   with one history of `--history-mb` MB, and reports the proxy's resident memory before and after each (the
   targets: under 150 MB of growth for 200 names of 10 MB, and under the long-body cache's budget (128 MiB) plus
   100 MB for 100 histories of 5 MB: no collection is needed to free a request);
2. asks for a stream whose first `data:` line is `--line-mb` MB long with no line end until its last byte,
   while another client asks `/healthz` every 10 ms: the time the stream took, and the slowest `/healthz`
   (the targets: under 5 s, and under 50 ms);
3. asks for a non-streamed answer of `--answer-mb` MB: relayed as it comes past what is inspected, so the
   proxy's memory stays near where it was;
4. sends requests whose tool results are `Error: ` and a run of 8,000, 16,000 and 100,000 digits (a backtracking
   pattern once took 10 s on 8,000), and histories never seen before of 6 and 27 MB, each while `/healthz` is
   asked every 10 ms (the targets: each answered in well under a second, `/healthz` never above 300 ms);
5. puts a second proxy in front of a raw-socket upstream that answers with 300,000 headers, with an early 413
   before the request body is read, and with answers of 1 to 8 MB that clients leave after their first bytes: the
   status each gets and how long it took, the slowest later request, and the proxy's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from overhead import Served, free_port  # noqa: E402
from page import ready  # noqa: E402

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
    await asyncio.sleep(1)
    after = rss_mb(served.proxy.pid)
    return {"names": names, "name_mb": name_mb, "statuses": statuses, "rss_before_mb": round(before, 1),
            "rss_after_mb": round(after, 1), "growth_mb": round(after - before, 1)}


async def histories(served: Served, client: aiohttp.ClientSession, sessions: int, history_mb: int) -> dict:
    """`sessions` conversations, each sending one history of `history_mb` MB (tool steps, then a last long
    message): each is a long body the proxy remembers for its session's next request, within its budget."""
    before = rss_mb(served.proxy.pid)
    statuses: dict[str, int] = {}
    for n in range(sessions):
        messages = [{"role": "system", "content": f"You are agent {n}."},
                    {"role": "user", "content": "Summarise the logs."}]
        for step in range(50):
            call = {"id": f"c{n}-{step}", "type": "function", "function": {"name": "read", "arguments": f'{{"p":{step}}}'}}
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{n}-{step}", "content": f"line {step} of session {n}"}]
        messages.append({"role": "user", "content": "l" * (history_mb * 1024 * 1024)})
        body = orjson.dumps({"model": "gpt-test", "messages": messages})
        async with client.post(f"{served.url}/chat/completions", data=body, headers={
                "Content-Type": "application/json", "X-Session-Id": f"history-{n}"}) as response:
            await response.read()
            statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
        del body, messages
    await asyncio.sleep(1)
    after = rss_mb(served.proxy.pid)
    return {"sessions": sessions, "history_mb": history_mb, "statuses": statuses, "rss_before_mb": round(before, 1),
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


async def while_probed(url: str, client: aiohttp.ClientSession, body: bytes) -> dict:
    """One request, with `/healthz` asked every 10 ms from a thread meanwhile: its status and time, and the
    slowest `/healthz`."""
    done = threading.Event()
    health: list[float] = []
    prober = threading.Thread(target=probe_health, args=(url, done, health))
    prober.start()
    await asyncio.sleep(0.1)
    began = time.perf_counter()
    async with client.post(f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"}) as got:
        await got.read()
    took = time.perf_counter() - began
    await asyncio.sleep(0.1)
    done.set()
    prober.join()
    return {"status": got.status, "seconds": round(took, 3), "body_mb": round(len(body) / 1e6, 1),
            "healthz_max_ms": round(max(health) * 1000, 1)}


def _tool_step(k: int, result: str) -> list[dict]:
    call = {"id": f"call_{k}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {k}}}'}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{k}", "content": result}]


async def stalls(served: Served, client: aiohttp.ClientSession) -> list[dict]:
    results = []
    for digits in (8_000, 16_000, 100_000):
        messages = [{"role": "user", "content": f"run it ({digits})"}]
        for k in range(3):
            messages += _tool_step(k, "Error: " + "4" * digits)
        results.append({"case": f"tool results of Error: and {digits} digits",
                        **await while_probed(served.url, client, orjson.dumps({"model": "m", "messages": messages}))})
    prose = "".join(f"{k}. The build reads the configuration file and writes the result {k * 7919} to the log.\n"
                    for k in range(40))
    for mb in (6, 27):
        messages = [{"role": "user", "content": f"summarise the notes ({mb} MB)"}]
        k = 0
        while sum(len(m.get("content") or "") for m in messages) < mb * 1_000_000:
            messages += _tool_step(k, prose)
            k += 1
        results.append({"case": f"a history never seen of {mb} MB ({len(messages)} messages)",
                        **await while_probed(served.url, client, orjson.dumps({"model": "m", "messages": messages}))})
    return results


class RawUpstream:
    """A raw-socket upstream whose answer depends on the request's model: `headers` (300,000 of them), `early`
    (a 413 before the body is read, then the connection closed), or `big-N` (an answer of N MB)."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if b"X-Case: early" in head:
                    writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 24\r\nConnection: close\r\n\r\n{\"error\": \"too large\"}  ")
                    await writer.drain()
                    break
                await reader.readexactly(length)
                if b"X-Case: headers" in head:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n")
                    for k in range(300):
                        writer.write(b"".join(b"X-H%d: v\r\n" % (k * 1000 + n) for n in range(1000)))
                        await writer.drain()
                    writer.write(b"\r\n{}")
                else:
                    size = int(head.split(b"X-Case: big-")[1].split(b"\r\n")[0]) * 1_000_000
                    body = b'{"id": "x", "object": "chat.completion", "choices": [], "pad": "%b"}' % (b"y" * size)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                                 % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # a client gone, or the benchmark over: a connection still open is cancelled then
        finally:
            writer.close()


async def hostile_upstream(tmp: str) -> list[dict]:
    server = await asyncio.start_server(RawUpstream().serve, "127.0.0.1", 0)
    up = server.sockets[0].getsockname()[1]
    port = free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream",
                              f"http://127.0.0.1:{up}/v1", "--database-url", f"sqlite+aiosqlite:///{tmp}/raw.db",
                              "--log-level", "error", "--upstream-read-timeout", "10"], cwd=ROOT)
    url = f"http://127.0.0.1:{port}/v1"
    results = []
    try:
        await ready(f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession() as client:
            chat = orjson.dumps({"model": "m", "messages": MESSAGES})
            before = rss_mb(proxy.pid)
            for case, body in (("headers", chat), ("early", b"x" * 4_000_000)):
                began = time.perf_counter()
                async with client.post(f"{url}/chat/completions" if case == "headers" else f"{url}/files",
                                       data=body, headers={"X-Case": case, "Content-Type": "application/json"}) as got:
                    text = await got.read()
                results.append({"case": {"headers": "an answer with 300,000 headers",
                                         "early": "a 413 before a 4 MB body is read"}[case], "status": got.status,
                                "seconds": round(time.perf_counter() - began, 3), "says": text[:120].decode(),
                                "rss_before_mb": round(before, 1), "rss_after_mb": round(rss_mb(proxy.pid), 1)})
            slowest = 0.0
            for mb in (1, 2, 4, 8):
                for path in ("/chat/completions", "/files"):
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(b"POST /v1%b HTTP/1.1\r\nHost: x\r\nX-Case: big-%d\r\nContent-Type: application/json"
                                 b"\r\nContent-Length: %d\r\n\r\n%b" % (path.encode(), mb, len(chat), chat))
                    await reader.read(65536)  # the answer has begun: the client leaves
                    writer.close()
                    began = time.perf_counter()
                    async with client.post(f"{url}{path}", data=chat,
                                           headers={"X-Case": f"big-{mb}", "Content-Type": "application/json"}) as got:
                        await got.read()
                    slowest = max(slowest, time.perf_counter() - began)
            results.append({"case": "clients leaving answers of 1-8 MB (watched and relayed), each followed by "
                                    "another request", "slowest_next_request_s": round(slowest, 3)})
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
        server.close()
    return results


async def main(names: int, name_mb: int, sessions: int, history_mb: int, line_mb: int, answer_mb: int,
               memory_only: bool, database_url: str | None) -> None:
    async with Served("histories", database_url) as served:  # a proxy of its own: memory freed is rarely given back
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as client:
            print(orjson.dumps(await histories(served, client, sessions, history_mb)).decode(), flush=True)
    async with Served("hostile", database_url) as served:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as client:
            print(orjson.dumps(await model_names(served, client, names, name_mb)).decode(), flush=True)
            if memory_only:
                return
            print(orjson.dumps(await endless_line(served, client, line_mb)).decode(), flush=True)
            print(orjson.dumps(await large_answer(served, client, answer_mb)).decode(), flush=True)
            for result in await stalls(served, client):
                print(orjson.dumps(result).decode(), flush=True)
        for result in await hostile_upstream(served.tmp):
            print(orjson.dumps(result).decode(), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", type=int, default=200)
    parser.add_argument("--name-mb", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--history-mb", type=int, default=5)
    parser.add_argument("--memory-only", action="store_true", help="only the two memory parts (1 and 2)")
    parser.add_argument("--database-url", help="the log's database (default: a fresh SQLite file)")
    parser.add_argument("--line-mb", type=int, default=60)
    parser.add_argument("--answer-mb", type=int, default=300)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.names, arguments.name_mb, arguments.sessions, arguments.history_mb, arguments.line_mb,
                     arguments.answer_mb, arguments.memory_only, arguments.database_url))
