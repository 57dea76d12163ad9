"""One settings object, built from flags > environment > TOML file > preset > default."""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit, urlunsplit

from proxy.policy import Policies, PolicyError, parse as parse_policies

ENV_PREFIX = "LOOPWARDEN_"
WARNING_ROLES = ("system", "developer", "user")
PRESETS: dict[str, dict[str, Any]] = {
    # Warned after the 3rd identical call, stopped at the 4th; chanting at 5 repeats.
    "strict": {"tool_call_threshold": 3, "content_loop_threshold": 5, "max_warnings": 1},
    # Warned after the 3rd and 4th identical calls, stopped at the 5th: before the own guard of every agent the
    # README lists (in-agent guards converged on warning at about 3 and stopping at about 5).
    "default": {},
    # The ladder before 2026-11: warned after the 5th and 6th, stopped at the 7th.
    "lenient": {"tool_call_threshold": 5},
}


def shown_url(url: str | None) -> str | None:
    """A URL as it may be shown (a start line, `config`, an error body, a log line): its password and the
    values of its query (`?api-key=...`) masked, as both often hold a key."""
    if not url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" not in netloc and not parts.query:
        return url.split("#")[0]
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if has_password else f"{user}@{host}"
    query = "&".join(f"{pair.partition('=')[0]}=***" for pair in parts.query.split("&") if pair) \
        if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names it."""


def setting(default: Any, help: str, *, kind: type | None = None, choices: tuple[str, ...] = (),
            minimum: int | None = None, maximum: float | None = None, secret: bool = False) -> Any:
    """A setting declared once: its default and help (`serve --help` adds the default and the variable), its
    type where the default does not say it (an unset number), the values it takes (`choices`, an integer's
    `minimum`, a number's `maximum`), and whether it is a secret (never shown)."""
    if kind is None:
        kind = str if default is None else frozenset if default is frozenset else type(default)
    metadata = {"help": help, "kind": kind, "choices": choices, "minimum": minimum, "maximum": maximum,
                "secret": secret, "url": False}
    if default is frozenset:
        return field(default_factory=frozenset, metadata=metadata)
    return field(default=default, metadata=metadata)


def url_setting(default: str | None, help: str) -> Any:
    """A setting that is a URL: checked as one (http or https, a host; an upstream's a base, not an endpoint)."""
    declared = setting(default, help)
    return field(default=default, metadata={**declared.metadata, "url": True})


MODES = ("enforce", "observe")
CENTURY = 36_500.0  # days a timedelta (and the database's dates) can hold with room to spare


@dataclass(frozen=True)
class Settings:
    upstream_url: str = url_setting("https://api.openai.com/v1", "base URL of the real OpenAI-compatible endpoint")
    upstream_api_key: str | None = setting(None, "replaces the client's Authorization on upstream requests",
                                           secret=True)
    anthropic_upstream_url: str = url_setting(
        "https://api.anthropic.com", "base URL for Anthropic-dialect requests (/v1/messages, anthropic-version)")
    anthropic_upstream_api_key: str | None = setting(
        None, "replaces the client's x-api-key / Authorization on Anthropic requests", secret=True)
    gemini_upstream_url: str = url_setting(
        "https://generativelanguage.googleapis.com",
        "root URL for Gemini-API requests (models/...:generateContent, x-goog-api-key)")
    gemini_upstream_api_key: str | None = setting(
        None, "replaces the client's x-goog-api-key / key on Gemini requests", secret=True)
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8989, "port to listen on", minimum=1)
    database_url: str = setting("sqlite+aiosqlite:///./loopwarden.db",
                                "the detection log: sqlite+aiosqlite:///PATH or postgresql+asyncpg://...")
    admin_token: str | None = setting(None, "bearer token for /loopwarden/*; unset: loopback clients only",
                                      secret=True)
    preset: str = setting("default", "strict, default or lenient thresholds; explicit settings win",
                          choices=tuple(PRESETS))
    max_warnings: int = setting(2, "warnings before the stop (0: stop at the first detection)", minimum=0)
    tool_call_threshold: int = setting(3, "identical consecutive tool calls that make a loop", minimum=2)
    content_chunk_size: int = setting(50, "characters per chunk when looking for chanting", minimum=8)
    content_loop_threshold: int = setting(10, "repeats of a chunk that make chanting", minimum=2)
    dynamic_thresholds: bool = setting(False, "scale thresholds by conversation length")
    whitelisted_tools: frozenset[str] = setting(frozenset, "comma list of tools never counted as looping")
    llm_check: bool = setting(False, "ask a judge model whether a long task still progresses (it spends model calls: "
                                     "on the judge's settings, else the upstream with the request's model and key)")
    llm_check_after_turns: int = setting(30, "assistant turns in a task before the first judge call", minimum=1)
    judge_url: str | None = url_setting(None, "where the judge runs (unset: the upstream)")
    judge_model: str | None = setting(None, "the judge's model (unset: the request's model)")
    judge_api_key: str | None = setting(None, "the judge's key (unset: the client's key)", secret=True)
    judge_confirm_model: str | None = setting(None, "a second model that must agree before a judge verdict counts")
    judge_timeout: float = setting(30.0, "seconds a judge call may take")
    judge_concurrency: int = setting(4, "judge calls in flight at once", minimum=1)
    warning_role: str = setting("system", "role of the injected warning: system, developer or user",
                                choices=WARNING_ROLES)
    max_body_bytes: int = setting(32 * 1024 * 1024, "larger request bodies get 413", minimum=1)
    cut_notice: bool = setting(True, "a cut stream's last text says why it stopped")
    mode: str = setting("enforce", "enforce, or observe: detect and log, change nothing", choices=MODES)
    webhook_url: str | None = url_setting(None, "each stop (or each episode, see --webhook-events) is POSTed here")
    webhook_events: str = setting("stop", "stop, or all: warnings and cuts too", choices=("stop", "all"))
    public_url: str | None = url_setting(None, "the address operators reach the proxy at, for alert links")
    detection_retention_days: float | None = setting(
        None, "delete detections older than this many days (unset: keep all)", kind=float, maximum=CENTURY)
    response_retention_days: float = setting(
        30.0, "forget kept Responses conversations older than this many days", maximum=CENTURY)
    resume_link_ttl: float = setting(24.0, "hours a stop's resume link can be used", maximum=CENTURY * 24)
    capture_flagged: bool = setting(False, "keep the request that carried a detection's warning or was refused "
                                           "(its body, never a key or header), for `loopwarden export`")
    # Not in the contract's table; production defaults documented in the README.
    upstream_connect_timeout: float = setting(10.0, "seconds to connect to the upstream")
    upstream_read_timeout: float = setting(600.0, "seconds the upstream may stay silent mid-answer")
    shutdown_grace: float = setting(30.0, "seconds streams in flight get to finish on SIGTERM")
    log_buffer_size: int = setting(10_000, "log records buffered while the database is slow or away", minimum=1)
    log_level: str = setting("info", "debug, info, warning or error", choices=("debug", "info", "warning", "error"))
    event_loop: str = setting("auto", "auto (uvloop where installed), uvloop or asyncio",
                              choices=("auto", "uvloop", "asyncio"))
    # From the config file's [tools."..."] and [models."..."] tables only.
    policies: Policies = field(default_factory=Policies)

    def judge_asked(self) -> bool:
        """Whether the judge may run: LLM_CHECK, or a model's policy that turns it on."""
        return self.llm_check or any(dict(rule.values).get("llm_check") for rule in self.policies.models)

    def for_model(self, model: str | None) -> "Settings":
        """The settings in force for a request's model: its policy's values over these."""
        overrides = self.policies.model(model)
        return dataclasses.replace(self, **overrides) if overrides else self


# The settings that have a flag, an environment variable and a file key, as declared.
FIELDS = {f.name: f for f in dataclasses.fields(Settings) if f.name != "policies"}
SECRETS = frozenset(name for name, f in FIELDS.items() if f.metadata["secret"])  # never shown


def shown_default(name: str) -> Any:
    """A setting's default as a person reads it (None: unset)."""
    default = FIELDS[name].default
    if default is dataclasses.MISSING:
        default = FIELDS[name].default_factory()  # type: ignore[misc]
    if isinstance(default, frozenset):
        default = ",".join(sorted(default)) or None
    return default


def help_line(name: str) -> str:
    """A setting's help: what it does, its default and its environment variable."""
    default = shown_default(name)
    shown = "unset" if default is None else default
    return f"{FIELDS[name].metadata['help']} (default: {shown}; env {ENV_PREFIX}{name.upper()})"


def _convert(name: str, raw: Any) -> Any:
    """Turn a raw value (string from env/flag, or a TOML value) into the setting's type, within its range."""
    declared = FIELDS[name].metadata
    kind = declared["kind"]
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
            lowest = declared["minimum"] or 0
            if value < lowest:
                raise ConfigError(f"must be at least {lowest}, got {value}")
            if name == "port" and value > 65535:
                raise ValueError
            return value
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)
            highest = declared["maximum"]
            if not math.isfinite(value) or value <= 0 or (highest is not None and value > highest):
                raise ConfigError(f"must be a number above 0{f' and at most {highest:g}' if highest else ''}, "
                                  f"got {raw!r}")
            return value
        if kind is frozenset:
            items = raw if isinstance(raw, list) else str(raw).split(",")
            return frozenset(str(item).strip() for item in items if str(item).strip())
        text = str(raw).strip()
        if FIELDS[name].default is None:  # unset by default: empty unsets it
            return text or None
        if not text:
            raise ValueError
        if declared["choices"] and text not in declared["choices"]:
            raise ConfigError(f"must be one of {', '.join(declared['choices'])}, got {text!r}")
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
    _validate(settings, origin)
    return settings, {name: origin.get(name, "default") for name in FIELDS}


DATABASE_FORMS = "sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER:PASSWORD@HOST/DB"
_DATABASE_DRIVERS = ("sqlite+aiosqlite", "postgresql+asyncpg")


# An upstream URL ending so names one endpoint, where a base is needed.
_ENDPOINTS = ("/chat/completions", "/completions", "/responses", "/messages", "/embeddings", "/models")


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def ladder(settings: Settings) -> str:
    """The warnings and the stop the settings give a repeated call, in words."""
    first, stop = settings.tool_call_threshold, settings.tool_call_threshold + settings.max_warnings
    rungs = [_nth(n) for n in range(first, stop)]
    warned = " and ".join(filter(None, (", ".join(rungs[:-1]), rungs[-1]))) if rungs else ""
    told = f"warned at the {warned} identical call, " if warned else ""
    return f"{told}stopped at the {_nth(stop)}"


def judge_line(settings: Settings) -> str:
    """Whether the judge runs, and when it does, where its calls go and on whose key."""
    if not settings.judge_asked():
        return "judge off"
    where = f"to {shown_url(settings.judge_url)}" if settings.judge_url else "to each request's own upstream"
    model = settings.judge_model or "the request's model"
    upstream_keys = (settings.upstream_api_key,) if settings.judge_url else \
        (settings.upstream_api_key, settings.anthropic_upstream_api_key, settings.gemini_upstream_api_key)
    key = "LOOPWARDEN_JUDGE_API_KEY" if settings.judge_api_key else \
        "the configured upstream key (else the client's key)" if any(upstream_keys) else "the client's key"
    scope = "" if settings.llm_check else " (for the models a policy names)"
    return f"judge on{scope}: its calls go {where}, model {model}, on {key}"


def upstream_url_warnings(settings: Settings) -> list[str]:
    """What in the upstream URLs is allowed but likely wrong, for the start to say."""
    if urlsplit(settings.upstream_url).path.strip("/"):
        return []
    return [f"the OpenAI upstream {shown_url(settings.upstream_url)} has no path: OpenAI-compatible servers serve "
            f"under one (…/v1), and a request they do not know is answered 404"]


def _validate(settings: Settings, origin: Mapping[str, str] | None = None) -> None:
    """Checks across values, each error naming where the value came from (the flag, the variable, the file)."""
    def named(name: str) -> str:
        return (origin or {}).get(name) or _label(name)

    for name in (name for name, declared in FIELDS.items() if declared.metadata["url"]):
        url = getattr(settings, name)
        if url is None:
            continue
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{named(name)} must be an http(s) URL, got {shown_url(url)!r}")
        if name.endswith("upstream_url"):
            path = parts.path.rstrip("/")
            endpoint = next((path[:-len(end)] for end in _ENDPOINTS if path.endswith(end)), None)
            if endpoint is None and "/models/" in path:
                endpoint = path.partition("/models/")[0]
            if endpoint is not None:  # each request's path would be added to it: /v1/chat/completions/v1/...
                base = shown_url(parts._replace(path=endpoint, query="").geturl())
                raise ConfigError(f"{named(name)} is an endpoint, not a base URL: give {base!r}, loopwarden adds "
                                  f"the path each request names (got {shown_url(url)!r})")
    driver = settings.database_url.partition("://")[0].lower()
    if "://" not in settings.database_url or driver not in _DATABASE_DRIVERS:
        shown = shown_url(settings.database_url) if "://" in settings.database_url else settings.database_url
        why = "names no async driver loopwarden has" if driver.split("+")[0] in ("sqlite", "postgresql", "postgres") \
            else "is not a database URL loopwarden can use"
        raise ConfigError(f"{named('database_url')}: {shown[:200]!r} {why}; use {DATABASE_FORMS}")
