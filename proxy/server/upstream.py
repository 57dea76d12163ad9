"""Talking to the upstream: one shared connection pool, header hygiene, failures as the client's errors."""

from __future__ import annotations

import base64
import logging
import re
from urllib.parse import unquote
from typing import Callable, Mapping

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.config import Settings, shown_url
from proxy.server.http1 import (
    ConnectFailed, ForwardProxyFailed, Proxies, UpstreamClient, UpstreamError, UpstreamResponse)
from proxy.wire.dialect import Dialect
from proxy.wire.errors import error_body

log = logging.getLogger("loopwarden.upstream")

# Connection-level headers are for one hop only (RFC 9110 §7.6.1).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
     "trailer", "trailers", "transfer-encoding", "upgrade"}
)
# Lowercase names, as bytes: the request's headers are filtered as the client sent them, never decoded. (The
# proxy answers `Expect` itself.)
_NOT_FORWARDED_UP = frozenset(name.encode() for name in HOP_BY_HOP | {"host", "content-length", "expect"})
# A watched request's body goes up as read here, decoded; the tap reads the answer's bytes as they come (a
# compressed stream would need a second decode), so the identity encoding is asked for.
_NOT_FORWARDED_INSPECTED = _NOT_FORWARDED_UP | {b"content-encoding", b"accept-encoding"}
_IDENTITY = (b"Accept-Encoding", b"identity")
_NOT_FORWARDED_DOWN = HOP_BY_HOP | {"content-length", "server", "date"}


class UpstreamFailure(Exception):
    """The upstream could not be reached or did not answer in time."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self, shape=error_body) -> web.Response:
        """The failure as the client is answered, in its route's error shape (`shape`: a dialect's `error_body`)."""
        return json_error(self.status, self.message, "upstream_error", self.code, shape=shape)


def json_error(status: int, message: str, type_: str, code: str | None = None,
               headers: Mapping[str, str] | None = None, shape=error_body) -> web.Response:
    """An error the proxy gives, in the OpenAI shape or the one `shape` builds (a dialect's `error_body`)."""
    return web.Response(status=status, body=shape(message, type_, code), content_type="application/json",
                        headers=headers)


def upstream_headers(request: web.Request, settings: Settings, dialect: Dialect, *,
                     inspected: bool) -> list[tuple[bytes, bytes]]:
    """The client's headers as they go up: for this hop's own, and loopwarden's, left out; the upstream key
    in the dialect's header when one is configured."""
    dropped = _NOT_FORWARDED_INSPECTED if inspected else _NOT_FORWARDED_UP
    connection = request.headers.getall("Connection", ())
    if connection:  # the headers it names are for this hop only too (RFC 9110 §7.6.1)
        dropped = dropped | {token.strip().lower().encode("utf-8", "surrogateescape")
                             for value in connection for token in value.split(",")}
    credentials = dialect.credentials(settings)
    if credentials is not None:
        dropped = dropped | credentials[0]
    headers = [(name, value) for name, value in request.raw_headers
               if (lower := name.lower()) not in dropped and not lower.startswith(b"x-loopwarden-")]
    if credentials is not None:
        headers.append(credentials[1:])
    if inspected:
        headers.append(_IDENTITY)
    return headers


def client_headers(upstream: UpstreamResponse) -> CIMultiDict[str]:
    return CIMultiDict([(name, value) for name, value in upstream.raw_headers
                        if name.lower() not in _NOT_FORWARDED_DOWN])


def climbs(raw_path: str) -> bool:
    """Whether a path has a dot segment, plain or percent-encoded (`%2e%2e`, or behind an encoded slash): joined
    to the upstream's base path, it would reach outside it."""
    return any(part in (".", "..") for segment in raw_path.split("/")
               for part in re.split(r"[/\\]", unquote(segment)))


def make_upstream_client(settings: Settings) -> UpstreamClient:
    return UpstreamClient(settings.upstream_connect_timeout, settings.upstream_read_timeout,
                          proxies=Proxies.from_environment())


async def send_upstream(client: UpstreamClient, method: str, url: URL, headers: list[tuple[bytes, bytes]],
                        data, length: int | None = None,
                        sent: Callable[[], None] | None = None) -> UpstreamResponse:
    """Send the request (`length`: that of a body given as chunks, when known; `sent`: called once it is out,
    before the answer is awaited) and return the answer's head, to be released when done with; failures before
    a response are raised as UpstreamFailure. Credentials in the URL (`https://user:pass@host/v1`) travel as
    its Authorization header, in place of the client's."""
    if url.user is not None:
        pair = f"{url.user or ''}:{url.password or ''}".encode()
        headers = [(name, value) for name, value in headers if name.lower() != b"authorization"]
        headers.append((b"Authorization", b"Basic " + base64.b64encode(pair)))
        url = url.with_user(None)
    try:
        return await client.request(method, url, headers, data, length, sent)
    except TimeoutError as exc:
        failure = UpstreamFailure(504, "upstream_timeout", f"upstream did not answer in time ({shown_url(str(url))})")
        cause: BaseException = exc
    except ForwardProxyFailed as exc:  # the operator's proxy: its address, credentials and words stay in the log
        failure = UpstreamFailure(502, "upstream_unreachable",
                                  f"upstream {shown_url(str(url.origin()))} unreachable: the way out to it failed "
                                  f"(the proxy's log says why)")
        log.warning("%s %s: %s", method, shown_url(str(url.with_query(None))), exc.os_error)
        raise failure from exc
    except ConnectFailed as exc:
        failure = UpstreamFailure(502, "upstream_unreachable",
                                  f"upstream {shown_url(str(url.origin()))} unreachable: {exc.os_error}")
        cause = exc
    except (UpstreamError, OSError) as exc:
        failure = UpstreamFailure(502, "upstream_unreachable",
                                  f"upstream {shown_url(str(url.origin()))} connection failed: {exc}")
        cause = exc
    log.warning("%s %s: %s", method, shown_url(str(url.with_query(None))), failure.message)
    raise failure from cause


def is_read_failure(exc: BaseException) -> bool:
    """A failure while reading an upstream body that has already started."""
    return isinstance(exc, (UpstreamError, TimeoutError))
