"""The fallback route (`proxy/server/routing.py`): every request the application does not route is still
answered by it, and the two things it relies on in aiohttp hold."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from proxy.server.routing import Unrouted, route_the_rest, unrouted


async def answered(request: web.Request) -> web.StreamResponse:
    try:
        return await unrouted(request)
    except web.HTTPException as exc:  # the shape is the application's: here, JSON naming the status
        return web.json_response({"status": exc.status, "allow": exc.headers.get("Allow", "")}, status=exc.status)


async def models(request: web.Request) -> web.Response:
    return web.json_response({"data": []})


@pytest.fixture
async def server():
    app = web.Application()
    app.router.add_get("/v1/models", models)
    route_the_rest(app.router, answered)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    await runner.cleanup()


async def raw(server, target: str) -> tuple[bytes, bytes]:
    host, port = server.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"{target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        return head, await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_path_no_route_takes_is_answered_by_the_application(server):
    async with aiohttp.ClientSession(server) as client:
        async with client.get("/v1/nope") as response:
            assert (response.status, await response.json()) == (404, {"status": 404, "allow": ""})
        async with client.post("/v1/models") as response:  # the path is served, with other methods
            assert response.status == 405 and (await response.json())["allow"].startswith("GET")
        async with client.get("/v1/models") as response:  # a route still takes its own
            assert (response.status, await response.json()) == (200, {"data": []})


@pytest.mark.parametrize("target", ["OPTIONS *", "CONNECT example.com:443"])
async def test_a_target_with_no_path_reaches_the_application_too(server, target):
    """aiohttp shows such a request to no resource: the router's `resolve`, replaced on the router object,
    is the one aiohttp calls, and it sends these to the fallback."""
    head, body = await raw(server, target)
    assert head.startswith(b"HTTP/1.1 404 ") and b"application/json" in head, head
    assert body == b'{"status": 404, "allow": ""}'


def test_a_dynamic_resource_is_matched_through_its_match_method():
    """What `Unrouted` overrides: aiohttp asks a resource's `_match` with the path and reads a dict back."""
    assert web.DynamicResource("/{tail}")._match("/a") == {"tail": "a"}
    assert Unrouted()._match("*") == {"tail": "*"}
