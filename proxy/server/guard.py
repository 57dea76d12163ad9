"""The guard: between the HTTP handler and the detection engine, one exchange per request."""

from __future__ import annotations

import logging

import orjson
from aiohttp import web

from proxy.config import Settings
from proxy.wire.chat import ChatStreamAssembler
from proxy.wire.sse import SSEParser

log = logging.getLogger("loopwarden.guard")


class Exchange:
    """One chat completion on its way through: what to send, and the tap on what comes back."""

    def __init__(self, body: bytes) -> None:
        self.stop: web.Response | None = None
        self.body = body
        self.response_headers: dict[str, str] = {}
        self._parser = SSEParser()
        self._assembler = ChatStreamAssembler()

    def on_stream_bytes(self, chunk: bytes) -> bytes | None:
        """Read a copy of upstream bytes. Returns the bytes that end the stream when it must be cut."""
        for event in self._parser.feed(chunk):
            if event.data == b"[DONE]":
                continue
            try:
                data = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(data, dict):
                ending = self.on_chunk(data)
                if ending is not None:
                    return ending
        return None

    def on_chunk(self, data: dict) -> bytes | None:
        self._assembler.add(data)
        return None

    def on_stream_end(self) -> None:
        pass

    def on_complete(self, answer: object) -> None:
        pass


class Guard:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def ready(self) -> bool:
        return True

    def begin(self, request: web.Request, raw: bytes, payload: dict) -> Exchange:
        return Exchange(raw)
