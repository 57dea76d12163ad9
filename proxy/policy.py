"""Policies from the config file: per tool (`[tools."wait_*"] exempt = true`, `threshold = 3`, `edit = true`)
and per model (`[models."gpt-4o-mini*"] max_warnings = 1`). Matched by exact name or glob; the most specific
match wins, key by key. Pure code: the config loader builds these, the engine and the guard read them."""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass
from typing import Any

TOOL_KEYS = {"exempt": bool, "threshold": int, "edit": bool}
# The detection settings a model policy may set, with their types.
MODEL_KEYS = {"max_warnings": int, "tool_call_threshold": int, "content_chunk_size": int,
              "content_loop_threshold": int, "dynamic_thresholds": bool, "whitelisted_tools": list,
              "llm_check": bool, "llm_check_after_turns": int, "mode": str, "warning_role": str, "cut_notice": bool}
MINIMUMS = {"max_warnings": 0, "tool_call_threshold": 2, "content_chunk_size": 8, "content_loop_threshold": 2,
            "llm_check_after_turns": 1, "threshold": 2}
CHOICES = {"mode": ("enforce", "observe"), "warning_role": ("system", "developer", "user")}


class PolicyError(ValueError):
    """A policy that cannot be used; the message names its table and key."""


def specificity(pattern: str) -> tuple[int, int]:
    """Exact names first, then globs by how many literal characters they hold."""
    wild = any(c in pattern for c in "*?[")
    return (0 if wild else 1, len(re.sub(r"\[[^\]]*\]|[*?]", "", pattern)))


@dataclass(frozen=True)
class Rule:
    pattern: str
    values: tuple[tuple[str, Any], ...]

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)


@dataclass(frozen=True)
class Policies:
    tools: tuple[Rule, ...] = ()
    models: tuple[Rule, ...] = ()

    def tool(self, name: str) -> dict[str, Any]:
        return _merged(self.tools, name)

    def model(self, name: str | None) -> dict[str, Any]:
        return _merged(self.models, name or "")

    def describe(self) -> list[str]:
        lines = [f'[tools."{r.pattern}"] ' + ", ".join(f"{k} = {v!r}" for k, v in r.values) for r in self.tools]
        lines += [f'[models."{r.pattern}"] ' + ", ".join(f"{k} = {v!r}" for k, v in r.values) for r in self.models]
        return lines


@functools.lru_cache(maxsize=4096)
def _merged(rules: tuple[Rule, ...], name: str) -> dict[str, Any]:
    """Every matching rule's values, the more specific overriding the less."""
    result: dict[str, Any] = {}
    for rule in sorted((r for r in rules if r.matches(name)), key=lambda r: specificity(r.pattern)):
        result.update(rule.values)
    return result


def _check(table: str, pattern: str, key: str, value: Any, kinds: dict[str, type]) -> Any:
    where = f'{table}."{pattern}".{key}'
    if key not in kinds:
        raise PolicyError(f"{where}: unknown key (known: {', '.join(kinds)})")
    kind = kinds[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise PolicyError(f"{where}: expected a whole number, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise PolicyError(f"{where}: expected {kind.__name__}, got {value!r}")
    if key in MINIMUMS and value < MINIMUMS[key]:
        raise PolicyError(f"{where}: must be at least {MINIMUMS[key]}, got {value}")
    if key in CHOICES and value not in CHOICES[key]:
        raise PolicyError(f"{where}: must be one of {', '.join(CHOICES[key])}, got {value!r}")
    if kind is list:
        if not all(isinstance(item, str) for item in value):
            raise PolicyError(f"{where}: expected a list of tool names")
        return frozenset(value)
    return value


def parse(data: dict[str, Any]) -> Policies:
    """The `tools` and `models` tables of a config file."""
    parsed = {}
    for table, kinds in (("tools", TOOL_KEYS), ("models", MODEL_KEYS)):
        section = data.get(table, {})
        if not isinstance(section, dict):
            raise PolicyError(f"{table}: expected tables like [{table}.\"name\"]")
        rules = []
        for pattern, values in section.items():
            if not pattern or pattern != pattern.strip():
                raise PolicyError(f'{table}."{pattern}": a name or glob must not be empty or padded with spaces')
            if pattern.count("[") != pattern.count("]"):
                raise PolicyError(f'{table}."{pattern}": bad glob (unbalanced brackets)')
            if not isinstance(values, dict):
                raise PolicyError(f'{table}."{pattern}": expected a table of settings, got {values!r}')
            rules.append(Rule(pattern, tuple((key, _check(table, pattern, key, value, kinds))
                                             for key, value in values.items())))
        parsed[table] = tuple(rules)
    return Policies(parsed["tools"], parsed["models"])
