"""Every request answered by the application, in a dialect's error shape: what aiohttp's router leaves out.

Two things in aiohttp are relied on here, and `tests/test_routing.py` pins both: a resource's `_match` is
asked with the request's path and answers a dict of its parts (or None); and the router's `resolve` is looked up
on the router object for each request, so one set on the instance is the one called.
"""

from __future__ import annotations

from aiohttp import web

UNROUTED = "/{tail}"


class Unrouted(web.DynamicResource):
    """`/{tail}`: every request no route takes, whatever its target, so that it too is answered by the
    application (in a dialect's error shape) and not by aiohttp's text: `OPTIONS *` and `CONNECT host:443` have no
    leading slash, which a route's pattern needs."""

    def __init__(self) -> None:
        super().__init__(UNROUTED)

    def _match(self, path: str) -> dict[str, str]:
        return {"tail": path}


async def unrouted(request: web.Request) -> web.StreamResponse:
    """A path no route serves: 404; or 405 when one serves the path with other methods."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if not isinstance(resource, Unrouted):
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, allowed)
    raise web.HTTPNotFound()


def route_the_rest(router: web.UrlDispatcher, handler, expect_handler=None) -> Unrouted:
    """The last resource: `handler` answers whatever no route above takes. aiohttp's router shows a request
    whose target has no path (`CONNECT host:443`) to no resource at all, and answers it 404 in text: such a
    request goes to the fallback too. Every other request is routed as aiohttp routes it, for one check."""
    fallback = Unrouted()
    fallback.add_route("*", handler, expect_handler=expect_handler)
    router.register_resource(fallback)
    resolve = router.resolve

    async def to_fallback(request: web.Request):
        return (await fallback.resolve(request))[0]

    def routed(request: web.Request):
        return resolve(request) if request.rel_url.path_safe else to_fallback(request)

    router.resolve = routed
    return fallback
