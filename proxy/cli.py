"""The `loopwarden` command: serve, migrate, and the detection log's queries."""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import logging
import os
import signal
import sys
from typing import Sequence

from proxy.config import (FIELDS, ConfigError, Settings, flag_name, help_line, judge_line, ladder, resolve, shown_url,
                          upstream_url_warnings)

EXIT_USAGE = 2
EXIT_RUNTIME = 1


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _settings_flags(parser: argparse.ArgumentParser, *, server: bool) -> None:
    """One flag per setting for `serve`; the query commands need only where the database is."""
    parser.add_argument("--config", help="TOML file with settings (default: none; env LOOPWARDEN_CONFIG)")
    for setting in FIELDS if server else ("database_url",):
        parser.add_argument(flag_name(setting), dest=setting, metavar=setting.upper(),
                            help=help_line(setting).replace("%", "%%"))


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loopwarden", description="OpenAI-compatible proxy that stops looping agents")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = commands.add_parser("serve", help="run the proxy")
    _settings_flags(serve, server=True)
    serve.add_argument("--no-migrate", action="store_true",
                       help="do not apply migrations on start (default: apply them)")
    serve.add_argument("--verbose", action="store_true",
                       help="say at start how it was built: the event loop, the request path compiled or not")

    migrate = commands.add_parser("migrate", help="apply database migrations")
    _settings_flags(migrate, server=False)

    formats = ("table", "json", "csv")
    detections = commands.add_parser("detections", help="list logged detections")
    _settings_flags(detections, server=False)
    detections.add_argument("--session")
    detections.add_argument("--type")
    detections.add_argument("--action")
    detections.add_argument("--mark", help="loop, not_a_loop, or none (not marked)")
    detections.add_argument("--since")
    detections.add_argument("--limit", type=int, default=50)
    detections.add_argument("--format", choices=formats, default="table")

    stats = commands.add_parser("stats", help="summary of detections")
    _settings_flags(stats, server=False)
    stats.add_argument("--since")
    stats.add_argument("--format", choices=("table", "json"), default="table")

    sessions = commands.add_parser("sessions", help="sessions seen")
    _settings_flags(sessions, server=False)
    sessions.add_argument("--since")
    sessions.add_argument("--limit", type=int, default=50)
    sessions.add_argument("--format", choices=formats, default="table")

    session = commands.add_parser("session", help="one session's timeline")
    _settings_flags(session, server=False)
    session.add_argument("session_id")
    session.add_argument("--format", choices=("table", "json"), default="table")

    resume = commands.add_parser("resume", help="let a stopped session go on (as its stop's link does)")
    _settings_flags(resume, server=False)
    resume.add_argument("session_id")
    resume.add_argument("--tenant", help="the tenant (the key's hash) when several share the session id")

    mark = commands.add_parser("mark", help="say whether a detection was a loop (a stop said not to be one resumes "
                                            "its task)")
    _settings_flags(mark, server=False)
    mark.add_argument("detection_id", type=int, help="the detection's id (`loopwarden detections` shows it)")
    verdict = mark.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--not-a-loop", dest="verdict", action="store_const", const="not_a_loop",
                         help="it was healthy work")
    verdict.add_argument("--loop", dest="verdict", action="store_const", const="loop", help="it was a loop")
    mark.add_argument("--note", help="why, in a few words")

    export = commands.add_parser("export", help="write the requests kept with flagged detections (CAPTURE_FLAGGED) "
                                                "as JSONL that `replay` reads")
    _settings_flags(export, server=False)
    export.add_argument("file", help="the JSONL file to write (- for standard output)")
    export.add_argument("--marked", choices=("not_a_loop", "loop"), help="only detections a person marked so")
    export.add_argument("--detection", type=int, help="only this detection's request")
    export.add_argument("--since")

    config = commands.add_parser("config", help="the settings and policies in force, and where each came from")
    _settings_flags(config, server=True)

    replay = commands.add_parser("replay", help="what loopwarden would have done on recorded conversations")
    _settings_flags(replay, server=True)
    replay.add_argument("paths", nargs="+", metavar="PATH", help="JSONL or JSON files, or directories of them")
    replay.add_argument("--format", choices=formats, default="table")
    replay.add_argument("--fail-on", choices=("warn", "stop"), help="exit 1 when any conversation reaches this")
    replay.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="try one setting's value (repeatable), e.g. --set tool_call_threshold=3")
    return parser


def commands() -> list[str]:
    """The CLI's commands, in the order `--help` lists them."""
    return list(_subcommands(_parser()))


def command_help(name: str | None = None, width: int = 80) -> str:
    """A command's `--help` (the program's, without a name), at a fixed width: the CLI's documentation pages
    are made of it."""
    parser = _parser() if name is None else _subcommands(_parser())[name]
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=width)
    return parser.format_help()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(action.choices for action in parser._actions if isinstance(action, argparse._SubParsersAction))


def _flag_values(args: argparse.Namespace) -> dict:
    values = {name: getattr(args, name) for name in FIELDS if getattr(args, name, None) is not None}
    if getattr(args, "config", None):
        values["config"] = args.config
    for assignment in getattr(args, "set", None) or ():
        name, sep, value = assignment.partition("=")
        name = name.strip().lower().replace("-", "_")
        if not sep or name not in FIELDS:
            raise UsageError(f"loopwarden replay: --set expects NAME=VALUE with a setting's name, got {assignment!r}")
        values[name] = value
    return values


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        settings, sources = resolve(_flag_values(args))
    except (UsageError, ConfigError) as exc:
        print(f"loopwarden: {exc}" if isinstance(exc, ConfigError) else str(exc), file=sys.stderr)
        return EXIT_USAGE
    # Other libraries stay at info and above: debug is for loopwarden's own loggers and the access log.
    level = settings.log_level.upper()
    logging.basicConfig(level=max(logging.INFO, logging.getLevelName(level)),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("loopwarden", "aiohttp.access"):
        logging.getLogger(name).setLevel(level)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if args.command == "serve":
        # A stop asked for while starting (importing, migrating, building the app) is held until aiohttp's
        # handler takes it and shuts the server down gracefully (exit 0): taken any earlier, it could land in a
        # migration step (rolled back with a traceback) or in a collector's callback (printed and dropped there,
        # and the process would go on to serve).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    from proxy import commands
    from proxy.store.database import DatabaseUnavailable, run_migrations

    try:
        if args.command == "serve":
            return _serve(settings, migrate=not args.no_migrate, verbose=args.verbose)
        if args.command == "migrate":
            run_migrations(settings.database_url)
            _emit("database is up to date")
            return 0
        if args.command == "config":
            _emit(commands.describe_config(settings, sources))
            return 0
        if args.command == "replay":
            output, failed = commands.replay(args, settings)
            _emit(output)
            return EXIT_RUNTIME if failed else 0
        _emit(asyncio.run(commands.run(args, settings, sources)))
        return 0
    except BrokenPipeError:  # piped into `head` or a pager that closed early: nothing more to say
        _quiet_stdout()
        return 0
    except KeyboardInterrupt:
        return 130
    except commands.UsageProblem as exc:
        print(f"loopwarden: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DatabaseUnavailable as exc:
        print(f"loopwarden: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except Exception as exc:  # one line, no traceback: --log-level debug shows it
        logging.getLogger("loopwarden").debug("command failed", exc_info=True)
        first = str(exc).strip().splitlines()
        print(f"loopwarden: {type(exc).__name__}: {first[0] if first else ''}", file=sys.stderr)
        return EXIT_RUNTIME


def _emit(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()  # a closed pipe shows here, not at exit


def _quiet_stdout() -> None:
    """Standard output is a closed pipe: point it at /dev/null, so the flush at exit says nothing either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def start_line(settings: Settings, database: str, proxies: str | None = None) -> str:
    """What a person starting the proxy needs: where it listens, where requests go, where the log is, and
    what it does to a loop."""
    mode = "observe mode: detects and logs, changes nothing" if settings.mode == "observe" else \
        f"preset {settings.preset}: {ladder(settings)}"
    return (f"loopwarden listening on http://{settings.host}:{settings.port} | upstreams: OpenAI "
            f"{shown_url(settings.upstream_url)}, Anthropic {shown_url(settings.anthropic_upstream_url)}, Gemini "
            f"{shown_url(settings.gemini_upstream_url)}{f' (forward proxy: {proxies})' if proxies else ''} | "
            f"database: {database} | {mode} | {judge_line(settings)}")


# Young collections every 10,000 allocations rather than 700: a full collection walks every object the
# caches and the log buffer hold, and with the default it came every 2 s under a stream of new sessions
# (30-60 ms each, every request in flight held); now about once a minute.
COLLECTOR_THRESHOLDS = (10_000, 10, 10)


async def _settle_heap(app) -> None:
    """What is alive once the server is up (modules, the migrations' imports, compiled queries) lives as
    long as the process. Frozen, it is no longer walked by each full collection (one took 50-90 ms)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


async def _take_held_stop(app) -> None:
    """A stop held since the start is taken here, once aiohttp's own handler is in place (it installs it before
    the startup hooks run)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _serve(settings: Settings, *, migrate: bool, verbose: bool = False) -> int:
    from aiohttp import web

    from proxy import compiled
    from proxy.server.app import CLIENT_IDLE_TIMEOUT, create_app
    from proxy.loops import loop_name, new_event_loop
    from proxy.server.http1 import Proxies

    if migrate:
        from proxy.store.database import run_migrations

        run_migrations(settings.database_url)
    app = create_app(settings)
    app.on_startup.append(_settle_heap)
    from proxy.store.database import describe

    log = logging.getLogger("loopwarden")
    for warning in upstream_url_warnings(settings):
        log.warning("%s", warning)

    proxies = Proxies.from_environment().shown()

    def listening(_: str) -> None:  # called once the port is bound
        log.info("%s", start_line(settings, describe(settings.database_url), proxies))
        if verbose:
            log.info("built: event loop %s, request path %s", loop_name(settings.event_loop), compiled.describe())

    app.on_startup.append(_take_held_stop)
    try:
        web.run_app(app, host=settings.host, port=settings.port, shutdown_timeout=settings.shutdown_grace,
                    loop=new_event_loop(settings.event_loop),
                    handler_cancellation=True, print=listening, keepalive_timeout=CLIENT_IDLE_TIMEOUT,
                    access_log=logging.getLogger("aiohttp.access") if settings.log_level == "debug" else None)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        print(f"loopwarden: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_RUNTIME
    return 0


if __name__ == "__main__":  # `python -m proxy.cli` runs the same command line as `python -m proxy` and `loopwarden`
    from proxy.cli import main as _main  # the module proper, not this copy run as `__main__`

    raise SystemExit(_main())
