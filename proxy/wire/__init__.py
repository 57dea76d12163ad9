"""The wire formats: one module per API dialect, each implementing `dialect.Dialect`, and the SSE parser.

`relay_dialect` picks the dialect (and so the upstream) of a request on a path that is relayed unread;
`judge_route` where and how the judge asks about a session.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

from yarl import URL

from proxy.wire.chat import ChatDialect
from proxy.wire.dialect import Dialect, join_url
from proxy.wire.gemini import INSPECTED_METHODS, GeminiDialect
from proxy.wire.messages import MessagesDialect
from proxy.wire.responses import ResponsesDialect

# Dialects that claim requests by their headers, whatever their path.
GEMINI = GeminiDialect()
CLAIMING = (MessagesDialect(), GEMINI)
OPENAI = ChatDialect()
RECORDED = (MessagesDialect(), GEMINI, ResponsesDialect(), OPENAI)  # asked in order which wrote a recorded body
# The inspected routes and the dialect each speaks.
ROUTES: dict[str, Dialect] = {"/v1/chat/completions": ChatDialect(), "/v1/responses": ResponsesDialect(),
                              "/v1/messages": MessagesDialect()}


def gemini_inspected(target: str) -> bool:
    """Whether `models/{target}` on a Gemini path (`gemini-2.5-pro:streamGenerateContent`) is a call whose
    conversation is watched: the colon method tells it from OpenAI's `/v1/models/{id}`."""
    return target.rpartition(":")[2] in INSPECTED_METHODS


def recorded_dialect(body: dict) -> Dialect | None:
    """The dialect a recorded request body is written in (for replay), if any reads it."""
    return next((dialect for dialect in RECORDED if dialect.wrote(body)), None)


def relay_dialect(headers: Mapping[str, str], query: Mapping[str, str], default: Dialect = OPENAI) -> Dialect:
    """The dialect whose upstream (and way of passing the key) a request takes: one that claims it by its
    headers, else the one its path speaks, else the OpenAI upstream."""
    for dialect in CLAIMING:
        if dialect.claims(headers, query):
            return dialect
    return default


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
