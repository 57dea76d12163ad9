"""The Gemini API dialect (`…/models/{model}:generateContent` and `:streamGenerateContent`): contents, parts and
streamed chunks to and from the neutral conversation.

`systemInstruction` is the system prompt. `contents` are the conversation: `model` turns are the assistant's
(their `text` parts its text, their `functionCall` parts its tool calls; `thought: true` parts are its
reasoning), `user` turns the rest (`functionResponse` parts are tool results, failed when the response object
holds an `error`; `text` parts a person's words). `thoughtSignature`, `inlineData`, `fileData`,
`executableCode` and every other field travel unchanged and are ignored for detection. A warning is a `text`
part after the `functionResponse` parts of the user turn that answers the call completing the loop. Requests
go to GEMINI_UPSTREAM_URL, as does every request carrying `x-goog-api-key` or a `key` query parameter. A
stream (`?alt=sse`) is a chunk per event, each a whole `GenerateContentResponse`. Pure code, no I/O.
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import parse_qsl, quote, unquote, urlencode

import orjson
from yarl import URL

from proxy.conversation import ASSISTANT, SYSTEM, TOOL, USER, Anchor, Conversation, ItemReading, Message, \
    Messages, ToolCall, arguments_text, insert_placed, resume
from proxy.wire.dialect import Credentials, DialectDefaults, JudgeCall, JudgeQuestion, RequestError, Routed, counted, \
    join_url, positive_int, sse

_REPLACED = frozenset({b"authorization", b"x-goog-api-key"})  # whichever auth the client used
# The methods whose conversations are watched; the rest (`countTokens`, `embedContent`, ...) are relayed.
INSPECTED_METHODS = ("generateContent", "streamGenerateContent")
MODELS = ("models", "tunedModels")  # the API's collections whose members generate content
VERSIONS = ("v1beta", "v1")
# User text an agent wrote, not a person (Gemini CLI's own loop notice, the proxy's warnings): it starts no task.
_AGENT_TEXT = ("System: ", "[loopwarden] ")
# Google's status names for the HTTP statuses the proxy answers with itself.
_STATUS = {"loop_detected": "FAILED_PRECONDITION", "invalid_request_error": "INVALID_ARGUMENT",
           "not_found_error": "NOT_FOUND"}


def _parts(content: Any) -> list:
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def _call_ids(parts: list, key: str) -> list[str]:
    """Ids for the calls (or responses) among `parts`: their own, else the name and its ordinal in the turn,
    so a call and the response that answers it pair up as Gemini pairs them (by name, in order)."""
    ids = []
    seen: dict[str, int] = {}
    for part in parts:
        inner = part.get(key) if isinstance(part, dict) else None
        if not isinstance(inner, dict):
            continue
        name = inner.get("name") if isinstance(inner.get("name"), str) else ""
        own = inner.get("id")
        number = seen.get(name, 0)
        seen[name] = number + 1
        ids.append(own if isinstance(own, str) and own else f"{name}#{number}")
    return ids


def model_turn(parts: list) -> Message:
    """A `model` turn's parts as the assistant's message (its reasoning aside)."""
    text = []
    calls = []
    ids = iter(_call_ids(parts, "functionCall"))
    for part in parts:
        if not isinstance(part, dict):
            continue
        call = part.get("functionCall")
        if isinstance(call, dict):
            name = call.get("name")
            arguments = call.get("args")
            calls.append(ToolCall(next(ids), name if isinstance(name, str) else "",
                                  arguments_text(arguments if isinstance(arguments, dict) else {})))
        elif isinstance(part.get("text"), str) and part.get("thought") is not True:
            text.append(part["text"])
    return Message(ASSISTANT, "".join(text), tuple(calls))


def _thought_text(parts: list) -> str:
    """The reasoning among a model turn's parts (`thought: true` text parts)."""
    return "".join(p["text"] for p in parts
                   if isinstance(p, dict) and p.get("thought") is True and isinstance(p.get("text"), str))


def _result(response: Any) -> tuple[str, bool]:
    """A function response's text and whether it reports a failure (an `error` in its object)."""
    if not isinstance(response, dict):
        return arguments_text(response), False
    error = response.get("error")
    if error:
        return error if isinstance(error, str) else arguments_text(error), True
    if len(response) == 1:  # a text in a wrapper: `output`, or `result` as google-genai's automatic calling and ADK
        (key, text), = response.items()  # send a function's return value
        if key in ("output", "result") and isinstance(text, str):
            return text, False
    return arguments_text(response), False


def _read_user(index: int, parts: list, into: Messages) -> None:
    """A `user` turn's parts: tool results and a person's words, each anchored just past its part."""
    ids = iter(_call_ids(parts, "functionResponse"))
    person = False
    for position, part in enumerate(parts):
        if not isinstance(part, dict):
            continue
        anchor = Anchor(index, position + 1)
        answer = part.get("functionResponse")
        if isinstance(answer, dict):
            text, failed = _result(answer.get("response"))
            into.add(Message(TOOL, text, call_id=next(ids), failed=failed), anchor)
            person = False
        elif isinstance(part.get("text"), str):
            if part["text"].lstrip().startswith(_AGENT_TEXT):
                into.add(Message(SYSTEM, part["text"]), anchor)  # read by no rule, starts nothing
                person = False
            elif person:  # one person's words, in several parts
                into.messages[-1] = Message(USER, into.messages[-1].text + "\n" + part["text"])
                into.anchors[-1] = anchor
            else:
                into.add(Message(USER, part["text"]), anchor)
                person = True


def _system_text(instruction: Any) -> str:
    if isinstance(instruction, str):
        return instruction
    return "".join(p["text"] for p in _parts(instruction) if isinstance(p, dict) and isinstance(p.get("text"), str))


def _status(type_: str) -> str:
    return _STATUS.get(type_, "INTERNAL")


class GeminiDialect(DialectDefaults):
    name = "gemini"
    items_key = "contents"
    provider = "gcp.gemini"
    base_url_fix = "set GOOGLE_GEMINI_BASE_URL={base} without a version (the client adds /v1beta itself)"
    not_found_type = "not_found_error"
    # Its own routes, each decided per request (`route`): a model's methods under /v1beta/ or /v1/ (under
    # /v1/ only a `name:method` target, as OpenAI's /v1/models/{id} is the OpenAI upstream's), and any other
    # /v1beta/ path (the models list), relayed.
    paths = (*(f"/v1beta/{models}/{{target}}" for models in MODELS),
             *(f"/v1/{models}/{{target:[^/]*:[^/]*}}" for models in MODELS), "/v1beta/{tail:.*}")

    def route(self, method: str, match: Mapping[str, str]) -> Routed:
        """generateContent and streamGenerateContent are watched, any other method (`countTokens`,
        `embedContent`) relayed to this upstream; a target without a method to the upstream its headers claim.
        A method spelled with anything but letters (`generateContent%3B`) is refused: the upstream may read it
        as a watched one."""
        target = match.get("target")
        if target is None:
            return Routed(relay=self)
        verb = target.rpartition(":")[2] if ":" in target else ""
        if verb and not (verb.isascii() and verb.isalpha()):
            return Routed(refused=f"a Gemini method is letters only, got {verb[:60]!r}")
        if method == "POST" and verb in INSPECTED_METHODS:
            return Routed(inspect=True)
        return Routed(relay=self if ":" in target else None)

    @staticmethod
    def watches(path: str) -> bool:
        """Whether a path (slashes single, unquoted) is a watched call: `/v1beta/models/{model}:generateContent`."""
        _, version, models, target = (path.split("/", 3) + ["", "", ""])[:4]
        return version in VERSIONS and models in MODELS and target.rpartition(":")[2] in INSPECTED_METHODS

    @staticmethod
    def claims(headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
        return "x-goog-api-key" in headers or "key" in query

    @staticmethod
    def wrote(body: dict) -> bool:
        return isinstance(body.get("contents"), list)

    @staticmethod
    def upstream_url(settings, raw_path: str, raw_query: str) -> URL:
        """GEMINI_UPSTREAM_URL is the API's root (a trailing `/v1beta` or `/v1` is taken off: the path has it).
        With GEMINI_UPSTREAM_API_KEY, a `key` in the query is replaced too."""
        base = str(URL(settings.gemini_upstream_url)).rstrip("/").removesuffix("/v1beta").removesuffix("/v1")
        key = settings.gemini_upstream_api_key
        if key and raw_query and any(name == "key" for name, _ in parse_qsl(raw_query, keep_blank_values=True)):
            raw_query = urlencode([(name, key if name == "key" else value)
                                   for name, value in parse_qsl(raw_query, keep_blank_values=True)])
        return join_url(base, raw_path, raw_query)

    @staticmethod
    def upstream_key(settings) -> str | None:
        return settings.gemini_upstream_api_key

    @staticmethod
    def judge_call(question: JudgeQuestion, key: str, attempt: int) -> JudgeCall | None:
        """generateContent, asked for a JSON answer."""
        if attempt:
            return None
        body = {"systemInstruction": {"parts": [{"text": question.system}]},
                "contents": [{"role": "user", "parts": [{"text": question.shown}]}],
                "generationConfig": {"temperature": 0, "responseMimeType": "application/json"}}
        return JudgeCall(f"/v1beta/models/{quote(question.model, safe='')}:generateContent",
                         {"x-goog-api-key": key} if key else {}, body)

    @staticmethod
    def judge_reply(body: dict) -> tuple[str, int]:
        """The answer's text, its thought parts aside."""
        candidates = body.get("candidates")
        first = candidates[0] if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict) \
            else {}
        content = first.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        text = "".join(part["text"] for part in parts if isinstance(part, dict) and not part.get("thought")
                       and isinstance(part.get("text"), str)) if isinstance(parts, list) else ""
        return text, counted(body.get("usageMetadata"), "totalTokenCount") or 0

    @staticmethod
    def credentials(settings) -> Credentials | None:
        if settings.gemini_upstream_api_key:
            return _REPLACED, b"x-goog-api-key", settings.gemini_upstream_api_key.encode()
        return None

    @staticmethod
    def read(payload: dict, history: list[Message] | None = None, kept_call=None, before=None) -> Conversation:
        """Its system instruction, then its contents' parts as neutral messages (from the first one `before` did
        not read: `(items reused, the reading of the request they come from)`)."""
        contents = payload.get("contents")
        if contents is None:
            contents = []
        reused, reading = before if before is not None else (0, None)
        if not (isinstance(contents, list) and all(isinstance(c, dict) for c in contents[reused:])):
            raise RequestError("'contents' must be an array of objects")
        system = _system_text(payload.get("systemInstruction") or payload.get("system_instruction"))
        read, marks = resume(reading, reused, system)
        if not marks and system:
            read.add(Message(SYSTEM, system), Anchor(0))  # nothing is ever placed after the system prompt
        for index in range(len(marks), len(contents)):
            content = contents[index]
            if content.get("role") == "model":
                read.add(model_turn(_parts(content)), Anchor(index + 1))
            else:
                _read_user(index, _parts(content), read)
            marks.append(len(read.messages))
        return Conversation(read.messages, 0, read.anchors, ItemReading(system, read.messages, read.anchors, marks))

    @staticmethod
    def with_warnings(payload: dict, conversation: Conversation, warnings: list[tuple[int, str, str]]) -> dict:
        """The request with text parts inserted, each just past the parts of the neutral message before its
        place: inside the user turn that holds them, or as a user turn of its own after a model turn."""
        placed = [(place, {"text": text}) for place, _, text in warnings]
        return {**payload, "contents": insert_placed(
            payload.get("contents") or [], conversation, placed, parts_of=_parts, parts_key="parts",
            as_item=lambda part: {"role": "user", "parts": [part]})}

    @staticmethod
    def answer(body: dict) -> Message | None:
        candidates = body.get("candidates")
        if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
            return model_turn(_parts(candidates[0].get("content")))
        return None

    @staticmethod
    def reasoning(body: dict) -> str:
        candidates = body.get("candidates")
        if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
            return _thought_text(_parts(candidates[0].get("content")))
        return ""

    @staticmethod
    def recorded_reasoning(item: dict) -> str:
        return _thought_text(_parts(item)) if item.get("role") == "model" else ""

    @staticmethod
    def stream() -> "GeminiStream":
        return GeminiStream()

    @staticmethod
    def error_body(message: str, type_: str, code: str | None = None) -> bytes:
        """An error in Google's shape, which the google-genai SDKs raise as their ClientError."""
        return orjson.dumps({"error": {"code": 400, "message": message, "status": _status(type_), "details": [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": (code or type_).upper(),
             "domain": "loopwarden"}]}})

    @staticmethod
    def stream_error(message: str, type_: str, code: str | None = None) -> bytes:
        return sse({"error": {"code": 502, "message": message, "status": "UNAVAILABLE"}})

    summary_keys = ("responseId", "modelVersion", "usageMetadata")

    @staticmethod
    def tokens(usage: Any) -> tuple[int | None, int | None]:
        """The prompt's tokens; the answer's, its reasoning included (billed as output)."""
        return counted(usage, "promptTokenCount"), counted(usage, "candidatesTokenCount", "thoughtsTokenCount")

    @staticmethod
    def max_output_tokens(payload: dict) -> int | None:
        config = payload.get("generationConfig")
        return positive_int(config.get("maxOutputTokens")) if isinstance(config, dict) else None

    @staticmethod
    def model(payload: dict, raw_path: str) -> str | None:
        """The model is named in the path only: `…/models/{model}:{method}` (or `…/tunedModels/…`)."""
        model = unquote(raw_path.rpartition("/")[2].partition(":")[0])
        return model or None

    @staticmethod
    def is_side_request(payload: dict) -> bool:
        """An agent's check of its own (Gemini CLI's next-speaker check, its task router): a structured answer
        asked for, no tools offered."""
        config = payload.get("generationConfig")
        structured = isinstance(config, dict) and (
            config.get("responseMimeType") == "application/json" or "responseJsonSchema" in config
            or "responseSchema" in config)
        return structured and not payload.get("tools")


class GeminiStream:
    """Follows the chunks of a streamed answer: the text as it streams (the reasoning apart), calls as they come
    (each arrives whole in one chunk), the finished turn; and ends a stream the proxy cuts the way a finished
    answer ends. The stop reached mid-stream ends as a cut does, and the next request is refused."""

    stop_is_cut = True

    def __init__(self) -> None:
        self._parts: list[dict] = []
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self.last_reasoning = ""
        self.finished = False
        self.response_id: str | None = None
        self.model: str | None = None
        self.usage: dict | None = None

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def reasoning_text(self) -> str:
        return "".join(self._reasoning)

    def add(self, data: dict, event: str | None = None) -> tuple[str, bool]:
        """Take one chunk; return its new text and whether a tool call came (its `thought` parts' text is left
        in `last_reasoning`)."""
        self.last_reasoning = ""
        if self.response_id is None and isinstance(data.get("responseId"), str):
            self.response_id = data["responseId"]
        if isinstance(data.get("modelVersion"), str):
            self.model = data["modelVersion"]
        if isinstance(data.get("usageMetadata"), dict):
            self.usage = data["usageMetadata"]
        candidates = data.get("candidates")
        if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
            return "", False
        candidate = candidates[0]
        text = ""
        called = False
        for part in _parts(candidate.get("content")):
            if not isinstance(part, dict):
                continue
            self._parts.append(part)
            if isinstance(part.get("functionCall"), dict):
                called = True
            elif isinstance(part.get("text"), str) and part.get("thought") is True:
                self._reasoning.append(part["text"])
                self.last_reasoning += part["text"]
            elif isinstance(part.get("text"), str):
                self._text.append(part["text"])
                text += part["text"]
        if candidate.get("finishReason"):
            self.finished = True
        return text, called

    def message(self) -> Message:
        return model_turn(self._parts)

    def cut_ending(self, marker: dict, notice: str | None) -> bytes:
        """A last chunk: the notice as a text part, `finishReason: STOP`, and the proxy's marker beside the
        candidates."""
        chunk: dict[str, Any] = {"candidates": [{"content": {"role": "model", "parts": [{"text": notice or ""}]},
                                                 "finishReason": "STOP", "index": 0}]}
        if self.usage is not None:
            chunk["usageMetadata"] = self.usage
        if self.model is not None:
            chunk["modelVersion"] = self.model
        if self.response_id is not None:
            chunk["responseId"] = self.response_id
        chunk["loopwarden"] = marker
        return sse(chunk)

    def stop_ending(self, error: dict) -> bytes:  # never used: the stop ends as a cut does
        return self.cut_ending({"loop": "stop"}, error.get("message"))
