"""AG2's group chat (`autogen`: a user proxy running the code, a coder and a critic) driven through loopwarden in
front of a scripted model. Every message carries its speaker's `name`; to each agent the others' messages are
user messages."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from autogen import AssistantAgent, GroupChat, GroupChatManager, UserProxyAgent

from tests.agents.test_real_text_agents import assert_stopped, no_loopwarden_text
from tests.fake_upstream import Turn

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning",
                                        "ignore::pytest.PytestUnraisableExceptionWarning")

TASK = "Print the weights from the cars data."
REVIEWS = ("The import is right.", "Check the column names.", "The frame is built inline, fine.",
           "Consider printing the columns first.", "Nothing else to add.", "Still the same concern.")


def _group(url: str, work_dir: str) -> tuple[UserProxyAgent, GroupChatManager]:
    llm = {"config_list": [{"model": "gpt-4o", "base_url": url, "api_key": "sk-agent"}], "cache_seed": None}
    user = UserProxyAgent("User_proxy", human_input_mode="NEVER",
                          code_execution_config={"work_dir": work_dir, "use_docker": False},
                          is_termination_msg=lambda m: "TERMINATE" in (m.get("content") or ""))
    coder = AssistantAgent("Coder", llm_config=llm, system_message="You are Coder. Write Python to solve the task.")
    critic = AssistantAgent("Critic", llm_config=llm, system_message="You are Critic. Review the Coder's code.")
    chat = GroupChat(agents=[user, coder, critic], messages=[], max_round=25, speaker_selection_method="round_robin")
    return user, GroupChatManager(groupchat=chat, llm_config=llm)


def _script(code):
    """The coder's answers (`code(attempt)`), the critic's reviews, each told by the asking agent's system prompt."""
    attempts, reviews = itertools.count(1), itertools.cycle(REVIEWS)

    def answer(body):
        if body["messages"][0]["content"].startswith("You are Coder."):
            return Turn(content=code(next(attempts)))
        return Turn(content=next(reviews))
    return answer


async def test_ag2_coder_failing_alike_is_warned_then_stopped(upstream, proxy, tmp_path):
    user, manager = _group(proxy.url, str(tmp_path))
    # The code differs every time; its failure does not.
    upstream.responder = _script(lambda n: f"Attempt {n}.\n\n```python\nrows = [{{'a': {n}}}]\n"
                                           "print([row['Weight_in_lbs'] for row in rows])\n```")
    with pytest.raises(Exception) as caught:
        await asyncio.to_thread(user.initiate_chat, manager, message=TASK)
    assert_stopped(caught.value, upstream)


async def test_ag2_run_that_goes_well_ends_without_a_warning(upstream, proxy, tmp_path):
    user, manager = _group(proxy.url, str(tmp_path))
    upstream.responder = _script(lambda n: f"```python\nprint({n * 1000})\n```" if n < 4 else "Done. TERMINATE")
    await asyncio.to_thread(user.initiate_chat, manager, message=TASK)
    assert no_loopwarden_text(upstream)
