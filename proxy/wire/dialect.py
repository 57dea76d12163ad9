"""What the proxy asks of an API dialect: one Protocol, every question the server, the inspection step, the
judge and replay put to a dialect. A new dialect is a module that implements it, and a route.

Nothing outside `proxy/wire/` asks which dialect it holds: it asks the dialect.
"""

from __future__ import annotations

import functools

from typing import Any, Callable, Mapping, NamedTuple, Protocol

import orjson
from yarl import URL

from proxy.conversation import Conversation, Message, RequestError, ToolCall  # noqa: F401 (the dialects raise it)

# An upstream key as a dialect sends it: the lowercase names of the client's headers it replaces, the header's
# name and its value.
Credentials = tuple[frozenset[bytes], bytes, bytes]


class Summary(NamedTuple):
    """What an answer says of itself: its id, the model that wrote it and the tokens it counts (a span's
    `gen_ai.response.*` and `gen_ai.usage.*`)."""

    response_id: str | None = None
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


class JudgeQuestion(NamedTuple):
    """What the judge asks, in any dialect: the model, its instructions, the conversation as it reads it, and
    the JSON schema of the verdict it wants back."""

    model: str
    system: str
    shown: str
    schema: dict


class JudgeCall(NamedTuple):
    """The judge's question as one request in a dialect: the path under the dialect's upstream, the headers
    (the key where the dialect carries it) and the body."""

    path: str
    headers: dict[str, str]
    body: dict


class StreamAssembler(Protocol):
    """Follows one streamed answer event by event, and ends a stream the proxy cuts in the dialect's shape."""

    stop_is_cut: bool  # the stop reached mid-stream ends as a cut does (clients that resume after an error)
    finished: bool  # the answer's last event has been seen
    response_id: str | None
    model: str | None
    usage: Any
    last_reasoning: str  # the reasoning text the last event carried (it came before that event's text)

    def add(self, data: dict, event: str | None = None) -> tuple[str, bool]:
        """Take one event's JSON; return the new answer text and whether a tool call began (the event's new
        reasoning text is left in `last_reasoning`)."""

    @property
    def text(self) -> str: ...

    @property
    def reasoning_text(self) -> str:
        """The reasoning so far."""

    def message(self) -> Message:
        """The answer so far as a neutral assistant message."""

    def cut_ending(self, marker: dict, notice: str | None) -> bytes:
        """The last bytes of a stream the proxy cuts: the notice as the answer's last text, a clean end."""

    def stop_ending(self, error: dict) -> bytes:
        """The last bytes of a stream ended by the stop (where `stop_is_cut` is false)."""


class Routed(NamedTuple):
    """What a dialect's own route does with one request: inspect it, relay it unread (to `relay`'s upstream;
    None: the one its headers claim, else OpenAI's), or refuse it (`refused` says why)."""

    inspect: bool = False
    relay: "Dialect | None" = None
    refused: str | None = None


class Dialect(Protocol):
    name: str  # as detections record it (`detail.api`)
    items_key: str  # the top-level member whose list holds the conversation (`KnownBodies`)
    provider: str  # the provider family, as telemetry names it (`gen_ai.provider.name`) and the judge asks it
    # How its clients are told the proxy's address (`{base}`: http://HOST:PORT), when their base URL is off.
    base_url_fix: str
    not_found_type: str  # the error type of a 404 in its shape

    def claims(self, headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
        """Whether a request on a relayed path belongs to this dialect's upstream."""

    def wrote(self, body: dict) -> bool:
        """Whether a recorded request body (replay) is in this dialect."""

    def upstream_url(self, settings, raw_path: str, raw_query: str) -> URL:
        """Where a request goes, its path and query as the client encoded them (`raw_path` is the full path)."""

    def upstream_key(self, settings) -> str | None:
        """The key configured for this dialect's upstream; None: the client's own key goes up."""

    def credentials(self, settings) -> Credentials | None:
        """The configured upstream key as this dialect's key travels: the (lowercase) names of the client's
        headers it replaces, and the header that carries it. None: the client's own key goes up."""

    def read(self, payload: dict, history: list[Message] | None = None,
             kept_call: Callable[[str], ToolCall | None] | None = None,
             before: tuple[int, Any] | None = None) -> Conversation:
        """The request's conversation (`history`: what a chained request continues; `kept_call`: a call, by its
        id, of an answer the service keeps, for a request that names it rather than sending it; `before`: how
        many of its first items are those of the conversation's previous request, and that request's
        `Conversation.reading`, reused for them). Raises RequestError."""

    def with_warnings(self, payload: dict, conversation: Conversation, warnings: list[tuple[int, str, str]]) -> dict:
        """The request with each warning (place, role, text) inserted before the neutral message at its place."""

    def answer(self, body: dict) -> Message | None:
        """The assistant's turn in a non-streamed answer (its text is the answer's, its reasoning aside)."""

    def summary(self, body: dict) -> Summary:
        """What a non-streamed answer says of itself."""

    def tokens(self, usage: Any) -> tuple[int | None, int | None]:
        """The input and output tokens an answer's usage object counts (as a stream's events carry it too)."""

    def reasoning(self, body: dict) -> str:
        """The reasoning text of a non-streamed answer."""

    def recorded_reasoning(self, item: dict) -> str:
        """The reasoning one item of a recorded conversation holds (an assistant message's, or a reasoning item).
        Replay reads it as the proxy read the answer when it came; the rules never read it in a request."""

    def forwardable(self, payload: dict, checked: int = 0) -> dict | None:
        """The request as it may go upstream, where something the client sent back must be left out (a thinking
        block the proxy cut, which the service would refuse); None when it goes as it came. (`checked`: its
        first items are known to hold nothing to leave out.)"""

    def stream(self) -> StreamAssembler: ...

    def error_body(self, message: str, type_: str, code: str | None = None) -> bytes:
        """An error the proxy gives, in the shape this dialect's clients read."""

    def stream_error(self, message: str, type_: str, code: str | None = None) -> bytes:
        """The event that ends a stream on an error (the upstream failed mid-stream), on lines of its own."""

    def max_output_tokens(self, payload: dict) -> int | None: ...

    def model(self, payload: dict, raw_path: str) -> str | None:
        """The model the request asks for (in its body, or in its path)."""

    def chain_ids(self, payload: dict) -> tuple[str | None, str | None]:
        """The response this request continues and its conversation id, where the service keeps them."""

    def keeps_answer(self, payload: dict) -> bool:
        """Whether the service keeps this request's answer, for later requests to continue from."""

    def is_side_request(self, payload: dict) -> bool:
        """An agent's side request (a title, a check of its own): a conversation of its own."""

    def judge_call(self, question: JudgeQuestion, key: str, attempt: int) -> JudgeCall | None:
        """The judge's question as this dialect asks its upstream for a JSON answer; `attempt` counts the ways
        of asking for JSON that a backend refused before (None: no way is left)."""

    def judge_reply(self, body: dict) -> tuple[str, int]:
        """The text of the judge's answer and the tokens it cost."""


class DialectDefaults:
    """The answers most dialects give: the model named in the body, no conversation kept by the service, no
    side requests, the request forwarded as it came. A dialect overrides what it does otherwise."""

    @staticmethod
    def model(payload: dict, raw_path: str) -> str | None:
        model = payload.get("model")
        return model if isinstance(model, str) else None

    @staticmethod
    def chain_ids(payload: dict) -> tuple[str | None, str | None]:
        return None, None

    # Where an answer names its id, its model and its usage: the OpenAI and Anthropic answers' keys.
    summary_keys = ("id", "model", "usage")

    @classmethod
    def summary(cls, body: dict) -> Summary:
        id_key, model_key, usage_key = cls.summary_keys
        response_id, model = body.get(id_key), body.get(model_key)
        return Summary(response_id if isinstance(response_id, str) else None,
                       model if isinstance(model, str) else None, *cls.tokens(body.get(usage_key)))

    @staticmethod
    def tokens(usage: Any) -> tuple[int | None, int | None]:
        """`input_tokens` and `output_tokens` (the Responses and Messages APIs)."""
        return counted(usage, "input_tokens"), counted(usage, "output_tokens")

    @staticmethod
    def keeps_answer(payload: dict) -> bool:
        return False

    @staticmethod
    def is_side_request(payload: dict) -> bool:
        return False

    @staticmethod
    def forwardable(payload: dict, checked: int = 0) -> dict | None:
        return None


def sse(data: dict, event: str | None = None) -> bytes:
    """One server-sent event."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


@functools.lru_cache(maxsize=1024)
def join_url(base: str, raw_path: str, raw_query: str) -> URL:
    """A base URL and a path and query as the client encoded them: decoded and encoded again, `%2F` or `%26`
    would change meaning, and `..` would be resolved. A query in the base URL (`?api-version=...`) stays a
    query, before the client's. (Cached: an agent sends its requests to one or two paths, and a URL is
    immutable.)"""
    parsed = URL(base)
    query = "&".join(q for q in (parsed.raw_query_string, raw_query) if q)
    root = str(parsed.with_query(None).with_fragment(None)).rstrip("/")
    return URL(root + raw_path + (f"?{query}" if query else ""), encoded=True)


def counted(usage: Any, *names: str) -> int | None:
    """The sum of a usage object's counts under `names` (those it has, whole and not negative); None when it has
    none of them."""
    if not isinstance(usage, dict):
        return None
    found = [usage[name] for name in names
             if isinstance(usage.get(name), int) and not isinstance(usage[name], bool) and usage[name] >= 0]
    return sum(found) if found else None


def positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
