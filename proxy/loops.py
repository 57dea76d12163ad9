"""The event loop the proxy runs on: uvloop where it installs (Linux, macOS), the standard loop elsewhere or
when EVENT_LOOP=asyncio. uvloop runs the same code with less CPU per request (BENCHMARKS.md)."""

from __future__ import annotations

import asyncio


def loop_name(choice: str) -> str:
    """Which loop `choice` (auto, uvloop, asyncio) gives here."""
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise RuntimeError("EVENT_LOOP=uvloop, but uvloop is not installed (pip install uvloop)") from None
        return "asyncio"
    return "uvloop"


def new_event_loop(choice: str) -> asyncio.AbstractEventLoop:
    if loop_name(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()
