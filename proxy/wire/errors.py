"""Error bodies in the OpenAI shape, built once here and used everywhere."""

from __future__ import annotations

import orjson


def error_object(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict:
    return {"message": message, "type": type_, "param": param, "code": code}


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": error_object(message, type_, code, param)})


def sse_error_event(message: str, type_: str, code: str | None = None) -> bytes:
    """The last event of a stream the proxy ends with an error."""
    return b"data: " + error_body(message, type_, code) + b"\n\n"
