"""The upstream client: HTTP/1.1 over pooled keep-alive connections, parsed by httptools (llhttp).

A request costs a quarter of what aiohttp's client spends on it (BENCHMARKS, "The upstream client, ..."), which
was the largest single cost of a forwarded request. It does only what forwarding needs: one request per
connection at a time, the request's body whole or streamed, the answer's body as it comes with back
pressure, a connect timeout and a read timeout (the longest the upstream may stay silent), TLS with the
system's trusted certificates, through the environment's forward proxy (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`,
as curl and the SDKs read them). No redirects, cookies or decompression: the proxy relays those as they are.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
import ssl
import urllib.request
from typing import AsyncIterator, Callable, Mapping

import httptools
from multidict import CIMultiDict
from yarl import URL

# Past this much unread answer the connection stops reading, so a slow client slows the upstream down
# instead of filling memory.
_HIGH_WATER = 256 * 1024
_IDLE_CHECK = 10.0  # seconds between sweeps of idle connections
# An answer's head within aiohttp's client limits: past these the answer is refused, never buffered whole.
MAX_HEADERS = 128
MAX_FIELD = 8190  # bytes of the status line, or of one header's name or value
_MAX_HEAD = MAX_HEADERS * MAX_FIELD  # bytes received before the head is whole
# Methods whose request says its length even when empty (some servers answer 411 to a POST that does not).
_SENDS_A_BODY = frozenset({"POST", "PUT", "PATCH"})


class UpstreamError(Exception):
    """The upstream could not be reached, or broke the exchange."""


class ConnectFailed(UpstreamError):
    """No connection could be made; `os_error` says why."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class ForwardProxyFailed(ConnectFailed):
    """The forward proxy on the way refused or failed the request: the proxy's failure, not the upstream's
    answer. `os_error` holds the detail for the operator's log (the proxy's credentials masked); a client is
    told none of it."""


class ConnectionBroken(UpstreamError):
    """The connection closed, or the upstream sent what is not HTTP, before the answer was whole."""


class _Connection(asyncio.Protocol):
    """One connection and the answer being read on it; the parser's callbacks fill the answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self._loop = loop
        self._read_timeout = read_timeout
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.response: UpstreamResponse | None = None
        self._headers: list[tuple[str, str]] = []
        self._reason = ""
        self._head_bytes = 0  # received for the answer whose head is not whole yet
        self._waiter: asyncio.Future | None = None  # a reader waiting for the head, a body chunk or its end
        self._drain: asyncio.Future | None = None  # a writer waiting for the socket's buffer to empty
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._failure: BaseException | None = None

    # asyncio's side

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        response = self.response
        if response is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        if not response.headers_read:
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD + len(data):  # a whole head fits in the limit and one read after it
                self._refuse(f"the upstream's answer head is over {_MAX_HEAD} bytes")
                return
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # A callback that refused the answer said why; else the parser did.
            self._fail(self._failure or ConnectionBroken(f"the upstream's answer is not valid HTTP: {exc}"))
            self.close()

    def _refuse(self, why: str) -> None:
        """The answer breaks a limit or the protocol: the request fails with why, and the connection is closed."""
        self._fail(ConnectionBroken(why))
        self.close()

    def close(self) -> None:
        self.closed = True
        self.transport.close()

    def eof_received(self) -> bool:
        return False  # closes the transport; connection_lost follows

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._stop_timer()
        response = self.response
        if response is not None and not response.complete:
            if response.headers_read and response.until_close:  # a body that ends where the connection does
                response.complete = True
                self._wake()
            elif self._failure is None:  # else the answer was refused already, and why is kept
                reason = f": {exc}" if exc else ""
                self._fail(ConnectionBroken(f"the upstream closed the connection{reason}"))
        self.resume_writing()  # a writer waiting sees the connection closed

    def pause_writing(self) -> None:
        self._drain = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    # the parser's side

    def on_status(self, reason: bytes) -> None:  # called with each piece of the line, as the reads cut it
        self._reason += reason.decode("latin-1")
        if len(self._reason) > MAX_FIELD:
            self._failure = ConnectionBroken(f"the upstream's status line is over {MAX_FIELD} bytes")
            raise self._failure

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self._headers) == MAX_HEADERS or len(name) > MAX_FIELD or len(value) > MAX_FIELD:
            self._failure = ConnectionBroken(
                f"the upstream's answer has more than {MAX_HEADERS} headers" if len(self._headers) == MAX_HEADERS
                else f"the upstream's answer has a header over {MAX_FIELD} bytes")
            raise self._failure
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        headers, self._headers = self._headers, []
        reason, self._reason = self._reason, ""
        if status == 101:  # the connection would stop being HTTP: no API answers so
            self._failure = ConnectionBroken("the upstream switched protocols (101), which an API answer never does")
            raise self._failure
        if status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self._head_bytes = 0
            return
        response = self.response
        if response.headers_read:  # a second answer to one request
            raise httptools.HttpParserError("more than one answer to a request")
        response.status = status
        response.reason = reason
        response.raw_headers = headers
        response.headers = CIMultiDict(headers)
        response.keep_alive = self._parser.should_keep_alive()
        length = response.headers.get("Content-Length")
        response.content_length = int(length) if length is not None and length.isdigit() else None
        # Chunked only when chunked is the last coding (RFC 9112 6.3): else the body ends with the connection.
        codings = ",".join(response.headers.getall("Transfer-Encoding", ())).rsplit(",", 1)[-1]
        response.until_close = length is None and codings.strip().lower() != "chunked"
        response.headers_read = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        response = self.response
        response.chunks.append(body)
        response.buffered += len(body)
        if response.buffered > _HIGH_WATER and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or not response.headers_read:
            return  # the end of an interim answer
        response.complete = True
        self._stop_timer()
        self._wake()

    # the reader's side

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, failure: BaseException) -> None:
        self._failure = failure
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_exception(failure)

    async def wait(self) -> None:
        """Until the parser has something new for the reader: a failure is raised."""
        if self._failure is not None:
            raise self._failure
        if self.closed:
            raise ConnectionBroken("the upstream closed the connection")
        self._waiter = self._loop.create_future()
        await self._waiter

    def consumed(self) -> None:
        if self._paused:
            self._paused = False
            self.transport.resume_reading()

    def start(self, response: UpstreamResponse) -> None:
        """A request goes out on this connection now: its silence is timed from here."""
        self.response = response
        self._failure = None
        self._head_bytes = 0
        self._last_read = self._loop.time()
        self._timer = self._loop.call_at(self._last_read + self._read_timeout, self._check_silence)

    def _check_silence(self) -> None:
        """One timer per answer rather than one per read: it fires when the upstream may have been silent
        long enough, and looks when it last heard from it."""
        self._timer = None
        now = self._loop.time()
        if self._paused and self.response is not None:  # its reader is slow (what was read waits for it)
            self._timer = self._loop.call_at(now + 1.0, self._check_silence)
            return
        due = self._last_read + self._read_timeout
        if now < due:  # heard from lately (or the timer fired a little early): look again when it is due
            self._timer = self._loop.call_at(due, self._check_silence)
            return
        self._fail(asyncio.TimeoutError())
        self.close()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def drain(self) -> None:
        if self._drain is not None:
            await self._drain

    def body_sent(self, sending: asyncio.Task) -> None:
        """The request body's sending ended. A failure before the answer's head fails the request with it (the
        client's body broke off or grew past the limit, or the connection broke)."""
        if sending.cancelled() or self.response is None or self.response.headers_read:
            return
        failure = sending.exception()
        if failure is not None:
            self._fail(failure)
            self.close()

    @property
    def reusable(self) -> bool:
        """Open, reading, and holding nothing of an earlier answer: a new request may go out on it."""
        return not self.closed and not self._paused


class UpstreamResponse:
    """The upstream's answer: its head once `UpstreamClient.request` returns, its body read as it comes."""

    __slots__ = ("status", "reason", "headers", "raw_headers", "content_length", "keep_alive", "until_close",
                 "headers_read", "complete", "chunks", "buffered", "_connection", "_pool", "_released")

    def __init__(self, connection: _Connection, pool: _Pool) -> None:
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDict[str] | None = None  # for lookups; not to be changed
        self.raw_headers: list[tuple[str, str]] = []  # as they came
        self.content_length: int | None = None
        self.keep_alive = False
        self.until_close = False
        self.headers_read = False
        self.complete = False
        self.chunks: list[bytes] = []
        self.buffered = 0
        self._connection = connection
        self._pool = pool
        self._released = False

    async def read_any(self) -> bytes:
        """What has come of the body since the last read, waiting for some; b"" at its end."""
        connection = self._connection
        while not self.chunks:
            if self.complete:
                return b""
            await connection.wait()
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        connection.consumed()
        return data

    async def chunks_as_they_come(self) -> AsyncIterator[bytes]:
        while data := await self.read_any():
            yield data

    def release(self) -> None:
        """Done with the answer: the connection goes back to the pool if the answer was read to its end and
        the upstream keeps connections open, else it is closed."""
        if self._released:
            return
        self._released = True
        connection = self._connection
        connection.response = None
        if self.complete and self.keep_alive and connection.reusable:
            self._pool.put(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Stop reading: the connection is closed, so the upstream stops sending (and generating)."""
        self._connection.close()
        self.release()


class _Pool:
    """The idle connections to one upstream, the most recently used first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, keepalive: float) -> None:
        self._loop = loop
        self._keepalive = keepalive
        self.idle: list[_Connection] = []

    def take(self) -> _Connection | None:
        idle = self.idle
        oldest = self._loop.time() - self._keepalive
        while idle:
            connection = idle.pop()
            if connection.idle_since < oldest:
                connection.close()
            elif not connection.closed:
                return connection
        return None

    def put(self, connection: _Connection) -> None:
        connection.idle_since = self._loop.time()
        self.idle.append(connection)

    def sweep(self) -> None:
        """Close what has stayed idle past the keep-alive time (an upstream may drop it any moment now)."""
        oldest = self._loop.time() - self._keepalive
        keep = []
        for connection in self.idle:
            if connection.closed:
                continue
            if connection.idle_since < oldest:
                connection.close()
            else:
                keep.append(connection)
        self.idle = keep

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle = []


def _head(method: str, url: URL, headers: list[tuple[bytes, bytes]], length: int | None, chunked: bool,
          via: "ForwardProxy | None" = None) -> bytes:
    """The request line and headers, the headers' bytes as the client sent them. Through a forward proxy, a plain
    HTTP request names its whole URL (RFC 9112 3.2.2), with the proxy's credentials."""
    target = url.raw_path_qs if via is None else f"http://{url.host_port_subcomponent}{url.raw_path_qs}"
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {url.host_port_subcomponent}\r\n".encode()]
    if via is not None and via.authorization:
        lines.append(b"Proxy-Authorization: " + via.authorization + b"\r\n")
    for name, value in headers:
        if b"\n" in value or b"\r" in value:
            raise ValueError(f"header {name.decode('latin-1')} has a line break in its value")
        lines += (name, b": ", value, b"\r\n")
    if length is not None:
        lines.append(b"Content-Length: %d\r\n" % length)
    elif chunked:
        lines.append(b"Transfer-Encoding: chunked\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


async def _send_chunks(connection: _Connection, body: AsyncIterator[bytes], chunked: bool) -> None:
    write = connection.transport.write
    async for chunk in body:
        if connection.closed:
            raise ConnectionBroken("the upstream closed the connection while the request was sent")
        if chunk:
            write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            await connection.drain()
    if chunked and not connection.closed:
        write(b"0\r\n\r\n")


async def _tunnel(loop: asyncio.AbstractEventLoop, via: ForwardProxy, host: str, port: int) -> socket.socket:
    """A socket to `host:port` through the proxy's CONNECT (RFC 9110 9.3.6); a refusal is an OSError that says
    the proxy's answer."""
    infos = await loop.getaddrinfo(via.host.strip("[]"), via.port, type=socket.SOCK_STREAM)
    family, kind, protocol, _, address = infos[0]
    sock = socket.socket(family, kind, protocol)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, address)
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        request = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n".encode()
        if via.authorization:
            request += b"Proxy-Authorization: " + via.authorization + b"\r\n"
        await loop.sock_sendall(sock, request + b"\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:  # the proxy's head only: nothing follows it before the tunnel is used
            data = await loop.sock_recv(sock, 4096)
            if not data:
                raise OSError("it closed the tunnel before answering")
            answer += data
            if len(answer) > MAX_FIELD and b"\r\n\r\n" not in answer:
                raise OSError(f"it answered the tunnel with a head over {MAX_FIELD} bytes")
        status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
        if status_line.split(" ")[1:2] != ["200"]:
            raise OSError(f"it refused the tunnel to {authority}: {status_line[:200]!r}")
    except BaseException:
        sock.close()
        raise
    return sock


def _settle(sending: asyncio.Task, response: UpstreamResponse) -> None:
    """The body's sending once the answer's head is in (or the request failed): stopped if it still runs; a
    body that could not be sent whole leaves the connection unfit for another request."""
    if not sending.done():
        sending.cancel()
    elif sending.cancelled() or sending.exception() is not None:
        response.keep_alive = False


class ForwardProxy:
    """An HTTP forward proxy the environment names: its address, and its credentials as a header."""

    __slots__ = ("url", "host", "port", "authorization")

    def __init__(self, url: str) -> None:
        parsed = URL(url if "://" in url else f"http://{url}")
        if parsed.scheme != "http":
            raise ValueError(f"only an http:// forward proxy is supported, got {parsed.scheme}://")
        self.url = parsed
        self.host = parsed.raw_host or ""
        self.port = parsed.port or 80
        self.authorization = b"Basic " + base64.b64encode(f"{parsed.user or ''}:{parsed.password or ''}".encode()) \
            if parsed.user is not None else None

    def shown(self) -> str:
        """Its URL as a log line may show it: the whole user-info masked (some proxies take a token as the user
        name)."""
        shown = str(self.url.with_user(None))
        return shown.replace("://", "://***@", 1) if self.url.user is not None else shown


class Proxies:
    """Which forward proxy a request goes through: `https` for https upstreams, `http` for http ones, none for a
    host `no` names, from the environment's `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` (either case)."""

    def __init__(self, found: Mapping[str, str]) -> None:
        self._no_proxy = NoProxy(found.get("no", ""))
        self.by_scheme = {scheme: ForwardProxy(url) for scheme, url in found.items()
                          if scheme in ("http", "https") and url}

    @classmethod
    def from_environment(cls) -> "Proxies":
        return cls(urllib.request.getproxies_environment())

    def for_url(self, url: URL) -> ForwardProxy | None:
        via = self.by_scheme.get(url.scheme)
        if via is None or self._no_proxy.bypasses(url.raw_host or "", url.port):
            return None
        return via

    def shown(self) -> str:
        """The proxies in use, for the start line (passwords masked); "" when none."""
        return ", ".join(f"{scheme} via {via.shown()}" for scheme, via in sorted(self.by_scheme.items()))


class NoProxy:
    """`NO_PROXY` as curl, Go and the common SDKs read it: entries split by commas or spaces, each `*` (every
    host), an address or a CIDR block (`10.0.0.0/8`, `[::1]`, `::1`), or a name matching itself and the names
    under it (`example.com`, `.example.com` and `*.example.com` alike); an entry may name a port
    (`api.example.com:443`, `[::1]:8080`), then only that port is bypassed; case and a trailing dot do not
    count."""

    def __init__(self, value: str) -> None:
        self.everything = False
        self.networks: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None]] = []
        self.names: list[tuple[str, int | None]] = []
        for entry in value.replace(",", " ").lower().split():
            if entry == "*":
                self.everything = True
                continue
            host, port = _host_and_port(entry)
            try:
                self.networks.append((ipaddress.ip_network(host, strict=False), port))
            except ValueError:
                host = host.rstrip(".").removeprefix("*").lstrip(".")
                if host:
                    self.names.append((host, port))

    def bypasses(self, host: str, port: int | None) -> bool:
        if self.everything:
            return True
        host = host.strip("[]").lower().rstrip(".")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return any((wanted is None or wanted == port) and (host == name or host.endswith("." + name))
                       for name, wanted in self.names)
        return any((wanted is None or wanted == port) and address in network for network, wanted in self.networks)


def _host_and_port(entry: str) -> tuple[str, int | None]:
    """An entry's host and port: `[v6]:port`, `host:port`, or a bare host (an IPv6 address has colons of its
    own)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    host, colon, port = entry.rpartition(":")
    if colon and port.isdigit() and ":" not in host:
        return host, int(port)
    return entry, None


class UpstreamClient:
    """Requests to any number of upstreams, each over its own pool of keep-alive connections."""

    def __init__(self, connect_timeout: float, read_timeout: float, keepalive: float = 30.0,
                 proxies: Proxies | None = None) -> None:
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._keepalive = keepalive
        self.proxies = proxies if proxies is not None else Proxies({})
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def request(self, method: str, url: URL, headers: list[tuple[bytes, bytes]],
                      body: bytes | AsyncIterator[bytes] | None, length: int | None = None,
                      sent: Callable[[], None] | None = None) -> UpstreamResponse:
        """Send the request and wait for the answer's head. A body given as chunks goes out as they come:
        with its `length` when known, else chunked. `sent` is called once the request is out, before its
        answer is awaited: work the answer does not need yet, done while the upstream thinks."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(_IDLE_CHECK, self._sweep)
        if body is None:
            length = 0 if method in _SENDS_A_BODY else None
        elif isinstance(body, bytes):
            length = len(body)
        chunked = length is None and body is not None
        via = self.proxies.for_url(url)
        head = _head(method, url, headers, length, chunked, via if url.scheme == "http" else None)
        key = (url.scheme, url.raw_host or "", url.port or 0)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(loop, self._keepalive)
        connection = pool.take() or await self._connect(loop, url, via)
        plain_via = via if url.scheme == "http" else None
        response = UpstreamResponse(connection, pool)
        sending: asyncio.Task | None = None
        try:
            connection.start(response)
            if body is None or isinstance(body, bytes):
                # Two buffers, not joined: a long conversation's body is megabytes (the loop writes both at once).
                connection.transport.writelines((head, body) if body else (head,))
            else:  # sent while the answer is awaited: an upstream may answer (413) before it has all of it
                connection.transport.write(head)
                sending = loop.create_task(_send_chunks(connection, body, chunked))
                sending.add_done_callback(connection.body_sent)
            if sent is not None:
                sent()
            while not response.headers_read:
                await connection.wait()
            if plain_via is not None and response.status == 407:  # the forward proxy's own refusal
                response.keep_alive = False
                raise ForwardProxyFailed(OSError(f"the forward proxy {plain_via.shown()} asked for credentials "
                                                 f"(407) on {method} {url.origin()}"))
            if sending is not None and not sending.done() or connection.transport.get_write_buffer_size():
                # An early answer: the rest of the body is dropped, and the connection is not used again.
                response.keep_alive = False
            if method == "HEAD":  # its answer has no body, whatever its head says; the parser cannot know
                response.complete = True
                response.keep_alive = False
        except BaseException:
            response.close()
            raise
        finally:
            if sending is not None:
                _settle(sending, response)
        return response

    async def _connect(self, loop: asyncio.AbstractEventLoop, url: URL, via: ForwardProxy | None) -> _Connection:
        secure = url.scheme == "https"
        if secure and self._ssl is None:
            self._ssl = ssl.create_default_context()
        host = (url.raw_host or "").strip("[]")
        make = lambda: _Connection(loop, self._read_timeout)  # noqa: E731
        try:
            async with asyncio.timeout(self._connect_timeout):
                if via is None:
                    _, connection = await loop.create_connection(
                        make, host, url.port, ssl=self._ssl if secure else None,
                        server_hostname=url.host if secure else None)
                elif not secure:  # the proxy forwards each request, named by its whole URL
                    _, connection = await loop.create_connection(make, via.host.strip("[]"), via.port)
                else:  # a tunnel through the proxy, then TLS with the upstream inside it
                    tunnel = await _tunnel(loop, via, host, url.port or 443)
                    _, connection = await loop.create_connection(make, sock=tunnel, ssl=self._ssl,
                                                                 server_hostname=url.host)
        except TimeoutError:  # an OSError too, but a timeout (504), not a refusal
            raise
        except OSError as exc:  # refused, unreachable, not resolved, or a certificate not trusted
            if via is not None:
                raise ForwardProxyFailed(OSError(f"through the forward proxy {via.shown()}: {exc}")) from exc
            raise ConnectFailed(exc) from exc
        return connection

    def _sweep(self) -> None:
        for pool in self._pools.values():
            pool.sweep()
        self._sweeper = self._loop.call_later(_IDLE_CHECK, self._sweep)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
