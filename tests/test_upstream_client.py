"""The upstream client as the client of the proxy sees it: TLS upstreams, answers framed every way HTTP/1.1
allows, connections kept alive and dropped, upstreams that do not speak HTTP."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import openai
import orjson
import pytest
import trustme

from tests.fake_upstream import FakeUpstream, Turn

CHAT = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
ANSWER = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "framed"}}]})


@pytest.fixture
def authority():
    return trustme.CA()


@pytest.fixture
async def tls_upstream(authority):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)
    fake = await FakeUpstream().start(ssl_context=context)
    yield fake
    await fake.close()


async def test_a_tls_upstream_the_system_trusts_is_reached(tls_upstream, authority, proxy_factory, monkeypatch,
                                                           tmp_path):
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))  # as a system trust store that holds the authority
    proxy = await proxy_factory(f"https://localhost:{tls_upstream.port}/v1")
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0)
    tls_upstream.script += [Turn(content="over tls"), Turn(content="streamed over tls")]
    answer = await client.chat.completions.create(**CHAT)
    assert answer.choices[0].message.content == "over tls"
    streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in
                        await client.chat.completions.create(**CHAT, stream=True) if chunk.choices])
    assert streamed == "streamed over tls"
    await client.close()


async def test_an_upstream_certificate_nobody_trusts_is_refused(tls_upstream, proxy_factory):
    proxy = await proxy_factory(f"https://localhost:{tls_upstream.port}/v1")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", json=CHAT) as response:
            body = await response.json()
    assert response.status == 502
    assert body["error"]["code"] == "upstream_unreachable"
    assert "certificate" in body["error"]["message"]
    assert not tls_upstream.requests


class ScriptedUpstream:
    """A TCP server that answers each request with the next bytes of its script as written (None: closes the
    connection instead), and keeps the connection open unless the answer says `Connection: close` or
    `hang_up` is set. It counts the connections it was given."""

    def __init__(self) -> None:
        self.script: list[bytes | None] = []
        self.hang_up = False
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> "ScriptedUpstream":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                answer = self.script.pop(0)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.hang_up or b"connection: close" in answer.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def close(self) -> None:
        self._server.close()


@pytest.fixture
async def scripted():
    server = await ScriptedUpstream().start()
    yield server
    await server.close()


def framed(body: bytes = ANSWER, *, head: bytes = b"Content-Type: application/json\r\n", length: bool = True,
           status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\n" + head + (b"Content-Length: %d\r\n" % len(body) if length else b"") + \
        b"\r\n" + body


async def chat(proxy) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/chat/completions", json=CHAT) as response:
            return response.status, await response.json()


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%b\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


@pytest.mark.parametrize("answer", [
    framed(),
    framed(chunked(ANSWER, 7), head=b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n",
           length=False),
    framed(head=b"Content-Type: application/json\r\nConnection: close\r\n", length=False),  # ends at the close
    b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" + framed(),  # an interim answer first
], ids=["length", "chunked", "until-close", "interim-first"])
async def test_an_answer_framed_any_way_arrives_whole_and_is_read(scripted, proxy_factory, answer):
    proxy = await proxy_factory(scripted.url)
    scripted.script.append(answer)
    status, body = await chat(proxy)
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "framed"
    assert body["choices"][0]["message"] == orjson.loads(ANSWER)["choices"][0]["message"]


async def test_one_connection_carries_the_requests_one_after_another(scripted, proxy_factory):
    proxy = await proxy_factory(scripted.url)
    scripted.script += [framed()] * 5
    for _ in range(5):
        assert (await chat(proxy))[0] == 200
    assert scripted.connections == 1
    # The request went up as the client sent it, with its length and the identity encoding asked for.
    head = scripted.requests[0].split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"post /v1/chat/completions http/1.1\r\n")
    assert b"accept-encoding: identity" in head
    assert b"content-length: %d" % len(scripted.requests[0].split(b"\r\n\r\n", 1)[1]) in head


async def test_a_connection_the_upstream_closed_while_idle_is_not_used_again(scripted, proxy_factory):
    proxy = await proxy_factory(scripted.url)
    scripted.hang_up = True  # as an upstream that closes connections idle for a while
    scripted.script += [framed()] * 3
    for n in range(3):
        assert (await chat(proxy))[0] == 200
        await asyncio.sleep(0.05)  # the close reaches the proxy
    assert scripted.connections == 3


@pytest.mark.parametrize("answer, message", [
    (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not valid HTTP"),
    (None, "closed the connection"),
    (framed()[:-20], "closed the connection"),  # the answer cut short by the close
], ids=["not-http", "closed-unanswered", "cut-short"])
async def test_an_upstream_that_breaks_the_exchange_is_a_502_in_the_openai_shape(scripted, proxy_factory, answer,
                                                                                 message):
    proxy = await proxy_factory(scripted.url)
    scripted.hang_up = True
    scripted.script.append(answer)
    status, body = await chat(proxy)
    assert status == 502
    assert body["error"]["code"] in ("upstream_unreachable", "upstream_invalid_response")
    assert message in body["error"]["message"]
    scripted.hang_up = False
    scripted.script.append(framed())
    assert (await chat(proxy))[0] == 200  # and the next request is served


async def test_an_answer_whose_body_stops_coming_is_a_504(scripted, proxy_factory):
    proxy = await proxy_factory(scripted.url, upstream_read_timeout=0.3)
    scripted.script.append(framed()[:-20])  # its length promises 20 bytes more that never come
    status, body = await chat(proxy)
    assert status == 504
    assert body["error"]["code"] == "upstream_timeout"
