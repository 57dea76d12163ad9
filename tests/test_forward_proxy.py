"""Behind a corporate egress proxy: the upstream, the judge and the webhook are reached through the forward proxy
the environment names (`HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`), as curl and the SDKs reach them. The forward
proxy is a real one, Debian's tinyproxy, started by the test."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest
import trustme
from aiohttp import web

from proxy.server.http1 import Proxies
from tests.conftest import RunningProxy
from tests.convo import conversation, step, user
from tests.fake_upstream import FakeUpstream, Turn
from tests.test_alerts import Receiver
from tests.test_log_api import _free_port

REQUIRE = os.environ.get("LOOPWARDEN_REQUIRE_FORWARD_PROXY") == "1"
TINYPROXY = shutil.which("tinyproxy")
CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


class Tinyproxy:
    """tinyproxy on a free port, logging each request it forwards to a file the test reads."""

    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.log = directory / "tinyproxy.log"
        self.config = directory / "tinyproxy.conf"
        self.config.write_text(f"Port {self.port}\nListen 127.0.0.1\nTimeout 30\nMaxClients 50\nLogLevel Info\n"
                               f"LogFile \"{self.log}\"\nPidFile \"{directory / 'tinyproxy.pid'}\"\n")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> "Tinyproxy":
        self.process = subprocess.Popen([TINYPROXY, "-d", "-c", str(self.config)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return self
            except OSError:
                await asyncio.sleep(0.05)
        raise AssertionError("tinyproxy did not start")

    def seen(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _tinyproxy_needed() -> None:
    if TINYPROXY is None:
        message = "tinyproxy is not installed (make test installs it with apt-get where it can)"
        if REQUIRE:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
async def forward_proxy(tmp_path):
    _tinyproxy_needed()
    running = await Tinyproxy(tmp_path).start()
    yield running
    running.stop()


@pytest.fixture
async def guarded_proxy():
    """A forward proxy that wants other credentials: it answers every request 407, as squid does (tinyproxy
    answers 401 instead, which no client can tell from the upstream's own)."""
    seen: list[str] = []

    async def refuse(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Proxy-Authorization", ""))
        return web.Response(status=407, text="Cache Access Denied: sk-wrong-user is not allowed",
                            headers={"Proxy-Authenticate": 'Basic realm="egress"', "Server": "squid/5.7"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", seen=seen)
    await runner.cleanup()


def through(monkeypatch, forward_proxy: Tinyproxy, no_proxy: str = "") -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy",
                 "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", forward_proxy.url)
    monkeypatch.setenv("HTTPS_PROXY", forward_proxy.url)
    if no_proxy:
        monkeypatch.setenv("NO_PROXY", no_proxy)


async def post(proxy: RunningProxy, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:  # straight to loopwarden (aiohttp reads no proxy by default)
        async with http.post(f"{proxy.url}/chat/completions", json=body) as answer:
            return answer.status, await answer.json()


async def test_an_http_upstream_is_reached_through_http_proxy(monkeypatch, forward_proxy, upstream, proxy_factory):
    through(monkeypatch, forward_proxy)
    proxy = await proxy_factory(upstream.url)
    upstream.script += [Turn(content="via the proxy"), Turn(content="again")]
    for expected in ("via the proxy", "again"):
        status, body = await post(proxy, CHAT)
        assert status == 200 and body["choices"][0]["message"]["content"] == expected
    assert all("tinyproxy" in request.headers.get("Via", "") for request in upstream.requests)
    assert f"127.0.0.1:{upstream.port}" in forward_proxy.seen()


async def test_a_host_no_proxy_names_is_reached_directly(monkeypatch, forward_proxy, upstream, proxy_factory):
    through(monkeypatch, forward_proxy, no_proxy="localhost,127.0.0.1")
    proxy = await proxy_factory(upstream.url)
    upstream.script.append(Turn(content="direct"))
    status, _ = await post(proxy, CHAT)
    assert status == 200 and "Via" not in upstream.requests[0].headers
    assert f":{upstream.port}" not in forward_proxy.seen()


async def test_an_https_upstream_is_reached_through_a_connect_tunnel(monkeypatch, forward_proxy, proxy_factory,
                                                                    tmp_path):
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    through(monkeypatch, forward_proxy)
    tls_upstream = await FakeUpstream().start(ssl_context=context)
    try:
        proxy = await proxy_factory(f"https://localhost:{tls_upstream.port}/v1")
        tls_upstream.script += [Turn(content="tunnelled"), Turn(content="tunnelled again")]
        for expected in ("tunnelled", "tunnelled again"):
            status, body = await post(proxy, CHAT)
            assert status == 200 and body["choices"][0]["message"]["content"] == expected
        assert f"CONNECT localhost:{tls_upstream.port}" in forward_proxy.seen()
    finally:
        await tls_upstream.close()


async def test_a_proxy_that_refuses_the_tunnel_is_a_502_that_names_no_proxy(monkeypatch, forward_proxy,
                                                                           proxy_factory, caplog):
    through(monkeypatch, forward_proxy)
    monkeypatch.setenv("HTTPS_PROXY", forward_proxy.url.replace("://", "://sk-proxy-token-123@"))
    closed = _free_port()  # nothing listens there: tinyproxy answers the CONNECT with an error
    proxy = await proxy_factory(f"https://localhost:{closed}/v1", upstream_connect_timeout=5)
    status, body = await post(proxy, CHAT)
    message = body["error"]["message"]
    assert status == 502 and body["error"]["code"] == "upstream_unreachable" and f"localhost:{closed}" in message
    for secret in ("proxy", "tinyproxy", str(forward_proxy.port), "sk-proxy-token-123", "tunnel"):
        assert secret not in message.replace("the proxy's log", "")  # the client learns nothing of it
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "refused the tunnel" in logged or "closed the tunnel" in logged  # the operator has the detail
    assert f"***@127.0.0.1:{forward_proxy.port}" in logged and "sk-proxy-token-123" not in logged


async def test_a_proxys_own_refusal_over_plain_http_is_its_failure_not_the_upstreams_answer(
        monkeypatch, guarded_proxy, upstream, proxy_factory, caplog):
    through(monkeypatch, guarded_proxy)
    monkeypatch.setenv("HTTP_PROXY", guarded_proxy.url.replace("://", "://sk-wrong-user:nope@"))
    proxy = await proxy_factory(upstream.url)
    status, body = await post(proxy, CHAT)
    assert guarded_proxy.seen and guarded_proxy.seen[0].startswith("Basic ")  # it was asked, with the credentials
    assert status == 502 and body["error"]["code"] == "upstream_unreachable"
    for shown in ("407", "sk-wrong-user", "squid", "Denied", "egress"):
        assert shown not in str(body)
    assert upstream.requests == []  # it never got there
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "407" in logged and "sk-wrong-user" not in logged and "nope" not in logged


async def test_the_webhook_goes_through_the_proxy_too(monkeypatch, forward_proxy, upstream, proxy_factory):
    receiver = Receiver()
    url = await receiver.start()
    try:
        through(monkeypatch, forward_proxy)
        proxy = await proxy_factory(upstream.url, webhook_url=url, preset="default")
        looping = conversation(user("read it"), *[step("read_file", {"path": "a.py"}, "x = 1") for _ in range(5)])
        status, body = await post(proxy, {"model": "gpt-test", "messages": looping})
        assert status == 400 and body["error"]["code"] == "loop_detected"
        (alert,) = await receiver.until(1)
        assert alert["action"] == "stopped"
        assert "/hook" in forward_proxy.seen()
    finally:
        await receiver.runner.cleanup()


def test_proxies_are_read_as_curl_reads_them():
    proxies = Proxies({"https": "http://user:secret@egress.example:3128", "http": "http://egress.example:3128",
                       "no": "localhost,.internal.example,10.1.2.3"})
    from yarl import URL

    assert proxies.for_url(URL("https://api.openai.com/v1")).host == "egress.example"
    assert proxies.for_url(URL("https://api.openai.com/v1")).authorization.startswith(b"Basic ")
    assert proxies.for_url(URL("http://vllm:8000/v1")).port == 3128
    for bypassed in ("http://localhost:11434/v1", "https://llm.internal.example/v1", "http://10.1.2.3/v1"):
        assert proxies.for_url(URL(bypassed)) is None
    assert "secret" not in proxies.shown() and "user" not in proxies.shown()
    assert "***@egress.example" in proxies.shown()
    assert Proxies({}).for_url(URL("https://api.openai.com/v1")) is None


async def test_the_judge_goes_through_the_proxy_too(monkeypatch, forward_proxy, upstream, proxy_factory):
    from tests.test_judge import history, judged, verdict

    through(monkeypatch, forward_proxy)
    proxy = await proxy_factory(upstream.url, llm_check=True)
    upstream.judge = lambda body: verdict(0.2)
    upstream.script.append(Turn(content="working"))
    status, _ = await post(proxy, {"model": "agent-model", "messages": history(30)})
    assert status == 200 and await judged(upstream, 1)
    (judge,) = [r for r in upstream.requests if "X-Loopwarden-Judge" in r.headers]
    assert "tinyproxy" in judge.headers.get("Via", "")


@pytest.mark.parametrize("no_proxy, url, bypassed", [
    ("api.example.com:443", "https://api.example.com/v1", True),  # a host with its port
    ("api.example.com:443", "http://api.example.com:8080/v1", False),  # another port goes through the proxy
    ("10.0.0.0/8", "http://10.20.30.40:8000/v1", True),  # a CIDR block
    ("10.0.0.0/8", "http://11.0.0.1/v1", False),
    ("[::1]", "http://[::1]:11434/v1", True),  # a bracketed IPv6 address
    ("::1", "http://[::1]:11434/v1", True),
    ("[::1]:11434", "http://[::1]:11434/v1", True),
    ("fd00::/8", "http://[fd12::5]/v1", True),
    ("example.com.", "https://api.example.com/v1", True),  # a trailing dot on the entry
    ("example.com", "https://api.example.com./v1", True),  # or on the host
    (".example.com", "https://example.com/v1", True),
    ("*.example.com", "https://llm.example.com/v1", True),
    ("example.com", "https://notexample.com/v1", False),  # a name, not a string's end
    ("EXAMPLE.com", "https://Api.Example.COM/v1", True),
    ("localhost 127.0.0.1", "http://127.0.0.1:8000/v1", True),  # space-separated
    ("*", "https://api.openai.com/v1", True),
    ("", "https://api.openai.com/v1", False),
])
def test_no_proxy_is_matched_as_the_common_clients_match_it(no_proxy, url, bypassed):
    from yarl import URL

    proxies = Proxies({"https": "http://egress:3128", "http": "http://egress:3128", "no": no_proxy})
    assert (proxies.for_url(URL(url)) is None) == bypassed
