"""A scripted model for trying real agents through loopwarden by hand: the fake upstream as a process.

    python -m tests.agents.scripted_upstream --port 9100 --mode loop --tool read_file \\
        --arguments '{"absolute_path": "/tmp/demo/a.txt"}' --log /tmp/upstream.jsonl

`loop` answers every request with the same tool call (the model is stuck); `chant` streams the same
sentence until it is cut; `answer` replies with plain text (--content, or --content-file: an agent that acts in
text, such as Aider sent the same SEARCH/REPLACE block every time; given several times, the files answer the
requests in turn and the last one answers the rest). Every request body is appended to --log,
so what the model was shown (the warnings) can be read afterwards; --headers-log keeps each request's path and
headers (the credentials left out), which name the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import orjson

from tests.fake_upstream import FakeUpstream, Turn

SENTENCE = "I will check the configuration file once more to be sure. "
ANSWER = "All done: the file holds the configuration."
CREDENTIALS = ("authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie")


def responder(mode: str, tool: str, arguments: dict, log_path: str | None, content: str | list[str] = ANSWER):
    replies = [content] if isinstance(content, str) else list(content)

    def answer(body: dict) -> Turn:
        if log_path:
            with open(log_path, "ab") as log:
                log.write(orjson.dumps(body) + b"\n")
        names = [t.get("function", {}).get("name") or t.get("name") for t in body.get("tools") or []]
        if mode == "loop" and tool in names:
            return Turn(tool_calls=[(tool, arguments)], chunk_chars=5)
        if mode == "chant":
            return Turn(content=SENTENCE * 200, chunk_chars=6, burst=True)
        return Turn(content=replies.pop(0) if len(replies) > 1 else replies[0])
    return answer


def headers_logger(upstream: FakeUpstream, responder, path: str):
    """The responder, writing first the path and headers of the request it answers (the one just received)."""
    def answer(body: dict) -> Turn:
        received = upstream.requests[-1]
        headers = {name.lower(): value for name, value in received.headers.items()
                   if name.lower() not in CREDENTIALS}
        with open(path, "ab") as log:
            log.write(orjson.dumps({"path": received.path, "headers": headers}) + b"\n")
        return responder(body)
    return answer


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--mode", choices=("loop", "chant", "answer"), default="loop")
    parser.add_argument("--tool", default="read_file")
    parser.add_argument("--arguments", default="{}")
    parser.add_argument("--content", default=ANSWER, help="the text `answer` replies with")
    parser.add_argument("--content-file", action="append",
                        help="the text `answer` replies with, read from this file (repeat: one per request)")
    parser.add_argument("--log")
    parser.add_argument("--headers-log")
    args = parser.parse_args()
    upstream = FakeUpstream()
    content = [open(path, encoding="utf-8").read() for path in args.content_file] if args.content_file \
        else args.content
    upstream.responder = responder(args.mode, args.tool, orjson.loads(args.arguments), args.log, content)
    if args.headers_log:
        upstream.responder = headers_logger(upstream, upstream.responder, args.headers_log)
    await upstream.start(port=args.port)
    print(f"scripted upstream on {upstream.url} ({args.mode})", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await upstream.close()


if __name__ == "__main__":
    asyncio.run(main())
