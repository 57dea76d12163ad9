"""The episode log, an add-on of each watched request: each episode it serves becomes one typed record, handed
to the log writer, metrics and the request's trace; alerts follow the log's first insert of an episode, so
"once per episode" holds across replicas and for a client re-sending a refused request."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass
from datetime import datetime

from proxy.detect.actions import Action
from proxy.detect.engine import Episode
from proxy.detect.normalize import digest
from proxy.inspection import Context
from proxy.lru import LRU
from proxy.server.addons import Addon, Exchange, Served
from proxy.server.telemetry import Telemetry
from proxy.store.writer import utcnow

log = logging.getLogger("loopwarden.guard")

REMEMBERED_EPISODES = 100_000


@dataclass(frozen=True)
class EpisodeRecord:
    """One episode served: a row of the detection log."""

    created_at: datetime
    session_id: str
    tenant: str
    task: str
    model: str | None
    type: str
    action: Action
    episode: int
    episode_limit: int
    turn: int
    detail: dict
    request_id: str | None
    tokens_saved_estimate: int
    enforced: bool
    episode_key: str  # the same episode served again (a resent request, another replica) has the same key


def episode_key(context: Context, episode: Episode, served_by: str | None = None) -> str:
    """The episode's place in this run of the task (a resent request finds the same key; a rerun has other call
    ids, so another task); a cut also names the response it cut, as a text-only rerun can repeat the same
    conversation word for word."""
    return digest(f"{context.tenant}\x00{context.session_id}\x00{context.task}\x00"
                  f"{episode.message_index}\x00{episode.step}\x00{served_by or ''}").hex()


class EpisodeLog(Addon):
    """The add-on that logs the episodes a request serves: one record per episode, and only one per process;
    the log's unique key makes it one across processes."""

    def __init__(self, store=None, metrics=None, alerts=None, capture: bool = False) -> None:
        self.store = store
        self.metrics = metrics
        self.alerts = alerts
        self.capture = capture and store is not None  # CAPTURE_FLAGGED: the request kept with its detection
        self._logged: LRU = LRU(REMEMBERED_EPISODES)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Alerts are sent from this loop, for the episodes the log writer inserted first."""
        self._loop = asyncio.get_running_loop()
        if self.store is not None and self.alerts is not None:
            self.store.writer.on_inserted = self._inserted

    def _inserted(self, records: list[dict]) -> None:
        """On the writer's thread: the detections it inserted first. Their alerts go out from the proxy's loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._alert, records)
        except RuntimeError:  # the proxy's loop has just closed
            pass

    def _alert(self, records: list[dict]) -> None:
        for record in records:
            self.alerts.episode(record)

    def episode(self, exchange: Exchange, served: Served) -> None:
        context, episode, action = served.context, served.episode, served.action
        key = episode_key(context, episode, served.served_by)
        if key in self._logged:
            return
        self._logged.put(key, True)
        log.info("loop %s%s in session %s: %s episode %d/%d", action, "" if context.enforced else " (observed)",
                 context.session_id, episode.type, episode.number, episode.limit)
        if self.metrics is not None:
            self.metrics.detections.labels(episode.type, action, "enforce" if context.enforced else "observe").inc()
        record = EpisodeRecord(utcnow(), context.session_id, context.tenant, context.task, context.model,
                               episode.type, action, episode.number, episode.limit, episode.turn,
                               {**episode.detail, "api": context.api}, served.request_id, served.tokens_saved,
                               context.enforced, key)
        values = asdict(record)
        if exchange.span is not None:
            Telemetry.episode(exchange.span, episode, action, context.enforced, key)
        if self.store is not None:
            self.store.writer.add_detection(values)
            if self.capture and action in (Action.WARNED, Action.STOPPED) and exchange.raw:
                # The request that carried the warning, or was refused: its body only, never a header.
                self.store.writer.add_capture({
                    "episode_key": key, "created_at": record.created_at, "tenant": context.tenant,
                    "session_id": context.session_id, "dialect": exchange.dialect.name, "path": exchange.raw_path,
                    "body": exchange.raw})
        elif self.alerts is not None:  # no log to follow: alert at once
            self.alerts.episode(values)

    def recovery(self, exchange: Exchange, context: Context, episode: Episode) -> None:
        """The model answered a request carrying this warning without completing another episode."""
        key = "recovered:" + episode_key(context, episode)
        if key in self._logged:
            return
        self._logged.put(key, True)
        if self.store is not None:
            self.store.writer.add_recovery({"b_tenant": context.tenant, "b_session_id": context.session_id,
                                            "b_task": context.task, "b_episode": episode.number})
