"""Every bad value a 400 or an exit 2 with one line, never a 500 or a Python error; and the CLI as a new user
meets it: the flag named when a flag was given, quiet in a closed pipe, help for every flag, where the
database is."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from proxy.cli import main
from proxy.config import FIELDS, flag_name
from proxy.store.database import run_migrations
from proxy.store.writer import LogWriter
from tests.test_log_poison import detection
from tests.test_log_api import ROOT, _free_port

ODD = {"since": ["0001-01-01T00:00", "99999999w", "99999999999999999999d", "1969-12-31T00:00"],
       "cursor": ["1" * 23, "-1", "12a"], "limit": ["9" * 30, "0"], "buckets": ["9" * 30]}
ROUTES = ["detections", "stats", "timeline", "sessions"]


@pytest.mark.parametrize("route", ROUTES)
async def test_odd_admin_query_values_get_400(upstream, proxy_factory, database_url, route):
    running = await proxy_factory(upstream.url, database_url=database_url)
    async with aiohttp.ClientSession() as http:
        for name, values in ODD.items():
            for value in values:
                async with http.get(f"{running.root}/loopwarden/api/{route}", params={name: value}) as response:
                    body = await response.json()
                    if name in ("since",) or (route, name) in (("detections", "cursor"), ("detections", "limit"),
                                                               ("sessions", "limit"), ("timeline", "buckets")):
                        assert response.status == 400, (name, value, body)
                        assert body["error"]["type"] == "invalid_request_error" and name in body["error"]["message"]
                    else:  # a parameter the route does not take
                        assert response.status == 200, (name, value, body)
        # A NUL in a session filter or a session's path finds nothing (PostgreSQL refuses one in a query).
        async with http.get(f"{running.root}/loopwarden/api/detections", params={"session": "a\x00b"}) as response:
            assert response.status == 200 and (await response.json())["data"] == []
        async with http.get(f"{running.root}/loopwarden/api/sessions/a%00b") as response:
            assert response.status == 404


def one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.parametrize("value", ["nan", "inf", "1e9", "-1"])
def test_retention_out_of_range_is_exit_2_naming_the_flag(capsys, value):
    assert main(["serve", "--detection-retention-days", value]) == 2
    assert one_line(capsys).startswith("loopwarden: --detection-retention-days: must be a number above 0")


@pytest.mark.parametrize("url,named", [("sqlite:///x.db", "'sqlite:///x.db' names no async driver"),
                                       ("postgresql://u:pw-secret-9@h/db", "'postgresql://u:***@h/db' names no async driver"),
                                       ("mysql://h/db", "'mysql://h/db' is not a database URL")])
def test_a_database_url_that_cannot_work_is_exit_2_naming_the_forms_that_do(capsys, monkeypatch, url, named):
    assert main(["stats", "--database-url", url]) == 2
    line = one_line(capsys)
    assert line.startswith(f"loopwarden: --database-url: {named}")
    assert "sqlite+aiosqlite:///" in line and "postgresql+asyncpg://" in line and "pw-secret-9" not in line
    monkeypatch.setenv("LOOPWARDEN_DATABASE_URL", url)
    assert main(["serve"]) == 2
    assert one_line(capsys).startswith(f"loopwarden: LOOPWARDEN_DATABASE_URL: {named}")


def test_an_odd_since_on_the_command_line_is_exit_2(capsys, tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/log.db"
    run_migrations(url)
    for value in ("0001-01-01T00:00", "99999999w", "yesterday"):
        assert main(["detections", "--database-url", url, "--since", value]) == 2
        assert one_line(capsys).startswith("loopwarden: --since: ")


def test_a_cli_command_that_finds_no_database_says_which_and_how_to_name_another(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOPWARDEN_DATABASE_URL", raising=False)
    assert main(["stats"]) == 1
    line = one_line(capsys)
    assert f"no database at {tmp_path / 'loopwarden.db'}" in line and "--database-url" in line
    assert "LOOPWARDEN_DATABASE_URL" in line


def test_every_serve_flag_has_a_help_line_with_its_default(capsys):
    with pytest.raises(SystemExit) as leaving:
        main(["serve", "--help"])
    assert leaving.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name in FIELDS:
        flag = flag_name(name)
        at = text.index(f"{flag} {name.upper()} ")
        entry = text[at:at + 400]
        assert "(default: " in entry and f"env LOOPWARDEN_{name.upper()})" in entry, entry


async def test_a_closed_pipe_ends_the_output_quietly(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/log.db"
    await asyncio.to_thread(run_migrations, url)
    writer = LogWriter(url)
    writer.start()
    for n in range(1000):
        writer.add_detection(detection(n))
    await writer.close()
    command = f"{sys.executable} -m proxy detections --limit 1000 --format json --database-url {url} | head -1"
    done = await asyncio.to_thread(subprocess.run, ["sh", "-c", command], cwd=ROOT, capture_output=True,
                                   timeout=60)
    assert done.stdout == b"[\n" and done.stderr == b"", done.stderr.decode()[-2000:]


async def test_the_start_line_says_where_the_database_is(upstream, tmp_path):
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream",
                                upstream.url, "--database-url", "sqlite+aiosqlite:///relative.db"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(process.communicate, timeout=30)
    (line,) = [line for line in stderr.decode().splitlines() if "listening on" in line]
    assert f"database: SQLite {Path(tmp_path, 'relative.db')}" in line and upstream.url in line


def test_the_cli_module_run_directly_is_the_command_line_not_a_silent_exit():
    done = subprocess.run([sys.executable, "-m", "proxy.cli", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "serve" in done.stdout
