"""`loopwarden replay`: what loopwarden would have done on recorded conversations.

Each record is one conversation, replayed as the proxy would have seen it: one request per assistant turn
(the messages before it), the assistant's turn as that request's answer, and the request after the last
turn (also when the record ends with that turn: it gets the episodes the turn completes). A message holding
several calls is several steps: after each of its calls but the last, a request with the message holding the
calls so far and their results (as an agent that appends each step's call to one message sends them). A record
cannot tell that agent from a model answering once with several calls; for the latter, a live proxy sees the
calls at once, and where they complete the stop, it logs only the stop. The same engine
folds each request; what is logged follows observe mode's rules (a warning when a request would first carry
it, a stop once, a chant where a streamed answer would have been cut, nothing after a task's stop), so replay
and a live proxy in observe mode find the same episodes. The reasoning a recorded assistant turn carries (chat
`reasoning_content` or `reasoning`, Messages thinking blocks, Gemini thought parts, Responses reasoning items) is
read as the proxy read it when the answer came: before the turn's text, cut where it chants in a streamed
answer, and remembered for the next requests in a whole one.
No I/O but reading the files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import orjson

from proxy.conversation import ASSISTANT, TOOL, Conversation, Message, from_record, model_text
from proxy.detect.actions import Action
from proxy.detect.engine import (
    Decision,
    DetectConfig,
    Episode,
    ResponseWatcher,
    TaskState,
    UnseenChant,
    analyze,
    answer_action,
    episodes,
    fingerprints_of,
    late_episodes,
)
from proxy.detect.speakers import own_reply
from proxy.inspection import UNSEEN_PER_SESSION
from proxy.wire import OPENAI, recorded_dialect
from proxy.wire.dialect import Dialect, RequestError


@dataclass
class Record:
    source: str  # FILE:LINE
    messages: list[Message]
    streamed: bool  # the answers were streamed: a chant would have been cut as it came
    model: str | None = None  # for the model's policy
    reasoning: dict[int, str] = field(default_factory=dict)  # by an assistant message's index: its reasoning


@dataclass
class Replayed:
    source: str
    turns: int
    episodes: list[dict] = field(default_factory=list)

    @property
    def stopped_at(self) -> int | None:
        return next((e["turn"] for e in self.episodes if e["action"] == Action.STOPPED), None)


def _record(value: object, source: str) -> Record:
    if isinstance(value, list):
        if value and all(isinstance(m, dict) and "role" in m for m in value):
            reasoning = {index: OPENAI.recorded_reasoning(m) for index, m in enumerate(value)}
            return Record(source, [from_record(m) for m in value], False,
                          reasoning={index: text for index, text in reasoning.items() if text})
        raise RequestError("a list must hold the conversation's messages (objects with a role)")
    if not isinstance(value, dict):
        raise RequestError("expected a request body (`messages` or `input`) or a list of messages")
    dialect = recorded_dialect(value)
    if dialect is None:
        raise RequestError("neither `messages` (chat completions, Messages) nor `input` (Responses) in this record")
    streamed = value.get("stream") is True
    model = value.get("model") if isinstance(value.get("model"), str) else None
    conversation = dialect.read(value)
    return Record(source, conversation.messages, streamed, model, _reasoning_by_turn(dialect, value, conversation))


def _reasoning_by_turn(dialect: Dialect, value: dict, conversation: Conversation) -> dict[int, str]:
    """The reasoning each recorded assistant turn carries, by its message's index: what the items read into that
    message (those after the message before it) hold."""
    items = value.get(dialect.items_key)
    if not isinstance(items, list):
        return {}
    found: dict[int, str] = {}
    messages, anchors, own = conversation.messages, conversation.anchors, conversation.own_start
    start = 0
    for index in range(own, len(messages)):
        end = anchors[index - own].item if anchors is not None else index - own + 1  # past its items
        if messages[index].role == ASSISTANT:
            text = "".join(dialect.recorded_reasoning(item) for item in items[start:end] if isinstance(item, dict))
            if text:
                found[index] = text
        start = max(start, end)
    return found


def _files(paths: list[str]) -> Iterator[Path]:
    for name in paths:
        path = Path(name)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
        else:
            yield path


def read_records(paths: list[str]) -> tuple[list[Record], list[dict]]:
    """Every readable record; every unreadable one as {"source", "message"}, the rest still read."""
    records: list[Record] = []
    errors: list[dict] = []
    for path in _files(paths):
        try:
            data = path.read_bytes()
        except OSError as exc:
            errors.append({"source": str(path), "message": exc.strerror or str(exc)})
            continue
        if path.suffix == ".jsonl":
            lines = [(n, line) for n, line in enumerate(data.splitlines(), start=1) if line.strip()]
        else:
            lines = [(1, data)]
        for number, line in lines:
            source = f"{path}:{number}"
            try:
                records.append(_record(orjson.loads(line), source))
            except orjson.JSONDecodeError as exc:
                errors.append({"source": source, "message": f"not valid JSON: {exc}"})
            except RequestError as exc:
                errors.append({"source": source, "message": str(exc)})
    return records, errors


def _entry(episode: Episode, action: Action) -> dict:
    return {"turn": episode.turn, "type": episode.type, "action": action.value, "episode": episode.number,
            "episode_limit": episode.limit, "detail": episode.detail}


def replay(config: DetectConfig, record: Record) -> Replayed:
    """The episodes a proxy in observe mode would have logged for this conversation, in order."""
    messages = record.messages
    # (An `Ok.` the agent recorded itself after its own note is no turn: no request ends before it.)
    turns = [i for i, m in enumerate(messages) if m.role == ASSISTANT and not own_reply(messages, i)]
    # Every request the agent sent, and the next one, which carries the last turn (a record may end with it).
    ends = turns + [len(messages)]
    result = Replayed(record.source, len(turns))
    logged: set[tuple] = set()
    cache = None
    fingerprints = fingerprints_of(messages)  # once: every request is a prefix of the record
    unseen: list[UnseenChant] = []  # chants in whole answers' reasoning, as the proxy remembers them

    def log(task: str, episode: Episode, action: Action | None) -> None:
        key = (task, episode.message_index, episode.step)
        if key in logged or action is None or episode.after_stop:  # nothing after the stop
            return
        logged.add(key)
        result.episodes.append(_entry(episode, action))

    for end in ends:
        request = messages[:end]
        state, cache = analyze(config, request, 0, cache, fingerprints[:end])
        decision = Decision(episodes(config, state, unseen=unseen))
        if state.ended is not None:  # what the task a person's message just ended found too late
            for episode in late_episodes(config, state, unseen=unseen):
                log(state.ended.key, episode, Action.LATE)
        for episode, action in decision.logged():  # as the proxy logs the request
            log(state.key, episode, action)
        if end < len(messages) and len(messages[end].calls) > 1:
            # Several calls in one message are steps: an agent that keeps one assistant message and appends
            # each step's call to it sent a request after each, the message holding the calls so far.
            for steps in range(1, len(messages[end].calls)):
                partial = _after_steps(messages, end, steps)
                # The fold advances the state it is given: this request's fold goes on from a copy.
                after, _ = analyze(config, partial, 0, replace(cache, state=cache.state.clone()))
                for episode, action in Decision(episodes(config, after, unseen=unseen)).logged():
                    log(after.key, episode, action)
        if end < len(messages):  # the answer to this request, as the proxy read it
            found = _read_answer(config, record, state, decision, end, unseen)
            if found is not None:
                log(state.key, found, answer_action(found))
    return result


def _read_answer(config: DetectConfig, record: Record, state: TaskState, decision: Decision, at: int,
                 unseen: list[UnseenChant]) -> Episode | None:
    """The assistant's turn at `at` as the proxy read it when it came. Streamed: its reasoning, then its text, and
    the episode where the stream would have been cut. Whole: a chant in its reasoning, remembered as the proxy
    remembers it for the session's next requests (`unseen`)."""
    message = record.messages[at]
    reasoning = record.reasoning.get(at, "")
    if not (record.streamed or reasoning):
        return None
    watcher = ResponseWatcher(config, state.clone(), decision, at, False)
    if not record.streamed:
        found = watcher.reasoning(reasoning)
        if found is not None:
            unseen[:] = [*unseen[-(UNSEEN_PER_SESSION - 1):], watcher.unseen(found, message)]
        return None
    found = watcher.reasoning(reasoning) if reasoning else None
    text = model_text(message)[0]
    if found is None and text:
        found = watcher.text(text)
    if found is None and message.calls:
        found = watcher.tool_call_started()  # a call ends the text before it, as it streams in
    return found


def _after_steps(messages: list[Message], at: int, steps: int) -> list[Message]:
    """The request after the first `steps` calls of the assistant message at `at`: the message holding only
    those calls, and their results."""
    message = messages[at]
    calls = message.calls[:steps]
    ids = {call.id for call in calls}
    results = []
    j = at + 1
    while j < len(messages) and messages[j].role == TOOL:
        if messages[j].call_id in ids:
            results.append(messages[j])
        j += 1
    return messages[:at] + [message._replace(calls=calls)] + results


def summary(replayed: list[Replayed], errors: list[dict]) -> dict:
    by_type: dict[str, int] = {}
    by_action: dict[str, int] = {}
    for conversation in replayed:
        for episode in conversation.episodes:
            by_type[episode["type"]] = by_type.get(episode["type"], 0) + 1
            by_action[episode["action"]] = by_action.get(episode["action"], 0) + 1
    stopped = [c for c in replayed if c.stopped_at is not None]
    return {
        "conversations": len(replayed), "unreadable": len(errors),
        "with_episodes": sum(1 for c in replayed if c.episodes), "detections": sum(by_type.values()),
        "by_type": by_type, "by_action": by_action, "would_stop": len(stopped),
        # The turns the recorded agents went on for after the point where loopwarden would have stopped them.
        "turns_saved": sum(c.turns - c.stopped_at for c in stopped),
    }
