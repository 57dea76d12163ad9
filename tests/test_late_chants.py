"""A chant in a whole (non-streamed) answer that the person answers next: its warning would go into the next
request of its task, but the person's message starts a new one. It is still a detection: logged under the task
it was found in, `action: "late"` (found too late to act on: nothing reached the model, nothing was cut), and
the new task's request goes on unwarned. The same with the live proxy and with replay."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from proxy.detect.engine import DetectConfig
from proxy.replay import Record, _record, replay
from tests.agent import Agent
from tests.convo import neutral
from tests.fake_upstream import Turn
from tests.test_served_episodes import logged

# An answer that starts well and then says the same sentence until the model stops: 12 times, in one JSON answer.
ANSWER = ("The failing test expects `load_config` to read `TIMEOUT` from the environment before the file. "
          "I changed the order in `config.py` and the test should pass now.\n\n"
          + "I will now check the configuration file once more before I answer. " * 12)
TASK = "Make test_timeout pass."
NEXT = "That looks stuck. Just show me the diff of config.py."


def conversation(answer: str = ANSWER) -> list[dict]:
    return [{"role": "system", "content": "You are a careful coding agent."}, {"role": "user", "content": TASK},
            {"role": "assistant", "content": answer}, {"role": "user", "content": NEXT}]


def test_replay_logs_the_chant_of_a_whole_answer_the_person_answered_as_late():
    config = DetectConfig()
    (episode,) = replay(config, Record("late", neutral(conversation()), False)).episodes
    assert (episode["turn"], episode["type"], episode["action"], episode["episode"]) == (1, "content", "late", 1)
    assert episode["detail"]["repeated"].startswith("I will now check the configuration")
    # Streamed, it was cut as it came, and that is what is logged; a calm answer logs nothing.
    streamed = replay(config, Record("cut", neutral(conversation()), True)).episodes
    assert [(e["type"], e["action"]) for e in streamed] == [("content", "cut")]
    calm = conversation("I changed the order in `config.py`; the test passes now.")
    assert replay(config, Record("calm", neutral(calm), False)).episodes == []


def test_replay_logs_a_reasoning_chant_of_a_whole_answer_the_person_answered_as_late():
    messages = conversation("The test passes now.")
    messages[2]["reasoning_content"] = "Wait, is TIMEOUT read before the file? Let me check the order again. " * 40
    (episode,) = replay(DetectConfig(), _record({"model": "deepseek-reasoner", "messages": messages}, "r:1")).episodes
    assert (episode["type"], episode["action"], episode["detail"]["channel"]) == ("content", "late", "reasoning")


async def test_the_live_proxy_logs_it_late_under_the_task_it_ended_and_warns_nobody(upstream, proxy):
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "late"}, task=TASK)
    upstream.script.append(Turn(content=ANSWER))
    await agent.turn()
    agent.say(NEXT)
    upstream.script.append(Turn(content="```diff\n-    path = read_file()\n+    env = os.environ\n```"))
    await agent.turn()
    assert "x-loopwarden-warning" not in agent.last_headers
    assert "[loopwarden]" not in orjson.dumps(upstream.chat_requests[-1]).decode()  # the new task goes on unwarned
    (row,) = await logged(proxy, "late", 1)
    assert (row["type"], row["action"], row["episode"], row["turn"], row["enforced"]) == ("content", "late", 1, 1,
                                                                                           True)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/loopwarden/api/sessions") as response:
            (session,) = [s for s in (await response.json())["data"] if s["session_id"] == "late"]
        async with http.get(f"{proxy.root}/loopwarden/api/detections", params={"action": "late"}) as response:
            assert [r["id"] for r in (await response.json())["data"]] == [row["id"]]
        async with http.get(f"{proxy.root}/loopwarden/api/stats") as response:
            # The contract's three actions always, a late one beside them where there is one.
            assert (await response.json())["by_action"] == {"warned": 0, "stopped": 0, "cut": 0, "late": 1}
    assert session["status"] == "ok"  # the person's new task is not the one that chanted
    # The agent goes on in the new task: nothing more is logged for the old one.
    agent.say("Thanks. Now run the tests.")
    upstream.script.append(Turn(content="All 42 tests pass."))
    await agent.turn()
    await asyncio.sleep(0.3)
    assert len(await logged(proxy, "late", 1)) == 1
    await agent.close()


async def test_observe_mode_and_replay_log_the_same_late_chant(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, mode="observe")
    agent = Agent(proxy.url, headers={"X-Loopwarden-Session": "late-observed"}, task=TASK)
    upstream.script.append(Turn(content=ANSWER))
    await agent.turn()
    agent.say(NEXT)
    upstream.script.append(Turn(content="Here is the diff."))
    await agent.turn()
    live = [(r["turn"], r["type"], r["action"], r["episode"], r["enforced"])
            for r in await logged(proxy, "late-observed", 1)]
    assert live == [(1, "content", "late", 1, False)]
    replayed = replay(DetectConfig(tool_call_threshold=5), _record({"messages": agent.messages}, "observed:1"))
    assert [(e["turn"], e["type"], e["action"], e["episode"], False) for e in replayed.episodes] == live
    await agent.close()
