"""Engines and migrations."""

from __future__ import annotations


class DatabaseUnavailable(RuntimeError):
    """The database cannot be reached; the message says which one and why."""


def run_migrations(database_url: str) -> None:
    pass
