"""A scripted model for trying real agents through loopwarden by hand: the fake upstream as a process.

    python -m tests.agents.scripted_upstream --port 9100 --mode loop --tool read_file \\
        --arguments '{"absolute_path": "/tmp/demo/a.txt"}' --log /tmp/upstream.jsonl

`loop` answers every request with the same tool call (the model is stuck); `chant` streams the same
sentence until it is cut; `answer` replies with plain text. Every request body is appended to --log,
so what the model was shown (the warnings) can be read afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import orjson

from tests.fake_upstream import FakeUpstream, Turn

SENTENCE = "I will check the configuration file once more to be sure. "


def responder(mode: str, tool: str, arguments: dict, log_path: str | None):
    def answer(body: dict) -> Turn:
        if log_path:
            with open(log_path, "ab") as log:
                log.write(orjson.dumps(body) + b"\n")
        names = [t.get("function", {}).get("name") or t.get("name") for t in body.get("tools") or []]
        if mode == "loop" and tool in names:
            return Turn(tool_calls=[(tool, arguments)], chunk_chars=5)
        if mode == "chant":
            return Turn(content=SENTENCE * 200, chunk_chars=6, burst=True)
        return Turn(content="All done: the file holds the configuration.")
    return answer


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--mode", choices=("loop", "chant", "answer"), default="loop")
    parser.add_argument("--tool", default="read_file")
    parser.add_argument("--arguments", default="{}")
    parser.add_argument("--log")
    args = parser.parse_args()
    upstream = FakeUpstream()
    upstream.responder = responder(args.mode, args.tool, orjson.loads(args.arguments), args.log)
    await upstream.start(port=args.port)
    print(f"scripted upstream on {upstream.url} ({args.mode})", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await upstream.close()


if __name__ == "__main__":
    asyncio.run(main())
