"""`loopwarden serve` as a process: it migrates, serves, and lets streams finish when stopped."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from contextlib import asynccontextmanager

import openai

from tests.fake_upstream import Turn
from tests.test_log_api import _serve


@asynccontextmanager
async def serving(database_url: str, upstream_url: str, log_level: str = "warning", *flags: str):
    """`loopwarden serve` as a process: (process, port); killed on the way out if still running."""
    process, port = await _serve(database_url, upstream_url, log_level, *flags)
    try:
        yield process, port
    finally:
        if process.returncode is None:
            process.kill()
            process.communicate()


async def stopped(process) -> str:
    """Stop with SIGTERM; what the process wrote to stderr."""
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = await asyncio.to_thread(process.communicate, timeout=30)
    except Exception:  # still running: killed and reaped here, so that the failure is this test's alone
        process.kill()
        process.communicate()
        raise
    return stderr.decode()


async def test_sigterm_lets_a_stream_in_flight_finish(upstream, tmp_path):
    database = tmp_path / "serve.db"
    async with serving(f"sqlite+aiosqlite:///{database}", upstream.url) as (process, port):
        text = "".join(f"Part {i} of a long, slow answer. " for i in range(60))
        upstream.script.append(Turn(content=text, chunk_chars=20, delay=0.02))
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-x", max_retries=0)
        stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}],
                                                      stream=True)
        received = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if not received:
                    process.send_signal(signal.SIGTERM)  # stop while the answer is still streaming
                received.append(chunk.choices[0].delta.content)
        assert "".join(received) == text
        await client.close()
        await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0
        # `serve` applied the migrations itself.
        tables = {row[0] for row in sqlite3.connect(database).execute("SELECT name FROM sqlite_master")}
        assert {"detections", "sessions", "judge_checks"} <= tables


async def test_debug_logging_is_loopwardens_own_and_the_access_log(upstream, tmp_path):
    async with serving(f"sqlite+aiosqlite:///{tmp_path}/debug.db", upstream.url, "debug") as (process, port):
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-x", max_retries=0)
        for _ in range(3):
            upstream.script.append(Turn(content="hello"))
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
        await client.close()
        await asyncio.sleep(0.6)  # a flush of the log writer, which talks to the database
        lines = (await stopped(process)).splitlines()
    assert any(" aiohttp.access: " in line and "POST /v1/chat/completions" in line for line in lines)
    debug_sources = {line.split(" DEBUG ")[1].split(":")[0] for line in lines if " DEBUG " in line}
    assert debug_sources and all(name.startswith("loopwarden") for name in debug_sources), debug_sources


async def test_a_malformed_request_is_refused_without_a_traceback(upstream, tmp_path):
    """Not HTTP, conflicting lengths, a header over 8 KB: the HTTP parser answers 400 before any route, and
    the log holds no traceback for the client's mistake (with --log-level debug, one line each). They never
    reach a route, so the answer is aiohttp's plain-text 400, not the OpenAI shape: no client library can
    send such a request."""
    heads = [b"GARBAGE\r\n\r\n",
             b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
             b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
             b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"]
    for level in ("info", "debug"):
        async with serving(f"sqlite+aiosqlite:///{tmp_path}/{level}.db", upstream.url, level) as (process, port):
            for head in heads:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(head)
                answer = await asyncio.wait_for(reader.read(), 5)
                writer.close()
                assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 ")), answer[:80]
            log = await stopped(process)
        assert "Traceback" not in log and " ERROR " not in log, log[-2000:]
        refused = [line for line in log.splitlines() if "refused a malformed request" in line]
        # Not HTTP at all (a scanner, TLS on the plain port) is aiohttp's own debug line, left out of both.
        assert len(refused) == (len(heads) - 1 if level == "debug" else 0), log[-2000:]


async def test_serve_runs_on_uvloop_where_installed_and_on_the_standard_loop_when_asked(upstream, tmp_path):
    """The start line with --verbose names the loop; a request goes through on each."""
    import os
    import subprocess
    import sys

    for choice, expected in (("auto", "uvloop"), ("asyncio", "asyncio")):
        os.environ["LOOPWARDEN_EVENT_LOOP"] = choice
        try:
            async with serving(f"sqlite+aiosqlite:///{tmp_path}/{choice}.db", upstream.url, "info",
                               "--verbose") as (process, port):
                client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-x", max_retries=0)
                upstream.script.append(Turn(content="hello"))
                answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
                await client.close()
                assert answer.choices[0].message.content == "hello"
                start = next(line for line in (await stopped(process)).splitlines() if "built: " in line)
        finally:
            del os.environ["LOOPWARDEN_EVENT_LOOP"]
        assert f"event loop {expected}, request path " in start, start
    described = subprocess.run([sys.executable, "-m", "proxy", "config"], capture_output=True, text=True,
                               env={**os.environ, "LOOPWARDEN_EVENT_LOOP": "asyncio"}).stdout
    assert "event loop: asyncio" in described
    # The start line and `config` say alike how the request path runs (compiled, or as plain Python).
    assert start.endswith(f"request path {described.split('request path: ')[1].splitlines()[0]}"), start


async def test_the_first_mistakes_get_one_line_each(tmp_path):
    """A port in use, and an upstream URL that names an endpoint: one line that says what, no traceback."""
    import subprocess
    import sys

    from tests.test_log_api import ROOT

    def serve(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "proxy", "serve", "--database-url",
                               f"sqlite+aiosqlite:///{tmp_path}/mistakes.db", *flags],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    async with serving(f"sqlite+aiosqlite:///{tmp_path}/taken.db", "http://127.0.0.1:9/v1") as (_, port):
        taken = await asyncio.to_thread(serve, "--port", str(port))
    assert taken.returncode == 1 and "Traceback" not in taken.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr and "address already in use" in taken.stderr
    endpoint = await asyncio.to_thread(serve, "--upstream", "https://api.example.com/v1/chat/completions")
    assert endpoint.returncode == 2 and "Traceback" not in endpoint.stderr
    assert "is an endpoint, not a base URL: give 'https://api.example.com/v1'" in endpoint.stderr


async def test_sigterm_at_any_moment_of_the_start_exits_0_without_a_traceback(tmp_path):
    import subprocess
    import sys

    from tests.test_log_api import ROOT, _free_port

    for delay in (0.8, 1.2, 1.6, 2.0, 2.5):  # from the moment its arguments are read
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--port", str(_free_port()), "--upstream", "http://127.0.0.1:9/v1",
             "--database-url", f"sqlite+aiosqlite:///{tmp_path}/start-{delay}.db"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        await asyncio.sleep(delay)
        stderr = await stopped(process)
        assert process.returncode == 0 and "Traceback" not in stderr, (delay, stderr[-2000:])


async def test_the_start_line_says_what_a_newcomer_needs_and_keeps_build_details_for_verbose(upstream, tmp_path):
    """Where it listens, each upstream, the database, what it does to a loop, and that the judge is off (it spends
    model calls, so only when asked for); how it was built only with --verbose."""
    async with serving(f"sqlite+aiosqlite:///{tmp_path}/start.db", upstream.url, "info",
                       "--preset", "default") as (process, port):
        lines = (await stopped(process)).splitlines()
    start = next(line for line in lines if "listening on" in line)
    assert f"listening on http://127.0.0.1:{port}" in start
    assert f"OpenAI {upstream.url}" in start and "Anthropic https://api.anthropic.com" in start
    assert "Gemini https://generativelanguage.googleapis.com" in start
    assert f"database: SQLite {tmp_path}/start.db" in start
    assert "preset default: warned at the 3rd and 4th identical call, stopped at the 5th" in start
    assert start.endswith("judge off"), start
    assert not any("request path" in line or "compiled" in line for line in lines), lines

    async with serving(f"sqlite+aiosqlite:///{tmp_path}/judged.db", upstream.url, "info", "--llm-check", "true",
                       "--judge-model", "small-judge") as (process, port):
        start = next(line for line in (await stopped(process)).splitlines() if "listening on" in line)
    assert start.endswith("judge on: its calls go to each request's own upstream, model small-judge, on the "
                          "client's key"), start
