"""Talking to the upstream: one shared connection pool, header hygiene, failures as OpenAI errors."""

from __future__ import annotations

import base64
import logging
import re
from contextlib import asynccontextmanager
from urllib.parse import unquote
from typing import AsyncIterator, Mapping

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.config import Settings, shown_url
from proxy.server.http1 import ConnectFailed, UpstreamClient, UpstreamError, UpstreamResponse
from proxy.wire.dialect import Dialect
from proxy.wire.errors import error_body

log = logging.getLogger("loopwarden.upstream")

# Connection-level headers are for one hop only (RFC 9110 §7.6.1).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
     "trailer", "trailers", "transfer-encoding", "upgrade"}
)
_NOT_FORWARDED_UP = HOP_BY_HOP | {"host", "content-length", "expect"}  # the proxy answers `Expect` itself
_NOT_FORWARDED_DOWN = HOP_BY_HOP | {"content-length", "server", "date"}


class UpstreamFailure(Exception):
    """The upstream could not be reached or did not answer in time."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self) -> web.Response:
        return json_error(self.status, self.message, "upstream_error", self.code)


def json_error(status: int, message: str, type_: str, code: str | None = None,
               headers: Mapping[str, str] | None = None, shape=error_body) -> web.Response:
    """An error the proxy gives, in the OpenAI shape or the one `shape` builds (a dialect's `error_body`)."""
    return web.Response(status=status, body=shape(message, type_, code), content_type="application/json",
                        headers=headers)


def upstream_headers(request: web.Request, settings: Settings, dialect: Dialect, *,
                     identity: bool) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    # Headers the client names in `Connection` are for this hop only too (RFC 9110 §7.6.1).
    named = {token.strip().lower() for value in request.headers.getall("Connection", ()) for token in value.split(",")}
    for name, value in request.headers.items():
        lower = name.lower()
        if lower in _NOT_FORWARDED_UP or lower in named or lower.startswith("x-loopwarden-"):
            continue
        headers.add(name, value)
    dialect.authorize(headers, settings)
    if identity:
        # The tap reads the bytes as they are; compressed SSE would need a second decode.
        headers["Accept-Encoding"] = "identity"
    return headers


def client_headers(upstream: UpstreamResponse) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.headers.items():
        if name.lower() not in _NOT_FORWARDED_DOWN:
            headers.add(name, value)
    return headers


def climbs(raw_path: str) -> bool:
    """Whether a path has a dot segment, plain or percent-encoded (`%2e%2e`, or behind an encoded slash): joined
    to the upstream's base path, it would reach outside it."""
    return any(part in (".", "..") for segment in raw_path.split("/")
               for part in re.split(r"[/\\]", unquote(segment)))


def make_upstream_client(settings: Settings) -> UpstreamClient:
    return UpstreamClient(settings.upstream_connect_timeout, settings.upstream_read_timeout)


@asynccontextmanager
async def open_upstream(client: UpstreamClient, method: str, url: URL, headers: CIMultiDict[str],
                        data) -> AsyncIterator[UpstreamResponse]:
    """Send the request; failures before a response are raised as UpstreamFailure. Credentials in the URL
    (`https://user:pass@host/v1`) travel as its Authorization header, in place of the client's."""
    if url.user is not None:
        headers = CIMultiDict(headers)
        pair = f"{url.user or ''}:{url.password or ''}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        url = url.with_user(None)
    try:
        response = await client.request(method, url, headers, data)
    except TimeoutError as exc:
        raise UpstreamFailure(504, "upstream_timeout", f"upstream did not answer in time ({shown_url(str(url))})") from exc
    except ConnectFailed as exc:
        raise UpstreamFailure(502, "upstream_unreachable", f"upstream unreachable: {exc.os_error}") from exc
    except (UpstreamError, OSError) as exc:
        raise UpstreamFailure(502, "upstream_unreachable", f"upstream connection failed: {exc}") from exc
    try:
        yield response
    finally:
        response.release()


def is_read_failure(exc: BaseException) -> bool:
    """A failure while reading an upstream body that has already started."""
    return isinstance(exc, (UpstreamError, TimeoutError))
