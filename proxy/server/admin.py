"""The /loopwarden/ page and the /loopwarden/api routes: the log, sessions, and an operator's controls.

Who may call: the ADMIN_TOKEN holder sees every tenant; a client's own API key
sees only its own sessions; with no ADMIN_TOKEN set, only loopback clients are
answered (without a key they see everything, with one only their own). A bearer
token that is neither the admin token nor a key that has sessions is refused
(401): a mistyped token must not read as an empty log.
"""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path

import orjson
from aiohttp import web

from proxy.inspection import client_key, tenant_of
from proxy.server.guard import Guard
from proxy.server.upstream import json_error
from proxy.store import queries
from proxy.store.queries import QueryError

ALL_TENANTS = None
STATIC = Path(__file__).parent / "static"
# The page runs only its own script and style, talks only to its own origin, and is never framed.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
}
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


class _Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


def is_loopback(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address(request.remote or "").is_loopback
    except ValueError:
        return False


def caller_tenant(request: web.Request, admin_token: str | None) -> str | None:
    """The tenant the caller may see, or ALL_TENANTS."""
    key = client_key(request.headers)
    if admin_token:
        if key and secrets.compare_digest(key.encode(), admin_token.encode()):
            return ALL_TENANTS
        if not key:
            raise _Denied(401, "an Authorization: Bearer token is required")
        return tenant_of(key)
    if not is_loopback(request):
        raise _Denied(403, "the admin API answers only loopback clients when no ADMIN_TOKEN is set")
    return tenant_of(key) if key else ALL_TENANTS


def _int(request: web.Request, name: str, default: int) -> int:
    value = request.query.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise QueryError(f"{name} must be a whole number, got {value!r}") from None


def _flag(request: web.Request, name: str) -> bool | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise QueryError(f"{name} must be true or false, got {value!r}")


def _filter(request: web.Request, tenant: str | None) -> queries.DetectionFilter:
    return queries.DetectionFilter(tenant=tenant, session=request.query.get("session") or None,
                                   type=request.query.get("type") or None,
                                   action=request.query.get("action") or None,
                                   since=queries.parse_since(request.query.get("since")),
                                   enforced=_flag(request, "enforced"), mark=request.query.get("mark") or None,
                                   episode_key=request.query.get("episode_key") or None)


class AdminAPI:
    """The detection log's API (each handler given the caller's tenant, None for the admin) and the page."""

    def __init__(self, guard: Guard, admin_token: str | None) -> None:
        self.guard = guard
        self.store = guard.store
        self.admin_token = admin_token
        self.files = {path.name: (path.read_bytes(), _TYPES[path.suffix]) for path in STATIC.iterdir()
                      if path.suffix in _TYPES}

    def routes(self) -> list[web.RouteDef]:
        api = self.authorized
        return [
            web.get("/loopwarden", self.to_page),
            web.get("/loopwarden/", self.page),
            web.get("/loopwarden/static/{name}", self.page),
            web.get("/loopwarden/api/timeline", api(self.timeline)),
            web.get("/loopwarden/api/detections", api(self.detections)),
            web.post("/loopwarden/api/detections/{id}/mark", api(self.mark)),
            web.get("/loopwarden/api/stats", api(self.stats)),
            web.get("/loopwarden/api/sessions", api(self.sessions)),
            web.get("/loopwarden/api/sessions/{id}", api(self.session)),
            web.post("/loopwarden/api/sessions/{id}/reset", api(self.control(reset=True))),
            web.post("/loopwarden/api/sessions/{id}/disable", api(self.control(disabled=True))),
            web.post("/loopwarden/api/sessions/{id}/enable", api(self.control(disabled=False))),
        ]

    def authorized(self, fn):
        """An API handler, called with the caller's tenant; refusals and bad queries in the OpenAI error shape."""
        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                tenant = caller_tenant(request, self.admin_token)
                if tenant is not ALL_TENANTS and not await self.store.tenant_known(tenant):
                    raise _Denied(401, "this token is neither the admin token nor a key that has sessions")
                return await fn(request, tenant)
            except _Denied as denied:
                return json_error(denied.status, denied.message, "authentication_error" if denied.status == 401
                                  else "permission_error", "unauthorized" if denied.status == 401 else "forbidden")
            except QueryError as exc:
                return json_error(400, str(exc), "invalid_request_error", "invalid_value")
        return wrapped

    async def detections(self, request: web.Request, tenant: str | None) -> web.Response:
        items, cursor = await queries.list_detections(self.store.engine, _filter(request, tenant),
                                                      _int(request, "limit", 50), request.query.get("cursor"))
        return web.json_response({"data": items, "next_cursor": cursor})

    async def mark(self, request: web.Request, tenant: str | None) -> web.Response:
        """A person's word on a detection; a stop said not to be a loop resumes its task, as its link does."""
        try:
            body = await request.json(loads=orjson.loads)
        except (ValueError, UnicodeDecodeError):
            raise QueryError("the body must be JSON: {\"verdict\": \"loop\" | \"not_a_loop\", \"note\": \"...\"}")
        if not isinstance(body, dict) or not isinstance(body.get("note", ""), (str, type(None))):
            raise QueryError("the body must be an object with a verdict and, if any, a note that is text")
        identifier = request.match_info["id"]
        if not identifier.isdigit() or len(identifier) > 19 or int(identifier) > queries.MAX_ID:
            return json_error(404, "no such detection", "invalid_request_error", "not_found")
        marked = await queries.mark_detection(self.store.engine, int(identifier), str(body.get("verdict")),
                                              body.get("note"), tenant)
        if marked is None:
            return json_error(404, "no such detection", "invalid_request_error", "not_found")
        if queries.resumes(marked):
            await self.store.set_controls(marked["session_id"], marked["tenant"], reset=True,
                                          known_counts=self.guard.known_message_counts())
        return web.json_response({"data": marked})

    # Figures from counts being rebuilt are not shown as if whole. Whether they are whole is asked before they are
    # read: asked after, a rebuild ending between the two would pass the figures read before it as whole.
    async def timeline(self, request: web.Request, tenant: str | None) -> web.Response:
        complete = await self.store.counts_complete()
        found = await queries.timeline(self.store.engine, _filter(request, tenant), _int(request, "buckets", 48))
        return web.json_response({**found, "complete": complete})

    async def stats(self, request: web.Request, tenant: str | None) -> web.Response:
        complete = await self.store.counts_complete()
        found = await queries.stats(self.store.engine, queries.parse_since(request.query.get("since")), tenant)
        return web.json_response({**found, "complete": complete})

    async def sessions(self, request: web.Request, tenant: str | None) -> web.Response:
        items = await queries.list_sessions(self.store.engine, queries.parse_since(request.query.get("since")),
                                            tenant, _int(request, "limit", 50))
        return web.json_response({"data": items})

    async def session(self, request: web.Request, tenant: str | None) -> web.Response:
        found = await queries.session_timeline(self.store.engine, request.match_info["id"], tenant)
        if not found:
            return json_error(404, "no such session", "invalid_request_error", "not_found")
        return web.json_response({"data": found})

    def control(self, **change):
        """A handler applying an operator's change to a session (reset, disable, enable)."""
        async def apply(request: web.Request, tenant: str | None) -> web.Response:
            extra = {}
            if change.get("reset"):
                extra["known_counts"] = self.guard.known_message_counts()
            changed = await self.store.set_controls(request.match_info["id"], tenant, **change, **extra)
            if not changed:
                return json_error(404, "no such session", "invalid_request_error", "not_found")
            return web.json_response({"data": changed})
        return apply

    async def page(self, request: web.Request) -> web.StreamResponse:
        """The page itself holds no data: every figure on it comes from the API, under the API's rules."""
        found = self.files.get(request.match_info.get("name") or "index.html")
        if found is None:
            return json_error(404, "no such file", "invalid_request_error", "not_found")
        body, content_type = found
        return web.Response(body=body, headers={**PAGE_HEADERS, "Content-Type": f"{content_type}; charset=utf-8"})

    @staticmethod
    async def to_page(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/loopwarden/")


def routes(guard: Guard, admin_token: str | None) -> list[web.RouteDef]:
    return AdminAPI(guard, admin_token).routes()
