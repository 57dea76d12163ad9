"""Settings: flag > environment > file > preset > default, and one clear line for a bad value."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.config import ConfigError, build


def test_defaults():
    settings = build({}, environ={})
    assert (settings.port, settings.max_warnings, settings.tool_call_threshold) == (8989, 2, 3)
    assert settings.database_url == "sqlite+aiosqlite:///./loopwarden.db"
    assert settings.whitelisted_tools == frozenset()


def test_precedence_flag_env_file(tmp_path):
    config = tmp_path / "lw.toml"
    config.write_text('port = 7000\nmax_warnings = 4\ntool_call_threshold = 9\nwhitelisted_tools = ["poll"]\n')
    env = {"LOOPWARDEN_CONFIG": str(config), "LOOPWARDEN_PORT": "7100", "LOOPWARDEN_MAX_WARNINGS": "3"}
    settings = build({"port": "7200"}, environ=env)
    assert settings.port == 7200  # flag
    assert settings.max_warnings == 3  # environment over file
    assert settings.tool_call_threshold == 9  # file
    assert settings.whitelisted_tools == frozenset({"poll"})


def test_presets_and_explicit_settings_win():
    strict = build({"preset": "strict"}, environ={})
    assert (strict.tool_call_threshold, strict.content_loop_threshold, strict.max_warnings) == (3, 5, 1)
    lenient = build({}, environ={"LOOPWARDEN_PRESET": "lenient", "LOOPWARDEN_MAX_WARNINGS": "0"})
    assert (lenient.tool_call_threshold, lenient.content_loop_threshold, lenient.max_warnings) == (5, 10, 0)
    # lenient is the ladder before 2026-11, as an explicit threshold of 5 gives it
    five = build({"tool_call_threshold": "5"}, environ={})
    assert build({"preset": "lenient"}, environ={}) == dataclasses.replace(five, preset="lenient")


@pytest.mark.parametrize(
    "flags, env, message",
    [
        ({"port": "http"}, {}, "--port: invalid value 'http'"),
        ({}, {"LOOPWARDEN_MAX_WARNINGS": "-1"}, "LOOPWARDEN_MAX_WARNINGS: must be at least 0, got -1"),
        ({"warning_role": "assistant"}, {}, "--warning-role: must be one of system, developer, user"),
        ({}, {"LOOPWARDEN_DYNAMIC_THRESHOLDS": "maybe"}, "LOOPWARDEN_DYNAMIC_THRESHOLDS: invalid value"),
        ({"upstream_url": "ftp://x"}, {}, "--upstream must be an http(s) URL"),
        ({}, {"LOOPWARDEN_UPSTREAM_URL": "ftp://x"}, "LOOPWARDEN_UPSTREAM_URL must be an http(s) URL"),
        ({"database_url": "mysql://x"}, {}, "--database-url: 'mysql://x' is not a database URL loopwarden can use"),
        ({"database_url": "sqlite:///x.db"}, {}, "--database-url: 'sqlite:///x.db' names no async driver loopwarden "
                                                 "has; use sqlite+aiosqlite:///PATH or postgresql+asyncpg://"),
        ({}, {"LOOPWARDEN_DATABASE_URL": "postgresql://u:secret@h/db"}, "LOOPWARDEN_DATABASE_URL: "
                                                                         "'postgresql://u:***@h/db' names no async"),
        ({"detection_retention_days": "nan"}, {}, "--detection-retention-days: must be a number above 0 and at most"),
        ({"detection_retention_days": "inf"}, {}, "--detection-retention-days: must be a number above 0 and at most"),
        ({}, {"LOOPWARDEN_DETECTION_RETENTION_DAYS": "1e9"}, "LOOPWARDEN_DETECTION_RETENTION_DAYS: must be a number"),
        ({"judge_timeout": "nan"}, {}, "--judge-timeout: must be a number above 0"),
        ({"config": "/nonexistent/lw.toml"}, {}, "config file not found"),
    ],
)
def test_bad_values_are_named(flags, env, message):
    with pytest.raises(ConfigError) as caught:
        build(flags, environ=env)
    assert message in str(caught.value)


def test_unknown_key_in_file(tmp_path):
    config = tmp_path / "lw.toml"
    config.write_text("no_such_setting = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'no_such_setting'"):
        build({"config": str(config)}, environ={})


def test_the_judge_is_off_until_asked_for_and_says_where_its_calls_go(tmp_path):
    from proxy.config import judge_line

    assert build({}, environ={}).llm_check is False
    assert judge_line(build({}, environ={})) == "judge off"
    assert judge_line(build({"llm_check": "true", "judge_url": "https://judge.example/v1", "judge_model": "small",
                             "judge_api_key": "jk"}, environ={})) == \
        "judge on: its calls go to https://judge.example/v1, model small, on LOOPWARDEN_JUDGE_API_KEY"
    assert judge_line(build({"llm_check": "true", "upstream_api_key": "uk"}, environ={})) == (
        "judge on: its calls go to each request's own upstream, model the request's model, on the configured "
        "upstream key (else the client's key)")
    # A model's policy may ask for it alone: the judge runs for those models only.
    config = tmp_path / "judged.toml"
    config.write_text('[models."big-*"]\nllm_check = true\n')
    settings = build({"config": str(config)}, environ={})
    assert settings.judge_asked() and not settings.llm_check and settings.for_model("big-1").llm_check
    assert judge_line(settings).startswith("judge on (for the models a policy names): ")
