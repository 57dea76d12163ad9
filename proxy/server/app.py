"""The aiohttp application: routes, forwarding, the stream tap. Thin: it moves bytes."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import zlib
from typing import AsyncIterator, Callable

import aiohttp
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from proxy.config import Settings
from proxy.server import admin, resume
from proxy.server import guard as guard_module
from proxy.server.http1 import UpstreamClient, UpstreamResponse
from proxy.server.metrics import Metrics
from proxy.server.routing import route_the_rest, unrouted as no_route
from proxy.server.addons import Addons, Exchange, JudgeAddon, TimingAddon, TracingAddon
from proxy.server.telemetry import Telemetry
from proxy.inspection import Forward, Incoming, Stop, Tap, body_slot
from proxy.server.upstream import (
    UpstreamFailure,
    climbs,
    client_headers,
    is_read_failure,
    json_error,
    make_upstream_client,
    send_upstream,
    upstream_headers,
)
from proxy.store.store import Store
from proxy.wire import SERVED, OffByV1, off_by_v1, relay_dialect, watched_alias
from proxy.wire.dialect import Dialect, RequestError, Summary
from proxy.wire.errors import error_body
from proxy.wire.known import Parsed
from proxy.wire.sse import MAX_EVENT_BYTES, WholeEvents

log = logging.getLogger("loopwarden.server")

SETTINGS = web.AppKey("settings", Settings)
CLIENT = web.AppKey("client", UpstreamClient)
GUARD = web.AppKey("guard", guard_module.Guard)
METRICS = web.AppKey("metrics", Metrics)
TELEMETRY = web.AppKey("telemetry", Telemetry)
ADDONS = web.AppKey("addons", Addons)
BASE_URL_OFF = web.AppKey("base_url_off", dict)  # each kind of base URL mistake: when it was last logged

# The most of a non-streamed answer that is read; a larger one is relayed as it comes, uninspected.
INSPECTED_ANSWER_BYTES = MAX_EVENT_BYTES
# A client connection idle this long is closed: between requests, before its request's head is complete
# (headers trickled a byte at a time), and while its body has stopped arriving (answered 408).
CLIENT_IDLE_TIMEOUT = 75.0
# The codes of the errors raised as HTTP exceptions (a 400 is raised only for a body that cannot be read).
_ERROR_CODES = {400: "invalid_body", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
                415: "unsupported_encoding"}


def claimed(request: web.Request) -> Dialect:
    """The dialect a request on a path of no dialect's own speaks: the one its headers claim, else OpenAI's."""
    return relay_dialect(request.headers, request.rel_url.query)


def served(metrics: Metrics, route: str, handler, speaks: Callable[[web.Request], Dialect] | None = None):
    """A route's handler, its every answer counted by route and status, and every error the proxy itself gives
    in the error shape of the dialect the route speaks (`speaks`; None: OpenAI's), never HTML or a traceback.
    (A wrapper made once per route rather than a middleware: aiohttp runs middlewares through two coroutines
    more on every request.)"""

    def shape(request: web.Request):
        return speaks(request).error_body if speaks is not None else error_body

    async def serve(request: web.Request) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPRequestEntityTooLarge:
            limit = request.app[SETTINGS].max_body_bytes
            response = json_error(413, f"request body is larger than the limit of {limit} bytes",
                                  "invalid_request_error", "request_too_large", shape=shape(request))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            allow = exc.headers.get("Allow")
            response = json_error(exc.status, exc.reason or "error", "invalid_request_error",
                                  _ERROR_CODES.get(exc.status), headers={"Allow": allow} if allow else None,
                                  shape=shape(request))
        except UpstreamFailure as exc:
            response = exc.response(shape(request))
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = json_error(500, "internal proxy error", "internal_error", "internal_error",
                                  shape=shape(request))
        metrics.served(route, response.status)
        return response

    return serve


def _route_label(path: str) -> str:
    """A route as metrics name it: its path as aiohttp spells it canonically (`/v1/{tail}`)."""
    return re.sub(r"\{(\w+)(:[^{}]*)?\}", r"{\1}", path)


def _check_length(request: web.Request, limit: int) -> None:
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)


def inspected(dialect: Dialect):
    """The handler of a path whose conversations are watched, in the dialect it speaks."""

    async def handler(request: web.Request) -> web.StreamResponse:
        addons = request.app[ADDONS]
        exchange = Exchange(request.headers, dialect, request.rel_url.raw_path)
        for hook in addons.started:
            hook(exchange)
        try:
            return await _inspected(request, exchange, addons)
        except BaseException as exc:
            for hook in addons.error:
                hook(exchange, exc)
            raise
        finally:
            for hook in addons.done:
                hook(exchange)

    return handler


def _answered(exchange: Exchange, addons: Addons, status: int, summary: Summary | None = None) -> None:
    """What the client was answered, told to the add-ons that watch it."""
    exchange.status, exchange.summary = status, summary
    for hook in addons.response:
        hook(exchange)


async def _inspected(request: web.Request, exchange: Exchange, addons: Addons) -> web.StreamResponse:
    """One watched request, its exchange told to the add-ons at each point."""
    app, dialect = request.app, exchange.dialect
    parsed = await _parsed_body(request, dialect)
    if isinstance(parsed, web.Response):
        return parsed
    payload, guard = parsed.payload, app[GUARD]
    exchange.began, exchange.payload, exchange.raw = time.perf_counter(), payload, parsed.raw
    for hook in addons.request:
        hook(exchange)
    chain = guard.chain.load(request.headers, payload, dialect)
    if chain is not None:
        chain = await chain
    try:
        verdict = guard.inspector.inspect(Incoming(request.headers, parsed.raw, payload, dialect, chain,
                                                   request.rel_url.raw_path, request.rel_url.query,
                                                   f"{request.scheme}://{request.host}", parsed),
                                          addons.sink(exchange))
    except RequestError as exc:
        return _refused(dialect, str(exc), "invalid_value")
    exchange.answer_headers = verdict.headers
    if isinstance(verdict, Stop):
        _answered(exchange, addons, verdict.status)
        return web.Response(status=verdict.status, body=verdict.body, content_type="application/json",
                            headers=verdict.headers)
    settings = app[SETTINGS]
    upstream_dialect = relay_dialect(request.headers, request.rel_url.query, dialect)
    headers = upstream_headers(request, settings, upstream_dialect, inspected=True)
    url = upstream_dialect.upstream_url(settings, request.rel_url.raw_path, request.rel_url.raw_query_string)
    exchange.sent = time.perf_counter()
    exchange.judge = verdict.judge
    upstream = await send_upstream(app[CLIENT], "POST", url, headers, verdict.body, sent=verdict.prepare)
    try:
        tap = verdict.tap
        exchange.request_id = upstream.headers.get("x-request-id")
        if tap is not None:
            tap.delivered(upstream.status, exchange.request_id)
        for hook in addons.forwarded:
            hook(exchange)
        response_headers = client_headers(upstream)
        response_headers.update(verdict.headers)
        if upstream.status == 200 and upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
            # A stream compressed although identity was asked for is relayed untouched, unread.
            response = await _relay_stream(request, upstream, response_headers, dialect, guard,
                                           tap if _encoding(upstream.headers) == "identity" else None)
            if addons.response:
                _answered(exchange, addons, 200, tap.streamed_summary(dialect.tokens) if tap is not None else None)
            return response
        return await _whole_answer(request, exchange, addons, verdict, upstream, response_headers)
    finally:
        upstream.release()


async def _parsed_body(request: web.Request, dialect: Dialect) -> Parsed | web.Response:
    """The request's body parsed (from where it differs from its conversation's previous one), or the 4xx
    that refuses it."""
    settings, guard, metrics = request.app[SETTINGS], request.app[GUARD], request.app[METRICS]
    _check_length(request, settings.max_body_bytes)
    content_type = request.headers.get("Content-Type", "application/json")
    if "json" not in content_type.lower():
        return _refused(dialect, f"Content-Type must be application/json, got {content_type!r}",
                        "invalid_content_type")
    raw = await _whole_body(request, settings.max_body_bytes)
    if not raw or raw.isspace():
        return _refused(dialect, "request body is empty; expected a JSON object", "invalid_json")
    try:
        parsed = guard.bodies.parse(raw, dialect.items_key, lambda: body_slot(
            request.headers, request.rel_url.query, dialect.name, raw))
    except orjson.JSONDecodeError as exc:
        return _refused(dialect, f"request body is not valid JSON: {exc}", "invalid_json")
    if not isinstance(parsed.payload, dict):
        return _refused(dialect, "request body must be a JSON object", "invalid_json")
    known = parsed.known.ends[parsed.reused - 1] if parsed.reused else 0
    metrics.body_known.inc(known)
    metrics.body_parsed.inc(len(raw) - known)
    return parsed


async def _whole_answer(request: web.Request, exchange: Exchange, addons: Addons, verdict: Forward,
                        upstream: UpstreamResponse, response_headers: dict) -> web.StreamResponse:
    """A non-streamed answer: relayed once read (the tap given it), or, too large to inspect, as it comes."""
    tap, dialect = verdict.tap, exchange.dialect
    try:
        body = await _answer(upstream)
    except Exception as exc:
        if not is_read_failure(exc):
            raise
        raise _read_failure(exc) from exc
    if isinstance(body, list):  # too large to inspect: relayed as it comes, unread
        _uninspected(request, verdict, "")
        return await _relay_body(request, upstream, response_headers, body)
    if upstream.status != 200:
        _answered(exchange, addons, upstream.status)
        return _upstream_error(upstream.status, body, response_headers, dialect)
    readable = _decoded(body, _encoding(upstream.headers), INSPECTED_ANSWER_BYTES)
    if readable is not None and len(readable) > INSPECTED_ANSWER_BYTES:  # compressed, and too large unpacked
        _uninspected(request, verdict, " unpacked")
        readable = None
    if readable is not None:
        try:
            answer = orjson.loads(readable)
        except orjson.JSONDecodeError:
            return json_error(502, "upstream answered with a body that is not JSON", "upstream_error",
                              "upstream_invalid_response", shape=dialect.error_body)
        if tap is not None and tap.keeps_answer:  # a chained request may continue from it: written first
            if tap.complete(answer):
                await request.app[GUARD].before_last_byte()
        elif tap is not None:  # the answer goes out first; the engine reads it on the loop's next turn
            asyncio.get_running_loop().call_soon(tap.complete, answer)
        if addons.response:
            _answered(exchange, addons, 200, dialect.summary(answer) if isinstance(answer, dict) else None)
    return web.Response(status=200, body=body, headers=response_headers)


def _refused(dialect: Dialect, message: str, code: str) -> web.Response:
    """A request the proxy cannot read, refused in its dialect's own error shape."""
    return json_error(400, message, "invalid_request_error", code, shape=dialect.error_body)


def _uninspected(request: web.Request, verdict: Forward, unpacked: str) -> None:
    log.warning("an answer of more than %d bytes%s on %s was relayed uninspected (session %s)",
                INSPECTED_ANSWER_BYTES, unpacked, request.path, verdict.headers.get("X-Loopwarden-Session"))


async def _answer(upstream: UpstreamResponse) -> bytes | list[bytes]:
    """A non-streamed answer, whole; or, past INSPECTED_ANSWER_BYTES, the reads so far (the rest unread)."""
    if (upstream.content_length or 0) > INSPECTED_ANSWER_BYTES:
        return []
    reads: list[bytes] = []
    size = 0
    while chunk := await upstream.read_any():
        reads.append(chunk)
        size += len(chunk)
        if size > INSPECTED_ANSWER_BYTES:
            return reads
    return reads[0] if len(reads) == 1 else b"".join(reads)


async def _relay_body(request: web.Request, upstream: UpstreamResponse, headers,
                      reads: tuple[bytes, ...] | list[bytes] = ()) -> web.StreamResponse:
    """The upstream's answer relayed as it comes, unread (after `reads`, what was read of it already)."""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    await response.prepare(request)
    try:
        for chunk in reads:
            await _write(response, chunk)
        async for chunk in upstream.chunks_as_they_come():
            await _write(response, chunk)
    except _ClientGone:
        log.debug("client left mid-transfer on %s", request.path)
        upstream.close()
        return response
    except Exception as exc:
        if not is_read_failure(exc):
            raise
        # Bytes have gone out already: cutting the connection is the only honest signal left.
        log.warning("upstream body failed mid-transfer on %s: %s", request.path, exc)
        if request.transport is not None:
            request.transport.close()
        return response
    await _write_eof(request, response)
    return response


_ZLIB_ENCODINGS = ("gzip", "x-gzip", "deflate")


def _encoding(headers) -> str:
    return headers.get("Content-Encoding", "identity").strip().lower() or "identity"


def _decoded(body: bytes, encoding: str, limit: int | None = None) -> bytes | None:
    """A body as its reader means it: as it came when not compressed, else decoded from gzip or deflate (to
    `limit` bytes and one more, so that an oversize body shows); None for another encoding, or a body that
    is not whole, valid gzip or deflate."""
    if encoding == "identity":
        return body
    if encoding not in _ZLIB_ENCODINGS:
        return None
    decoder = zlib.decompressobj(47)  # 32 + 15: a gzip or zlib header, whichever it has
    try:
        decoded = decoder.decompress(body, 0 if limit is None else limit + 1)
    except zlib.error:
        return None
    if not decoder.eof and (limit is None or len(decoded) <= limit):
        return None  # cut short
    return decoded


def _read_failure(exc: BaseException) -> UpstreamFailure:
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamFailure(504, "upstream_timeout", "upstream stopped answering mid-response")
    return UpstreamFailure(502, "upstream_unreachable", f"upstream connection failed mid-response: {exc}")


def _upstream_error(status: int, body: bytes, headers, dialect: Dialect) -> web.Response:
    """Pass the upstream's error through; a body that is not JSON is wrapped in the dialect's error shape."""
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()[:500] or f"upstream answered HTTP {status}"
        headers.popall("Content-Type", None)
        headers.popall("Content-Encoding", None)
        return json_error(status, text, "upstream_error", "upstream_error", headers=headers, shape=dialect.error_body)
    return web.Response(status=status, body=body, headers=headers)


class _ClientGone(Exception):
    """The client closed its connection while its response was being written."""


async def _write(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
    except ConnectionResetError as exc:  # aiohttp's ClientConnectionResetError is one
        raise _ClientGone() from exc


async def _write_eof(request: web.Request, response: web.StreamResponse) -> None:
    try:
        await response.write_eof()
    except ConnectionResetError:
        log.debug("client left before the end of %s", request.path)


async def _relay_stream(request: web.Request, upstream: UpstreamResponse, headers, dialect: Dialect,
                        guard: guard_module.Guard, tap: Tap | None) -> web.StreamResponse:
    """Relay a stream as it comes, in whole events; the tap (None: unread) reads a copy and may end it."""
    response = web.StreamResponse(status=200, headers=headers)
    await response.prepare(request)
    open_streams = request.app[METRICS].open_streams
    open_streams.inc()
    relay: Tap | WholeEvents = tap if tap is not None else WholeEvents()
    try:
        async for chunk in upstream.chunks_as_they_come():
            passing = relay.pass_on(chunk)
            if passing.kept:  # a chained request may follow the moment the client has these bytes
                await guard.before_last_byte()
            if passing.data:
                await _write(response, passing.data)
            if passing.last:  # the guard cut the stream: stop reading at once so the provider stops generating
                upstream.close()
                break
        else:
            rest = relay.ended()  # a stream whose last event has no blank line ends as the upstream sent it
            if rest:
                await _write(response, rest)
    except _ClientGone:
        log.debug("client left mid-stream on %s", request.path)
        upstream.close()
        return response
    except Exception as exc:
        if not is_read_failure(exc):
            raise
        failure = _read_failure(exc)
        log.warning("upstream stream failed: %s", failure.message)
        try:
            await _write(response, relay.broken(dialect.stream_error(failure.message, "upstream_error", failure.code)))
        except _ClientGone:
            return response
    finally:
        open_streams.dec()
    await _write_eof(request, response)
    return response


def routed(dialect: Dialect):
    """The handler of a dialect's own route, which decides request by request: inspected, relayed or refused."""
    watched = inspected(dialect)

    async def handler(request: web.Request) -> web.StreamResponse:
        decided = dialect.route(request.method, request.match_info)
        if decided.refused is not None:
            return json_error(400, decided.refused, "invalid_request_error", "invalid_path", shape=dialect.error_body)
        if decided.inspect:
            return await watched(request)
        return await passthrough(request, decided.relay)

    return handler


async def passthrough(request: web.Request, dialect: Dialect | None = None) -> web.StreamResponse:
    """Any other /v1/ path: method, query, headers, body and status, streamed both ways; to the upstream of the
    dialect that claims the request (the Anthropic upstream when it carries `anthropic-version`)."""
    settings = request.app[SETTINGS]
    shape = (dialect or claimed(request)).error_body
    tail = request.rel_url.raw_path.split("/", 2)[-1]
    if climbs(tail):
        return json_error(400, "the path may not leave /v1/: '.' and '..' segments, plain or encoded, are refused",
                          "invalid_request_error", "invalid_path", shape=shape)
    off = off_by_v1(request.rel_url.raw_path)
    if off is not None:  # relayed as it is, the conversation would go by unwatched
        return _base_url_off(request, off)
    canonical = watched_alias(request.rel_url.raw_path)
    if canonical is not None:  # relayed as it is, the conversation would go by unwatched
        return json_error(400, f"use the path {canonical}: another spelling of a watched path is refused",
                          "invalid_request_error", "invalid_path", shape=shape)
    _check_length(request, settings.max_body_bytes)
    dialect = relay_dialect(request.headers, request.rel_url.query, dialect)
    headers = upstream_headers(request, settings, dialect, inspected=False)
    data = _body(request, settings.max_body_bytes) if request.body_exists else None
    url = dialect.upstream_url(settings, request.rel_url.raw_path, request.rel_url.raw_query_string)
    upstream = await send_upstream(request.app[CLIENT], request.method, url, headers, data, request.content_length)
    try:
        return await _relay_body(request, upstream, client_headers(upstream))
    finally:
        upstream.release()


async def unrouted(request: web.Request) -> web.StreamResponse:
    """A path no route serves: a watched endpoint's without its /v1 is told how to fix the base URL; any
    other, 404 (or 405 when a route serves the path with other methods)."""
    off = off_by_v1(request.rel_url.raw_path)
    if off is not None:
        return _base_url_off(request, off)
    return await no_route(request)


# Told at the default level at most once a minute for each kind of mistake: a misconfigured agent sends many.
BASE_URL_OFF_LOGGED_EVERY = 60.0


def _base_url_off(request: web.Request, off: OffByV1) -> web.Response:
    """404 in the dialect's shape, naming the fix; the first of each minute logged."""
    settings = request.app[SETTINGS]
    base = (settings.public_url or f"{request.scheme}://{request.host[:200]}").rstrip("/")  # as the client reached it
    fix = off.dialect.base_url_fix.format(base=base)
    message = (f"{request.path[:200]} is {off.meant} with {'one /v1 too many' if off.doubled else 'its /v1 missing'}"
               f": the client's base URL is off, and loopwarden does not pass on a conversation it cannot watch; "
               f"{fix}")
    kind = (off.dialect.name, off.doubled)
    now, logged = time.monotonic(), request.app[BASE_URL_OFF]
    if now - logged.get(kind, -BASE_URL_OFF_LOGGED_EVERY) >= BASE_URL_OFF_LOGGED_EVERY:
        logged[kind] = now
        log.warning("refused %s %s (at most one such line a minute): %s", request.method, request.path[:200],
                    message)
    return json_error(404, message, off.dialect.not_found_type, "wrong_base_url", shape=off.dialect.error_body)


async def _whole_body(request: web.Request, limit: int) -> bytes:
    """A watched path's body, decoded when the client compressed it. The server leaves request bodies as
    they came (so the relayed paths pass them on byte for byte); this path reads gzip and deflate itself."""
    if request.content.is_eof():  # as usual, the whole body came with the head
        raw = await request.read()
    else:
        raw = b"".join([chunk async for chunk in _body(request, limit)])
    encoding = _encoding(request.headers)
    if encoding != "identity" and encoding not in _ZLIB_ENCODINGS:
        raise web.HTTPUnsupportedMediaType(reason=f"request Content-Encoding {encoding[:40]!r} is not supported: "
                                                  "send gzip, deflate or none")
    decoded = _decoded(raw, encoding, limit)
    if decoded is None:
        raise web.HTTPBadRequest(reason=f"request body is not valid {encoding}")
    if len(decoded) > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(decoded))
    return decoded


async def _body(request: web.Request, limit: int) -> AsyncIterator[bytes]:
    """The request's body as it arrives, within the size limit. A body that stops arriving is answered 408
    after CLIENT_IDLE_TIMEOUT without a byte, so a client trickling it holds nothing for ever."""
    seen = 0
    while True:
        try:
            async with asyncio.timeout(CLIENT_IDLE_TIMEOUT):
                chunk = await request.content.readany()
        except TimeoutError:
            raise web.HTTPRequestTimeout(reason=f"request body stopped arriving: nothing for "
                                                f"{CLIENT_IDLE_TIMEOUT:g} s") from None
        except web.RequestPayloadError:
            raise web.HTTPBadRequest(reason="request body could not be read: a malformed chunk, or the client "
                                            "stopped mid-body") from None
        if not chunk:
            return
        seen += len(chunk)
        if seen > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=seen)
        yield chunk


async def metrics_page(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ready = await request.app[GUARD].ready()
    return web.json_response({"status": "ok" if ready else "unavailable"}, status=200 if ready else 503)


def malformed_requests_in_one_line(record: logging.LogRecord) -> bool:
    """aiohttp logs a request it cannot parse (not HTTP, conflicting lengths, a header over 8 KB, a broken
    chunk), or whose client hung up before its answer, as an error with a traceback. It is the client's
    doing, not the proxy's: one debug line instead."""
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, (HttpProcessingError, web.RequestPayloadError, ConnectionResetError)):
        return True
    reason = str(getattr(exc, "message", None) or exc).strip().splitlines()
    log.debug("refused a malformed request, or its client hung up, from %s: %s",
              record.args[0] if record.args else "?", reason[0] if reason else exc)
    return False


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """`Expect: 100-continue` (curl sends it for large bodies) gets its interim answer, as aiohttp's default
    gives it; any other expectation is refused 417 in the shape of the dialect the request's headers claim
    (aiohttp's default answers in text)."""
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        return json_error(417, f"unknown Expect: {expect[:100]}", "invalid_request_error", "expectation_failed",
                          shape=claimed(request).error_body)
    if request.version == aiohttp.HttpVersion11:
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer itself has not started
    return None


def create_app(settings: Settings) -> web.Application:
    logging.getLogger("aiohttp.server").addFilter(malformed_requests_in_one_line)  # once: the same function
    app = web.Application(client_max_size=settings.max_body_bytes,
                          handler_args={"auto_decompress": False})  # request bodies relayed as they came
    metrics = Metrics()
    store = Store(settings.database_url, settings.log_buffer_size, on_drop=metrics.log_dropped.inc,
                  on_reject=metrics.log_rejected.inc,
                  response_retention_days=settings.response_retention_days,
                  detection_retention_days=settings.detection_retention_days,
                  resume_link_ttl_hours=settings.resume_link_ttl)
    guard = guard_module.Guard(settings, store, metrics)
    metrics.log_failing.set_function(store.writer.failing_for)
    metrics.watch_caches(guard.caches())
    app[SETTINGS] = settings
    app[BASE_URL_OFF] = {}
    app[METRICS] = metrics
    app[GUARD] = guard
    app[TELEMETRY] = telemetry = Telemetry(os.environ)
    app[ADDONS] = Addons([*([TracingAddon(telemetry)] if telemetry.tracer is not None else []), TimingAddon(metrics),
                          guard.episodes, *([JudgeAddon(guard.judges)] if guard.judges is not None else [])])

    async def client_context(app: web.Application) -> AsyncIterator[None]:
        app[CLIENT] = make_upstream_client(settings)
        await app[GUARD].start()
        yield
        await app[GUARD].stop()
        await app[CLIENT].close()
        await app[TELEMETRY].close()

    app.cleanup_ctx.append(client_context)
    def add(routes, speaks: Callable[[web.Request], Dialect] | None = None) -> None:
        app.router.add_routes(web.RouteDef(route.method, route.path,
                                           served(metrics, _route_label(route.path), route.handler, speaks),
                                           {**route.kwargs, "expect_handler": expect_continue}) for route in routes)

    add([web.get("/healthz", healthz), web.get("/readyz", readyz),
         web.get("/", healthz),  # clients probe the base URL (Claude Code: HEAD /)
         web.get("/metrics", metrics_page), *admin.routes(guard, settings.admin_token),
         *(resume.routes(guard) if guard.store is not None else ())])
    for route in SERVED:  # each dialect's own routes answer errors in its shape
        add([web.route(route.method, route.path, (routed if route.decides else inspected)(route.dialect))],
            lambda request, dialect=route.dialect: dialect)
    add([web.route("*", "/v1/{tail:.*}", passthrough)], claimed)
    route_the_rest(app.router, served(metrics, "unmatched", unrouted, claimed), expect_continue)
    return app
