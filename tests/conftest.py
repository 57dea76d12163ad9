"""Shared fixtures: a fake upstream and a real loopwarden server on free ports."""

from __future__ import annotations

from typing import AsyncIterator

import asyncio
import os
import uuid

import pytest
from aiohttp import web
from hypothesis import settings as hypothesis_settings

from proxy.config import build
from proxy.loops import loop_name
from proxy.server.app import create_app
from proxy.store.database import run_migrations
from tests.fake_upstream import FakeUpstream


# Properties are about results, not speed: a busy machine must not fail them on time.
hypothesis_settings.register_profile("loopwarden", deadline=None)
hypothesis_settings.load_profile("loopwarden")


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = await FakeUpstream().start()
    yield fake
    await fake.close()


class RunningProxy:
    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self.runner = runner
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# The suite's scenarios count repeats on the ladder before 2026-11 (warned after the 5th and 6th identical calls,
# stopped at the 7th), given explicitly as a configuration in use would give it; the default ladder (3) has its
# own tests, which say so.
LADDER_OF_FIVE = {"tool_call_threshold": 5}


def with_ladder_of_five(overrides: dict) -> dict:
    """Settings with the ladder of five, unless the test names a preset or a threshold of its own."""
    if "preset" in overrides or "tool_call_threshold" in overrides:
        return overrides
    return {**LADDER_OF_FIVE, **overrides}


async def start_proxy(**overrides) -> RunningProxy:
    """A real loopwarden server on a free port, its database migrated as `serve` does."""
    settings = build(with_ladder_of_five(overrides), environ={})
    await asyncio.to_thread(run_migrations, settings.database_url)
    app = create_app(settings)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return RunningProxy(runner, site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


@pytest.fixture(scope="session")
def event_loop_policy():
    """The suite runs on the loop the proxy runs on: uvloop where it is installed, the standard loop with
    LOOPWARDEN_EVENT_LOOP=asyncio (CI runs it both ways)."""
    if loop_name(os.environ.get("LOOPWARDEN_EVENT_LOOP", "auto")) == "uvloop":
        import uvloop

        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


@pytest.fixture
async def proxy_factory(tmp_path):
    """Start proxies in front of a given upstream; all are shut down after the test."""
    started: list[RunningProxy] = []

    async def factory(upstream_url: str, **overrides) -> RunningProxy:
        overrides.setdefault("database_url", f"sqlite+aiosqlite:///{tmp_path}/loopwarden-{len(started)}.db")
        running = await start_proxy(upstream_url=upstream_url, **overrides)
        started.append(running)
        return running

    yield factory
    for running in started:
        await running.runner.cleanup()


@pytest.fixture
async def proxy(upstream, proxy_factory) -> RunningProxy:
    return await proxy_factory(upstream.url)


POSTGRES_URL = os.environ.get("LOOPWARDEN_TEST_POSTGRES_URL")
REQUIRE_POSTGRES = os.environ.get("LOOPWARDEN_REQUIRE_POSTGRES") == "1"


async def _postgres_database() -> tuple[str, str]:
    """A new, empty database on the configured server: (its URL, its name)."""
    import asyncpg
    from sqlalchemy.engine import make_url

    if not POSTGRES_URL:
        if REQUIRE_POSTGRES:
            pytest.fail("LOOPWARDEN_REQUIRE_POSTGRES is set but LOOPWARDEN_TEST_POSTGRES_URL is not")
        pytest.skip("no PostgreSQL configured: set LOOPWARDEN_TEST_POSTGRES_URL to run the PostgreSQL tests")
    url = make_url(POSTGRES_URL)
    try:
        admin = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                      password=url.password, database=url.database, timeout=5)
    except (OSError, asyncpg.PostgresError, asyncio.TimeoutError) as exc:
        message = f"PostgreSQL at {url.host}:{url.port} cannot be reached: {exc}"
        if REQUIRE_POSTGRES:
            pytest.fail(message)
        pytest.skip(message)
    name = f"lw_test_{uuid.uuid4().hex[:12]}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return url.set(database=name).render_as_string(hide_password=False), name


async def _drop_postgres_database(name: str) -> None:
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(POSTGRES_URL)
    admin = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username, password=url.password,
                                  database=url.database, timeout=5)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards."""
    url, name = await _postgres_database()
    yield url
    await _drop_postgres_database(name)


@pytest.fixture(params=["sqlite", "postgresql"])
async def database_url(request, tmp_path) -> AsyncIterator[str]:
    """An empty database, not yet migrated: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path}/log.db"
        return
    url, name = await _postgres_database()
    yield url
    await _drop_postgres_database(name)
