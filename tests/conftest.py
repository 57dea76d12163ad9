"""Shared fixtures: a fake upstream and a real loopwarden server on free ports."""

from __future__ import annotations

from typing import AsyncIterator

import asyncio

import pytest
from aiohttp import web

from proxy.config import build
from proxy.server.app import create_app
from proxy.store.database import run_migrations
from tests.fake_upstream import FakeUpstream


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


async def start_proxy(**overrides) -> RunningProxy:
    """A real loopwarden server on a free port, its database migrated as `serve` does."""
    settings = build(overrides, environ={})
    await asyncio.to_thread(run_migrations, settings.database_url)
    app = create_app(settings)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return RunningProxy(runner, site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


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
