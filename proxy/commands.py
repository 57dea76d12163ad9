"""The log's query commands, `config` and `replay`: thin shells over proxy.store.queries, the settings and
proxy.replay, for people (tables) and scripts (JSON, CSV)."""

from __future__ import annotations

import argparse
import csv
import io
from datetime import datetime
from pathlib import Path

import orjson
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from proxy import compiled
from proxy.config import FIELDS, SECRETS, Settings
from proxy.detect.actions import Action
from proxy.detect.engine import DetectConfig
from proxy.detect.evidence import from_logged, strength_of
from proxy.detect.ladder import shown
from proxy.loops import loop_name
from proxy.replay import read_records, replay as replay_one, summary
from proxy.store import queries
from proxy.store.database import DatabaseUnavailable, create_engine, describe_failure, safe_url


class UsageProblem(ValueError):
    """A flag's value is wrong: exit 2."""


async def run(args: argparse.Namespace, settings: Settings, sources: dict[str, str] | None = None) -> str:
    """Run a query command; returns what to print. `sources` says where each setting came from."""
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:" \
            and not Path(url.database).exists():
        raise DatabaseUnavailable(
            f"no database at {Path(url.database).resolve()} (from {_origin(sources)}): name the one the proxy "
            f"writes with --database-url or LOOPWARDEN_DATABASE_URL, or run `loopwarden migrate` to create this one")
    engine = create_engine(settings.database_url)
    try:
        try:
            async with engine.connect() as connection:
                tables = await connection.run_sync(lambda sync: inspect(sync).get_table_names())
        except Exception as exc:
            raise describe_failure(settings.database_url, exc) from exc
        if "detections" not in tables:
            raise DatabaseUnavailable(f"the database {safe_url(settings.database_url)} has no loopwarden tables: "
                                      f"run `loopwarden migrate`")
        try:
            since = queries.parse_since(getattr(args, "since", None))
        except queries.QueryError as exc:
            raise UsageProblem(f"--{exc}") from exc
        try:
            return await _COMMANDS[args.command](engine, args, since)
        except queries.QueryError as exc:
            raise UsageProblem(str(exc)) from exc
    finally:
        await engine.dispose()


def _origin(sources: dict[str, str] | None) -> str:
    origin = (sources or {}).get("database_url", "default")
    return "the default, relative to this directory" if origin == "default" else origin


async def _detections(engine, args, since) -> str:
    where = queries.DetectionFilter(session=args.session, type=args.type, action=args.action, since=since,
                                    mark=args.mark)
    items, _ = await queries.list_detections(engine, where, args.limit)
    if args.format == "json":
        return _json(items)
    columns = ["id", "created_at", "session_id", "model", "type", "action", "episode", "strength", "turn", "summary"]
    rows = [{**item, "episode": _episode(item), "strength": _strength(item), "summary": _summary(item)}
            for item in items]
    if args.format == "csv":
        return _csv(columns + ["tenant", "task", "request_id", "tokens_saved_estimate", "mark", "mark_note", "detail"],
                    [{**row, "detail": orjson.dumps(row["detail"]).decode()} for row in rows])
    return _table(columns, [{**row, "created_at": _local(row["created_at"])} for row in rows],
                  empty="no detections")


def _episode(item: dict) -> str:
    """k/N for a warning (`k (past N)` for weak evidence's warnings past N), "stop" for the stop."""
    if item.get("action") == Action.STOPPED:
        return "stop"
    return shown(item["episode"], item["episode_limit"], stopped=False)


def _strength(item: dict) -> str:
    """How strong the episode's evidence is (`strong`, `weak`, `judged`)."""
    return item.get("strength") or strength_of(item["type"], item["detail"]) or ""


def _summary(item: dict) -> str:
    """An episode's evidence in one short line (none for a detail this version cannot read)."""
    evidence = from_logged(item["type"], item["detail"])
    return evidence.line() if evidence is not None else ""


async def _stats(engine, args, since) -> str:
    complete = await queries.counts_complete(engine)  # asked first, as the API does
    result = {**await queries.stats(engine, since), "complete": complete}
    if args.format == "json":
        return _json(result)
    rate = result["recovery_rate"]
    lines = [
        f"detections                 {result['detections']}",
        *(f"  {kind:<24} {count}" for kind, count in result["by_type"].items()),
        "by action",
        *(f"  {action:<24} {count}" for action, count in result["by_action"].items()),
        "by model",
        *(f"  {model:<24} {count}" for model, count in result["by_model"].items()),
        f"sessions affected          {result['sessions_affected']}",
        f"avg turns before detection {result['average_turns_before_detection'] or '-'}",
        f"recovery rate              {'-' if rate is None else f'{rate:.0%}'} "
        f"({result['recovered_tasks']} of {result['warned_tasks']} warned tasks: the model left the loop for good)",
        f"tokens saved (estimate)    {result['tokens_saved_estimate']}",
        f"judge checks / tokens      {result['judge_checks']} / {result['judge_tokens']}",
    ]
    if not result["complete"]:
        lines.insert(0, "(the counts are being rebuilt from the log: these figures are not whole yet)")
    observed = result["observed"]
    if observed["detections"]:
        lines += [f"observed (not enforced)    {observed['detections']} detections: would have warned "
                  f"{observed['by_action']['warned']} times, cut {observed['by_action']['cut']} streams and "
                  f"stopped {observed['would_have_stopped_tasks']} tasks"]
    return "\n".join(lines)


# The sessions table's widest free-text columns are cut to these (the whole text: --format json or csv).
AGENT_CHARS = 28
TITLE_CHARS = 30


async def _sessions(engine, args, since) -> str:
    items = await queries.list_sessions(engine, since, limit=args.limit)
    if args.format == "json":
        return _json(items)
    if args.format == "csv":
        return _csv(["session_id", "status", "first_seen", "last_seen", "requests", "messages", "detections",
                     "disabled", "model", "agent", "title", "tenant"], items)
    today = datetime.now().strftime("%Y-%m-%d")
    rows = [{"session": item["session_id"], "status": item["status"],
             "last seen": _local(item["last_seen"]).removeprefix(today + " "), "requests": item["requests"],
             "detections": item["detections"], "agent": _cut(item["agent"], AGENT_CHARS),
             "title": _cut(item["title"], TITLE_CHARS)} for item in items]
    return _table(["session", "status", "last seen", "requests", "detections", "agent", "title"], rows,
                  empty="no sessions")


def _cut(text: str | None, limit: int) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit - 1] + "…"


async def _session(engine, args, since) -> str:
    found = await queries.session_timeline(engine, args.session_id)
    if not found:
        raise DatabaseUnavailable(f"no session {args.session_id!r} in the log")
    if args.format == "json":
        return _json(found)
    out = []
    for session in found:
        out.append(f"session {session['session_id']} (tenant {session['tenant']}): {session['status']}, "
                   f"{session['requests']} requests, last seen {_local(session['last_seen'])}"
                   f"{', detection disabled' if session['disabled'] else ''}")
        if session["agent"] or session["title"]:
            out.append(f"  {session['agent'] or 'unknown agent'}: {session['title'] or '(no prompt)'}")
        tasks: dict[str, int] = {}  # numbered as first seen; a new person's prompt starts the next
        previous = None
        for entry in session["timeline"]:
            if entry["task"] != previous:
                out.append(f"  task {tasks.setdefault(entry['task'], len(tasks) + 1)}")
                previous = entry["task"]
            out.append(f"    {_local(entry['at'])}  {_timeline_line(entry)}")
        if not session["timeline"]:
            out.append("  no detections")
    return "\n".join(out)


def _timeline_line(entry: dict) -> str:
    if entry["kind"] == "resume":
        return "resumed by a person: the stop and warnings forgiven, its next request goes through"
    if entry["kind"] == "detection":
        return (f"{entry['action']:<7} {entry['type']:<10} {_episode(entry):<4} {_strength(entry):<6} "
                f"turn {entry['turn']}: {_summary(entry)}")
    return f"judge   turn {entry['turn']}: confidence {entry['confidence']} {entry['analysis'][:60]}"


async def _resume(engine, args, since) -> str:
    resumed = await queries.resume_session(engine, args.session_id, args.tenant)
    if not resumed:
        raise UsageProblem(f"no session {args.session_id!r}" + (f" of tenant {args.tenant}" if args.tenant else ""))
    return "\n".join(f"session {row['session_id']} (tenant {row['tenant']}) resumed: what it sent so far is "
                     f"forgiven, its next request goes through" for row in resumed)


async def _mark(engine, args, since) -> str:
    marked = await queries.mark_detection(engine, args.detection_id, args.verdict, args.note)
    if marked is None:
        raise UsageProblem(f"no detection {args.detection_id}")
    said = f"detection {marked['id']} ({marked['type']} {marked['action']}, session {marked['session_id']}) marked " \
           f"{marked['mark'].replace('_', ' ')}"
    if queries.resumes(marked):
        await queries.resume_session(engine, marked["session_id"], marked["tenant"])
        said += ": its task goes on, its next request is forwarded"
    return said


async def _export(engine, args, since) -> str:
    """The kept requests, a JSON body a line (as the client sent it, compact), for `replay`."""
    found = await queries.captured_requests(engine, args.marked, args.detection, since)
    lines = b"".join(orjson.dumps(orjson.loads(body)) + b"\n" for _, body in found)
    if args.file == "-":
        return lines.decode().rstrip("\n")
    Path(args.file).write_bytes(lines)
    detections = ", ".join(str(detection["id"]) for detection, _ in found) or "none"
    return f"{len(found)} request{'s' if len(found) != 1 else ''} written to {args.file} (detections: {detections})" \
        + ("" if found else ": none kept (is CAPTURE_FLAGGED on?)")


_COMMANDS = {"detections": _detections, "stats": _stats, "sessions": _sessions, "session": _session,
             "resume": _resume, "mark": _mark, "export": _export}


def _json(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _csv(columns: list[str], rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().rstrip("\n")


def _local(iso: str | None) -> str:
    if not iso:
        return "-"
    moment = datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _table(columns: list[str], rows: list[dict], empty: str) -> str:
    if not rows:
        return empty
    cells = [[str(row.get(c, "")) if row.get(c) is not None else "-" for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def describe_config(settings, sources: dict[str, str]) -> str:
    """Every setting in force and where its value came from; then the policies. Secrets are not shown."""
    rows = []
    for name in FIELDS:
        value = getattr(settings, name)
        if name in SECRETS and value:
            value = "(set)"
        elif isinstance(value, frozenset):
            value = ",".join(sorted(value)) or ""
        rows.append({"setting": name.upper(), "value": "" if value is None else str(value), "from": sources[name]})
    out = _table(["setting", "value", "from"], rows, empty="")
    out += f"\n\nevent loop: {loop_name(settings.event_loop)}\nrequest path: {compiled.describe()}"
    policies = settings.policies.describe()
    return out + "\n\npolicies\n" + ("\n".join(f"  {line}" for line in policies) if policies else "  (none)")


def replay(args, settings) -> tuple[str, bool]:
    """Replay the records under the settings in force; the output, and whether --fail-on was reached."""
    records, errors = read_records(args.paths)
    results = [replay_one(DetectConfig.from_settings(settings.for_model(r.model)), r) for r in records]
    overview = summary(results, errors)
    failed = (args.fail_on == "warn" and overview["detections"] > 0) or \
        (args.fail_on == "stop" and overview["would_stop"] > 0)
    if args.format == "json":
        return _json({"conversations": [{"source": r.source, "turns": r.turns, "episodes": r.episodes}
                                        for r in results],
                      "errors": errors, "summary": overview}), failed
    if args.format == "csv":
        rows = [{"source": r.source, **{k: e[k] for k in ("turn", "type", "action", "episode", "episode_limit")},
                 "evidence": _summary(e)} for r in results for e in r.episodes]
        return _csv(["source", "turn", "type", "action", "episode", "episode_limit", "evidence"], rows), failed
    lines = []
    for result in results:
        lines.append(f"{result.source}: {result.turns} turns, "
                     f"{len(result.episodes) or 'no'} episode{'s' if len(result.episodes) != 1 else ''}")
        for e in result.episodes:
            lines.append(f"  turn {e['turn']:<4} {e['action']:<8} {e['type']:<10} {_episode(e):<5} "
                         f"{_summary(e)}")
    for error in errors:
        lines.append(f"{error['source']}: skipped, {error['message']}")
    lines.append(f"\n{overview['conversations']} conversations ({overview['unreadable']} unreadable records "
                 f"skipped): {overview['with_episodes']} with episodes, {overview['detections']} detections "
                 f"({', '.join(f'{k} {v}' for k, v in overview['by_type'].items()) or 'none'}); "
                 f"{overview['would_stop']} would have been stopped, saving {overview['turns_saved']} turns")
    return "\n".join(lines), failed
