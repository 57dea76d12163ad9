"""The wire formats: one module per API dialect, each implementing `dialect.Dialect`, and the SSE parser.

`SERVED` lists every dialect's routes; `relay_dialect` picks the dialect (and so the upstream) of a request on
a path that is relayed unread; `judge_route` where and how the judge asks about a session.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, NamedTuple
from urllib.parse import unquote

from yarl import URL

from proxy.wire.chat import ChatDialect
from proxy.wire.dialect import Dialect, join_url
from proxy.wire.gemini import GeminiDialect
from proxy.wire.messages import MessagesDialect
from proxy.wire.responses import ResponsesDialect

# Dialects that claim requests by their headers, whatever their path.
GEMINI = GeminiDialect()
CLAIMING = (MessagesDialect(), GEMINI)
OPENAI = ChatDialect()
RECORDED = (MessagesDialect(), GEMINI, ResponsesDialect(), OPENAI)  # asked in order which wrote a recorded body
# The paths whose every request is inspected, and the dialect each speaks.
ROUTES: dict[str, Dialect] = {"/v1/chat/completions": ChatDialect(), "/v1/responses": ResponsesDialect(),
                              "/v1/messages": MessagesDialect()}
DECIDING = (GEMINI,)  # dialects with routes of their own, which decide request by request (`Dialect.route`)


class Route(NamedTuple):
    """A path the proxy serves for a dialect: every POST inspected, or (`decides`) each request as the
    dialect's `route` says."""

    method: str
    path: str  # as aiohttp spells a route
    dialect: Dialect
    decides: bool


SERVED = (*(Route("POST", path, dialect, False) for path, dialect in ROUTES.items()),
          *(Route("*", path, dialect, True) for dialect in DECIDING for path in dialect.paths))


def watched_alias(raw_path: str) -> str | None:
    """The watched path that `raw_path` spells another way (`/v1//chat/completions`, a trailing slash,
    `chat%2fcompletions`), if it is one: relayed as it is, its conversation would go by unwatched."""
    canonical = re.sub(r"/+", "/", unquote(raw_path)).rstrip("/")
    if canonical == raw_path:
        return None
    return canonical if canonical in ROUTES or any(dialect.watches(canonical) for dialect in DECIDING) else None


class OffByV1(NamedTuple):
    """A request whose path is a watched endpoint's with one `/v1` too many or too few: the client's base URL
    is off, and relayed as it is (or answered a bare 404), its conversation would go by unwatched."""

    dialect: Dialect
    meant: str  # the watched path it was meant to be
    doubled: bool  # one /v1 too many (else one missing)


def off_by_v1(raw_path: str) -> OffByV1 | None:
    """`/v1/v1/messages`, `/v1/v1/chat/completions`, `/v1/v1beta/models/...:generateContent` (a base URL that
    already ended in /v1), or `/chat/completions`, `/responses` (an OpenAI base URL without /v1)."""
    path = re.sub(r"/+", "/", unquote(raw_path)).rstrip("/")
    if path.startswith("/v1/"):
        meant = path.removeprefix("/v1")
        dialect = ROUTES.get(meant) or next((each for each in DECIDING if each.watches(meant)), None)
        return OffByV1(dialect, meant, True) if dialect is not None else None
    meant = "/v1" + path
    dialect = ROUTES.get(meant)
    return OffByV1(dialect, meant, False) if dialect is not None and dialect.provider == "openai" else None


def recorded_dialect(body: dict) -> Dialect | None:
    """The dialect a recorded request body is written in (for replay), if any reads it."""
    return next((dialect for dialect in RECORDED if dialect.wrote(body)), None)


def relay_dialect(headers: Mapping[str, str], query: Mapping[str, str], default: Dialect | None = None
                  ) -> Dialect:
    """The dialect whose upstream (and way of passing the key) a request takes: one that claims it by its
    headers, else the one its path speaks (`default`), else the OpenAI upstream."""
    for dialect in CLAIMING:
        if dialect.claims(headers, query):
            return dialect
    return default or OPENAI


class JudgeRoute(NamedTuple):
    """Where the judge asks about a session: in which dialect, at which URL (from a dialect's path), with
    which configured key (None: the client's own)."""

    dialect: Dialect
    url: Callable[[str], URL]
    key: str | None


def judge_route(settings, dialect: Dialect) -> JudgeRoute:
    """JUDGE_URL, when set, is a Chat Completions endpoint for every session; else a session is judged by its
    own upstream in its own dialect. JUDGE_API_KEY, when set, is the key either way."""
    if settings.judge_url:
        return JudgeRoute(OPENAI, lambda path: join_url(settings.judge_url, path.removeprefix("/v1"), ""),
                          settings.judge_api_key or settings.upstream_api_key)
    return JudgeRoute(dialect, lambda path: dialect.upstream_url(settings, path, ""),
                      settings.judge_api_key or dialect.upstream_key(settings))
