"""Engines and migrations, for SQLite (aiosqlite) and PostgreSQL (asyncpg)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
log = logging.getLogger("loopwarden.store")


class DatabaseUnavailable(RuntimeError):
    """The database cannot be reached; the message says which one and why."""


def dialect_insert(dialect: str, table):
    """An INSERT that can take ON CONFLICT clauses, for the dialect in use."""
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def safe_url(database_url: str) -> str:
    try:
        return make_url(database_url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<invalid database URL>"


def describe(database_url: str) -> str:
    """Where the log is, as a person looks for it: a SQLite file's absolute path, else the URL (no password)."""
    try:
        url = make_url(database_url)
    except ArgumentError:
        return "<invalid database URL>"
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        return f"SQLite {Path(url.database).resolve()}"
    return safe_url(database_url)


def sqlite_pragmas(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # WAL lets the CLI read while the proxy writes. It persists in the file: set only when missing,
        # as setting it again can fail at once (no busy wait) while another connection writes.
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode")
        if cursor.fetchone()[0].lower() != "wal":
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()


def create_engine(database_url: str) -> AsyncEngine:
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        engine = create_async_engine(url, connect_args={"timeout": 30})
        sqlite_pragmas(engine)
        return engine
    return create_async_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5,
                               connect_args={"timeout": 10})


def describe_failure(database_url: str, exc: BaseException) -> DatabaseUnavailable:
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return DatabaseUnavailable(
        f"cannot use the database {safe_url(database_url)}: {reason[0] if reason else type(exc).__name__}"
    )


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def run_migrations(database_url: str, revision: str = "head") -> None:
    """Bring the schema to `revision`; applying it twice changes nothing."""
    try:
        command.upgrade(alembic_config(database_url), revision)
    except Exception as exc:
        raise describe_failure(database_url, exc) from exc


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


async def ping(engine: AsyncEngine, timeout: float = 2.0) -> bool:
    try:
        async with asyncio.timeout(timeout):
            async with engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        return True
    except Exception:
        return False
