"""Alerts: each stop (with WEBHOOK_EVENTS=all, each warning and cut too) POSTed as JSON to WEBHOOK_URL, once per
episode, in the background. A bounded queue and one sender: a slow or failing hook never delays or fails a
request; what could not be sent is retried, then counted."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable
from urllib.parse import quote

import aiohttp
import orjson

from proxy.detect.evidence import from_logged, strength_of
from proxy.detect.ladder import shown
from proxy.detect.actions import Action

log = logging.getLogger("loopwarden.alerts")

QUEUE_SIZE = 1000
ATTEMPTS = 4  # the first try and three retries, RETRY_DELAY × 1, 2 and 4 apart
RETRY_DELAY = 1.0
TIMEOUT = 10.0


def _slack(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def alert_payload(record: dict, public_url: str | None, resume_url: str | None = None) -> dict:
    """What a hook receives for one logged episode (a detection record), with a line a chat app shows; a stop's
    carries the link that lets the session go on."""
    detail = record["detail"] or {}
    found = from_logged(record["type"], detail)
    evidence = found.gist() if found is not None else ""
    tool = getattr(found, "tool", None)
    what = f"`{tool}`" if tool else record["type"]
    link = f"{public_url.rstrip('/')}/loopwarden/#open={quote(record['session_id'], safe='')}" if public_url else None
    episode = shown(record["episode"], record["episode_limit"], record["action"] == Action.STOPPED)
    strength = strength_of(record["type"], detail)
    observed = "" if record["enforced"] else " (observe mode: nothing changed)"
    # Slack reads `<...>` as markup (`<!here>` pings a channel, `<url|text>` is a link): a client's words are
    # escaped, as Slack asks, so they show as typed.
    # The detection's id, once the log has it: what `loopwarden mark ID` and the page's buttons take.
    detection = record.get("id")
    numbered = f"detection {detection}, " if detection is not None else ""
    did = f"found, too late to act on, a {record['type']} loop" if record["action"] == Action.LATE else \
        f"{record['action']} a {record['type']} loop"
    text = (f"loopwarden {did} ({_slack(what)}, {numbered}episode {episode}, "
            f"turn {record['turn']}) in session {_slack(record['session_id'])}{observed}"
            + (f": {_slack(evidence)}" if evidence else "") + (f" ({strength} evidence)" if strength else "")
            + (f" — {link}" if link else "")
            + (f" — to let it go on: {resume_url}" if resume_url else ""))
    return {"event": f"loop.{record['action']}", "detection_id": detection, "session_id": record["session_id"],
            "tenant": record["tenant"],
            "model": record["model"], "type": record["type"], "action": record["action"], "episode": episode,
            "turn": record["turn"], "evidence": evidence, "strength": strength, "api": detail.get("api"),
            "tokens_saved_estimate": record["tokens_saved_estimate"], "enforced": record["enforced"],
            "created_at": record["created_at"].isoformat(), "url": link, "resume_url": resume_url, "text": text}


class Alerts:
    def __init__(self, url: str, events: str, public_url: str | None, metrics=None) -> None:
        self.url = url
        self.actions = frozenset(Action) if events == "all" else frozenset({Action.STOPPED})
        self.public_url = public_url
        self.metrics = metrics
        self._queue: asyncio.Queue[dict] = asyncio.Queue(QUEUE_SIZE)
        self._sender: asyncio.Task | None = None
        self._http: aiohttp.ClientSession | None = None
        # The resume link a stop named: (tenant, session, task) -> its URL, or None (the guard sets it)
        self.resume_url: Callable[[str, str, str], str | None] = lambda tenant, session, task: None

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.webhook_deliveries.labels(outcome).inc()

    def episode(self, record: dict) -> None:
        """A detection was logged: queue its alert if its action is wanted. Never blocks, never raises."""
        if record["action"] not in self.actions:
            return
        try:
            resume = self.resume_url(record["tenant"], record["session_id"], record["task"]) \
                if record["action"] == Action.STOPPED and record["enforced"] else None
            self._queue.put_nowait(alert_payload(record, self.public_url, resume))
        except asyncio.QueueFull:
            log.warning("webhook queue full: an alert for session %s was dropped", record["session_id"])
            self._count("dropped")

    async def start(self) -> None:
        # trust_env: through the environment's forward proxy (HTTPS_PROXY, NO_PROXY), as the upstream's requests go
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT), trust_env=True)
        self._sender = asyncio.get_running_loop().create_task(self._send_all())

    async def close(self, grace: float) -> None:
        """Send what is queued within `grace` seconds, then stop."""
        if self._sender is None:
            return
        try:
            async with asyncio.timeout(grace):
                await self._queue.join()
        except TimeoutError:
            log.warning("webhook: %d alerts unsent at shutdown", self._queue.qsize())
        self._sender.cancel()
        await asyncio.gather(self._sender, return_exceptions=True)
        await self._http.close()

    async def _send_all(self) -> None:
        while True:
            payload = await self._queue.get()
            try:
                self._count("sent" if await self._deliver(payload) else "failed")
            finally:
                self._queue.task_done()

    async def _deliver(self, payload: dict) -> bool:
        body = orjson.dumps(payload)
        for attempt in range(ATTEMPTS):
            if attempt:
                await asyncio.sleep(RETRY_DELAY * 2 ** (attempt - 1))
            try:
                async with self._http.post(self.url, data=body, headers={"Content-Type": "application/json"}) as answer:
                    if answer.status < 300:
                        return True
                    if 400 <= answer.status < 500 and answer.status not in (408, 429):
                        log.warning("webhook refused an alert: HTTP %d", answer.status)
                        return False  # the hook will not take it however often it is sent
                    log.info("webhook answered HTTP %d (try %d of %d)", answer.status, attempt + 1, ATTEMPTS)
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.info("webhook unreachable (try %d of %d): %s", attempt + 1, ATTEMPTS, exc or type(exc).__name__)
        log.warning("webhook: an alert for session %s could not be sent", payload["session_id"])
        return False
