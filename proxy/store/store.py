"""The store as the proxy uses it: the writer, and the stored facts a verdict needs, kept in memory.

Verdicts need three facts that are not in the conversation: operator disables,
operator resets and judge answers. They are stored, and every replica keeps a
copy in memory refreshed by a poll, so the request path never waits on the
database. A change made through this replica applies to its next request at
once; through another replica, within POLL_EVERY seconds.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.detect.judge_policy import JudgeCheck
from proxy.store.database import create_engine, ping
from proxy.store.models import JudgeCheckRow, SessionRow
from proxy.store.writer import LogWriter, utcnow

log = logging.getLogger("loopwarden.store")
POLL_EVERY = 1.0


@dataclass(frozen=True)
class Controls:
    disabled: bool = False
    reset_at_message: int = 0


NO_CONTROLS = Controls()


class Store:
    def __init__(self, database_url: str, buffer_size: int = 10_000, on_drop=None) -> None:
        self.database_url = database_url
        self.engine: AsyncEngine = create_engine(database_url)
        self.writer = LogWriter(self.engine, buffer_size, on_drop=on_drop)
        self._controls: dict[tuple[str, str], Controls] = {}
        self._checks: dict[tuple[str, str], dict[tuple[str, int], JudgeCheck]] = {}
        self._controls_seen: datetime | None = None
        self._checks_seen = 0
        self._poller: asyncio.Task | None = None

    async def start(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:  # the proxy serves without the database; the poll catches up
            log.warning("database not reachable at start, serving anyway: %s", str(exc).splitlines()[0])
        self.writer.start()
        self._poller = asyncio.get_running_loop().create_task(self._poll(), name="loopwarden-controls-poll")

    async def close(self, timeout: float = 5.0) -> None:
        if self._poller is not None:
            self._poller.cancel()
            try:
                await self._poller
            except asyncio.CancelledError:
                pass
        await self.writer.close(timeout)
        await self.engine.dispose()

    async def ready(self) -> bool:
        return await ping(self.engine)

    # -- the request path: memory only ------------------------------------------------------------------------

    def controls(self, tenant: str, session_id: str) -> Controls:
        return self._controls.get((tenant, session_id), NO_CONTROLS)

    def judge_checks(self, tenant: str, session_id: str, task: str) -> list[JudgeCheck]:
        checks = self._checks.get((tenant, session_id))
        if not checks:
            return []
        return sorted((c for c in checks.values() if c.task == task), key=lambda c: c.turn)

    def record_judge_check(self, tenant: str, session_id: str, check: JudgeCheck, model: str | None,
                           tokens: int) -> None:
        self._remember_check(tenant, session_id, check)
        self.writer.add_judge_check({
            "created_at": utcnow(), "tenant": tenant, "session_id": session_id, "task": check.task,
            "turn": check.turn, "confidence": check.confidence, "confirm_confidence": check.confirm_confidence,
            "analysis": check.analysis, "model": model, "tokens": tokens,
        })

    def _remember_check(self, tenant: str, session_id: str, check: JudgeCheck) -> None:
        self._checks.setdefault((tenant, session_id), {})[(check.task, check.turn)] = check

    # -- operator controls: awaited, off the request path -------------------------------------------------------

    async def set_controls(self, session_id: str, tenant: str | None, *, disabled: bool | None = None,
                           reset: bool = False, known_counts: dict | None = None) -> list[dict]:
        """Disable/enable or reset a session (every tenant's, when tenant is None). Returns what changed."""
        await self.writer.flush()  # sessions this replica saw but has not written yet
        now = utcnow()
        conditions = [SessionRow.session_id == session_id]
        if tenant is not None:
            conditions.append(SessionRow.tenant == tenant)
        async with self.engine.begin() as connection:
            rows = (await connection.execute(select(SessionRow).where(*conditions))).all()
            targets = {(row.tenant, row.session_id): row for row in rows}
            changed = []
            for key, row in targets.items():
                values: dict = {"controls_changed_at": now}
                if disabled is not None:
                    values["disabled"] = disabled
                if reset:
                    # Everything the session has sent so far is forgiven: a fresh task from here.
                    count = max(row.message_count, (known_counts or {}).get(key, 0))
                    values["reset_at_message"] = count
                await connection.execute(update(SessionRow).where(SessionRow.tenant == key[0],
                                                                  SessionRow.session_id == key[1]).values(**values))
                merged = Controls(values.get("disabled", row.disabled),
                                  values.get("reset_at_message", row.reset_at_message))
                self._controls[key] = merged
                changed.append({"tenant": key[0], "session_id": key[1], "disabled": merged.disabled,
                                "reset_at_message": merged.reset_at_message})
        return changed

    # -- keeping the memory fresh -----------------------------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_EVERY)
            try:
                await self.refresh()
            except Exception as exc:
                log.debug("controls poll failed: %s", exc)

    async def refresh(self) -> None:
        async with self.engine.connect() as connection:
            statement = select(SessionRow.tenant, SessionRow.session_id, SessionRow.disabled,
                               SessionRow.reset_at_message, SessionRow.controls_changed_at)
            if self._controls_seen is None:
                statement = statement.where(SessionRow.controls_changed_at.is_not(None))
            else:
                statement = statement.where(SessionRow.controls_changed_at >= self._controls_seen)
            for row in (await connection.execute(statement)).all():
                self._controls[(row.tenant, row.session_id)] = Controls(row.disabled, row.reset_at_message)
                if self._controls_seen is None or row.controls_changed_at > self._controls_seen:
                    self._controls_seen = row.controls_changed_at
            checks = (await connection.execute(
                select(JudgeCheckRow).where(JudgeCheckRow.id > self._checks_seen).order_by(JudgeCheckRow.id)
            )).all()
            for row in checks:
                self._remember_check(row.tenant, row.session_id, JudgeCheck(
                    row.task, row.turn, row.confidence, row.confirm_confidence, row.analysis or ""))
                self._checks_seen = row.id

