"""One settings object, built from flags > environment > TOML file > preset > default."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

from proxy.policy import Policies, PolicyError, parse as parse_policies

ENV_PREFIX = "LOOPWARDEN_"
WARNING_ROLES = ("system", "developer", "user")
PRESETS: dict[str, dict[str, Any]] = {
    "strict": {"tool_call_threshold": 3, "content_loop_threshold": 5, "max_warnings": 1},
    "default": {},
    "lenient": {
        "tool_call_threshold": 7,
        "content_loop_threshold": 15,
        "max_warnings": 3,
        "dynamic_thresholds": True,
    },
}


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names it."""


@dataclass(frozen=True)
class Settings:
    upstream_url: str = "https://api.openai.com/v1"
    upstream_api_key: str | None = None
    anthropic_upstream_url: str = "https://api.anthropic.com"
    anthropic_upstream_api_key: str | None = None
    gemini_upstream_url: str = "https://generativelanguage.googleapis.com"
    gemini_upstream_api_key: str | None = None
    host: str = "127.0.0.1"
    port: int = 8989
    database_url: str = "sqlite+aiosqlite:///./loopwarden.db"
    admin_token: str | None = None
    preset: str = "default"
    max_warnings: int = 2
    tool_call_threshold: int = 5
    content_chunk_size: int = 50
    content_loop_threshold: int = 10
    dynamic_thresholds: bool = False
    whitelisted_tools: frozenset[str] = field(default_factory=frozenset)
    llm_check: bool = True
    llm_check_after_turns: int = 30
    judge_url: str | None = None
    judge_model: str | None = None
    judge_api_key: str | None = None
    judge_confirm_model: str | None = None
    judge_timeout: float = 30.0
    judge_concurrency: int = 4
    warning_role: str = "system"
    max_body_bytes: int = 32 * 1024 * 1024
    cut_notice: bool = True
    mode: str = "enforce"
    webhook_url: str | None = None
    webhook_events: str = "stop"
    public_url: str | None = None
    detection_retention_days: float | None = None  # keep all
    response_retention_days: float = 30.0
    # Not in the contract's table; production defaults documented in the README.
    upstream_connect_timeout: float = 10.0
    upstream_read_timeout: float = 600.0
    shutdown_grace: float = 30.0
    log_buffer_size: int = 10_000
    log_level: str = "info"
    event_loop: str = "auto"  # uvloop where it is installed, else the standard loop
    # From the config file's [tools."..."] and [models."..."] tables only.
    policies: Policies = field(default_factory=Policies)

    def for_model(self, model: str | None) -> "Settings":
        """The settings in force for a request's model: its policy's values over these."""
        overrides = self.policies.model(model)
        return dataclasses.replace(self, **overrides) if overrides else self


# The settings that have a flag, an environment variable and a file key.
FIELDS = {f.name: f for f in dataclasses.fields(Settings) if f.name != "policies"}
MODES = ("enforce", "observe")
_CHOICES = {"preset": tuple(PRESETS), "warning_role": WARNING_ROLES, "mode": MODES, "webhook_events": ("stop", "all"),
            "log_level": ("debug", "info", "warning", "error"), "event_loop": ("auto", "uvloop", "asyncio")}
_OPTIONAL_TEXT = frozenset(
    {"upstream_api_key", "anthropic_upstream_api_key", "gemini_upstream_api_key", "admin_token", "judge_url", "judge_model", "judge_api_key",
     "judge_confirm_model", "webhook_url", "public_url"}
)
_OPTIONAL_NUMBERS = frozenset({"detection_retention_days"})  # unset by default
_MIN = {
    "port": 1,
    "max_warnings": 0,
    "tool_call_threshold": 2,
    "content_chunk_size": 8,
    "content_loop_threshold": 2,
    "llm_check_after_turns": 1,
    "judge_concurrency": 1,
    "max_body_bytes": 1,
    "log_buffer_size": 1,
}


def _convert(name: str, raw: Any) -> Any:
    """Turn a raw value (string from env/flag, or a TOML value) into the field's type."""
    default = FIELDS[name].default
    kind = str if name in _OPTIONAL_TEXT else float if name in _OPTIONAL_NUMBERS else \
        type(default) if default is not dataclasses.MISSING else frozenset
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            if isinstance(raw, bool):
                raise ValueError
            value = int(raw)
            if value < _MIN.get(name, 0):
                raise ConfigError(f"must be at least {_MIN.get(name, 0)}, got {value}")
            if name == "port" and value > 65535:
                raise ValueError
            return value
        if kind is float:
            value = float(raw)
            if value <= 0:
                raise ValueError
            return value
        if kind is frozenset:
            items = raw if isinstance(raw, list) else str(raw).split(",")
            return frozenset(str(item).strip() for item in items if str(item).strip())
        text = str(raw).strip()
        if name in _OPTIONAL_TEXT:
            return text or None
        if not text:
            raise ValueError
        if name in _CHOICES and text not in _CHOICES[name]:
            raise ConfigError(f"must be one of {', '.join(_CHOICES[name])}, got {text!r}")
        return text
    except ConfigError:
        raise
    except (TypeError, ValueError):
        raise ConfigError(f"invalid value {raw!r}") from None


def _label(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def flag_name(name: str) -> str:
    """The command-line flag of a setting."""
    return "--upstream" if name == "upstream_url" else f"--{name.replace('_', '-')}"


def load_file(path: str) -> tuple[dict[str, Any], Policies]:
    """A config file's settings, and its tool and model policies."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    try:
        policies = parse_policies(data)
    except PolicyError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    values = {}
    for key, value in data.items():
        if key in ("tools", "models"):
            continue
        name = key.lower().replace("-", "_")
        if name not in FIELDS:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
        values[name] = value
    return values, policies


def build(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every setting. `flags` holds only the flags the user actually gave."""
    return resolve(flags, environ)[0]


def resolve(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
            ) -> tuple[Settings, dict[str, str]]:
    """Every setting, and where each value came from (a flag, a variable, the file, the preset, the default)."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    environ = os.environ if environ is None else environ
    env_values = {
        name: environ[_label(name)] for name in FIELDS if _label(name) in environ
    }
    config_path = flags.pop("config", None) or environ.get(f"{ENV_PREFIX}CONFIG")
    file_values, policies = load_file(config_path) if config_path else ({}, Policies())

    explicit: dict[str, Any] = {}
    origin: dict[str, str] = {}
    sources = (
        (file_values, lambda name: f"{name} in {config_path}"),
        (env_values, _label),
        (flags, flag_name),
    )
    for values, label in sources:
        for name, raw in values.items():
            if name not in FIELDS:
                raise ConfigError(f"unknown setting {name!r}")
            try:
                explicit[name] = _convert(name, raw)
            except ConfigError as exc:
                raise ConfigError(f"{label(name)}: {exc}") from None
            origin[name] = label(name)

    preset = explicit.get("preset", "default")
    for name in PRESETS[preset]:
        origin.setdefault(name, f"preset {preset}")
    values = {**PRESETS[preset], **explicit}
    settings = Settings(**values, policies=policies)
    _validate(settings)
    return settings, {name: origin.get(name, "default") for name in FIELDS}


def _validate(settings: Settings) -> None:
    for name in ("upstream_url", "anthropic_upstream_url", "gemini_upstream_url", "judge_url", "webhook_url",
                 "public_url"):
        url = getattr(settings, name)
        if url is None:
            continue
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{_label(name)} must be an http(s) URL, got {url!r}")
    if "://" not in settings.database_url or not settings.database_url.startswith(("sqlite", "postgresql")):
        raise ConfigError(
            f"{_label('database_url')} must be a sqlite+aiosqlite:// or postgresql+asyncpg:// URL, "
            f"got {settings.database_url!r}"
        )
