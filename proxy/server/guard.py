"""The guard: the inspection step and its collaborators, put together for one process.

The inspection step (`proxy/inspection.py`) decides; the collaborators here do the I/O it needs: the store
behind the facts it reads, the episode log, the judge scheduler and the chain of responses the service keeps.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Awaitable, Mapping

from proxy.config import Settings
from proxy.conversation import Chain
from proxy.detect.judge_policy import judge_window
from proxy.inspection import Inspector, JudgeDue, client_key, tenant_of
from proxy.judge import JUDGE_HEADER, JUDGE_TOKEN, Judge, Question
from proxy.server.alerts import Alerts
from proxy.server.episodes import EpisodeLog
from proxy.wire import judge_route
from proxy.wire.dialect import Dialect
from proxy.wire.known import KnownBodies

log = logging.getLogger("loopwarden.guard")


class ResponseChain:
    """Conversations the service keeps (Responses' `previous_response_id`, `conversation`): what a request
    continues, read from the responses any replica relayed; and, for an answer the service keeps, its record
    (`keep`), written before the bytes that complete it reach the client (`before_last_byte`), so a chained
    request reaching another replica at once finds it."""

    def __init__(self, store) -> None:
        self.store = store

    def load(self, headers: Mapping[str, str], payload: dict, dialect: Dialect) -> Awaitable[Chain | None] | None:
        """What the request continues, to be awaited; None when it continues nothing (most requests: nothing
        to wait for). Never fails the request."""
        previous, conversation = dialect.chain_ids(payload)
        if self.store is None or (previous is None and conversation is None) or is_judge(headers):
            return None
        return self.store.chain(tenant_of(client_key(headers)), previous, conversation)

    def keep(self, tenant, response_id, previous, conversation_id, session_id, messages) -> None:
        self.store.record_response(tenant, response_id, previous, conversation_id, session_id, messages)

    async def before_last_byte(self) -> None:
        await self.store.persist()


class JudgeScheduler:
    """Judge checks in the background, one in flight per session; a failing judge never breaks a request."""

    def __init__(self, settings: Settings, judge: Judge, store, metrics, confirm: bool) -> None:
        self.settings = settings
        self.judge = judge
        self.store = store
        self.metrics = metrics
        self.confirm = confirm
        self._running: dict[tuple[str, str], asyncio.Task] = {}

    def start(self, due: JudgeDue, dialect: Dialect) -> None:
        if due.key in self._running:
            return
        task = asyncio.get_running_loop().create_task(self._check(due, dialect))
        self._running[due.key] = task

    async def _check(self, due: JudgeDue, dialect: Dialect) -> None:
        try:
            request, window = judge_window(due.messages, due.task_start)
            model = self.settings.judge_model or due.context.model
            check, tokens = await self.judge.check(judge_route(self.settings, dialect),
                                                   Question(due.task, due.turn, due.client_key, request, window),
                                                   model, self.settings.judge_confirm_model)
            self.store.record_judge_check(due.context.tenant, due.context.session_id, check, model, tokens)
            if self.metrics is not None:
                outcome = "none" if check.confidence is None else \
                    "loop" if check.is_loop(self.confirm) else "progress"
                self.metrics.judge_checks.labels(outcome).inc()
                self.metrics.judge_tokens.inc(tokens)
        except Exception:  # a background check: what fails is logged here, never left to the loop
            log.exception("judge check for session %s failed", due.context.session_id)
        finally:
            self._running.pop(due.key, None)

    async def stop(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        await self.judge.close()


def is_judge(headers: Mapping[str, str]) -> bool:
    """This process's judge's own requests (when JUDGE_URL points back at the proxy): never inspected, never a
    session's turn. A client sending the header without this process's token is inspected like any other."""
    value = headers.get(JUDGE_HEADER)  # whether it is sent at all is no secret: only its value is compared
    return value is not None and secrets.compare_digest(value.encode(), JUDGE_TOKEN.encode())


class Guard:
    """Per-process detection: the inspector and its collaborators, started and stopped with the app."""

    def __init__(self, settings: Settings, store=None, metrics=None) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.alerts = Alerts(settings.webhook_url, settings.webhook_events, settings.public_url, metrics) \
            if settings.webhook_url else None
        self.episodes = EpisodeLog(store, metrics, self.alerts, settings.capture_flagged)
        self.chain = ResponseChain(store)
        self.bodies = KnownBodies()  # each long conversation's last body: the next is parsed from where it differs
        judge = Judge(settings.judge_timeout, settings.judge_concurrency) \
            if settings.judge_asked() and store is not None else None
        self.inspector = Inspector(settings, store, judging=judge is not None,
                                   keep=self.chain.keep if store is not None else None, is_judge=is_judge)
        self.judges = JudgeScheduler(settings, judge, store, metrics, self.inspector.config.judge_confirm) \
            if judge is not None else None
        if self.alerts is not None:
            self.alerts.resume_url = self.inspector.resume_url

    async def start(self) -> None:
        if self.store is not None:
            await self.store.start()
        if self.alerts is not None:
            await self.alerts.start()
        self.episodes.start()

    async def stop(self) -> None:
        if self.judges is not None:
            await self.judges.stop()
        if self.store is not None:  # first: the last records written may still raise alerts
            await self.store.close(min(self.settings.shutdown_grace, 5.0))
        if self.alerts is not None:
            await asyncio.sleep(0)  # the alerts of the last batch written are queued on this loop's next turn
            await self.alerts.close(min(self.settings.shutdown_grace, 5.0))

    async def before_last_byte(self) -> None:
        """The hook run before the bytes that complete an answer the service keeps go out: what was kept of it
        is written, so the request that continues it finds it on any replica."""
        await self.chain.before_last_byte()

    async def ready(self) -> bool:
        return True if self.store is None else await self.store.ready()

    def known_message_counts(self) -> dict:
        return self.inspector.known_message_counts()

    def caches(self) -> dict:
        """The memories bounded in bytes, by name: each has `held`, the bytes it holds as its bound counts them."""
        return {"request_bodies": self.bodies, **self.inspector.caches(),
                **(self.store.caches() if self.store is not None else {})}
