"""Values from clients made to fit the log's columns before they are queued.

A row the database refuses must never reach the writer: a `model` longer than its column, a `\\u0000`
(PostgreSQL text cannot hold one), a lone surrogate (not UTF-8), a number past the column's range. Each
value is cut and cleaned to what its column holds, by the column's own type, so a new column is covered
the day it is added to proxy/store/models.py.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from sqlalchemy import JSON, BigInteger, Integer, String, Text

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
MAX_TEXT = 100_000  # characters of an unbounded text column (a judge's analysis)
MAX_JSON_TEXT = 16_000  # characters of each string inside a JSON column
MAX_JSON_DEPTH = 32  # nesting kept inside a JSON column; deeper values are replaced by a marker
TOO_DEEP = "…(nested too deep)"
_SURROGATE = re.compile("[\ud800-\udfff]")


def text(value: str, limit: int | None) -> str:
    """A string as a column holds it: at most `limit` characters, no NUL, valid UTF-8 (a lone surrogate
    becomes U+FFFD). Cut first, so a 10 MB value costs what its column keeps."""
    if limit is not None and len(value) > limit:
        value = value[:limit]
    if "\x00" in value:
        value = value.replace("\x00", "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = _SURROGATE.sub("\ufffd", value)
    return value


def _clamp(value: int, bounds: tuple[int, int]) -> int:
    return min(max(value, bounds[0]), bounds[1])


def json_value(value: Any, depth: int = 0) -> Any:
    """A JSON value with every string (and key) cleaned and cut, its nesting bounded."""
    if isinstance(value, str):
        return text(value, MAX_JSON_TEXT)
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        return _clamp(value, INT64)
    if depth >= MAX_JSON_DEPTH:
        return TOO_DEEP
    if isinstance(value, dict):
        return {text(str(key), MAX_JSON_TEXT): json_value(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(item, depth + 1) for item in value]
    return text(str(value), MAX_JSON_TEXT)


@functools.cache
def _rules(table) -> tuple[tuple[str, str, Any], ...]:
    """(column, kind, bound) for each column of a mapped class whose values need it."""
    rules = []
    for column in table.__table__.columns:
        kind = column.type
        if isinstance(kind, Text):
            rules.append((column.name, "text", MAX_TEXT))
        elif isinstance(kind, String):
            rules.append((column.name, "text", kind.length))
        elif isinstance(kind, BigInteger):
            rules.append((column.name, "int", INT64))
        elif isinstance(kind, Integer):
            rules.append((column.name, "int", INT32))
        elif isinstance(kind, JSON):
            rules.append((column.name, "json", None))
    return tuple(rules)


def row(table, values: dict) -> dict:
    """`values` (a row for `table`) cleaned in place to fit its columns; returned for convenience."""
    for name, kind, bound in _rules(table):
        value = values.get(name)
        if value is None:
            continue
        if kind == "text":
            values[name] = text(value if isinstance(value, str) else str(value), bound)
        elif kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                values[name] = _clamp(value, bound)
        else:
            values[name] = json_value(value)
    return values


@functools.cache
def _length(table, name: str) -> int | None:
    column = table.__table__.columns[name]
    return None if isinstance(column.type, Text) else column.type.length


def column_text(table, name: str, value: str | None) -> str | None:
    """One string as `table.name` holds it: for looking up a value as it was stored."""
    return None if value is None else text(value, _length(table, name))


MODEL_CHARS = 256  # a model's name as every column, cache and span holds it


def model_of(payload: dict) -> str | None:
    """A request's `model`, bounded before it keys a cache (the per-model settings), names a span or goes to
    the log: no real model name is longer, and a 10 MB one must cost what a real one costs."""
    model = payload.get("model")
    return text(model, MODEL_CHARS) if isinstance(model, str) else None
