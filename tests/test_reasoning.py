"""Loops inside the model's reasoning, through the proxy, with the real SDKs against a scripted upstream that
streams reasoning the way each server does: a chant in chat `reasoning_content`, `reasoning` (beside OpenRouter's
`reasoning_details`) and `<think>` content, in a Responses `reasoning_text` or summary stream, in an Anthropic
thinking block and in Gemini thought parts is cut early, the upstream dropped at once, the turn ended cleanly
with the notice as the answer, and the detection logged with `channel: reasoning`."""

from __future__ import annotations

import random

import aiohttp
import anthropic
import openai
import orjson
import pytest
from google import genai
from google.genai import types

from proxy.commands import _summary
from proxy.wire.chat import ChatDialect, ChatStream, ThinkTags
from proxy.wire.messages import MessagesDialect
from proxy.wire.responses import ResponsesStream
from tests.fake_upstream import Turn
from tests.test_served_episodes import logged

CHANT = "Wait, let me recheck the sum of the first two columns again. "
REASONING = CHANT * 400  # 24,400 characters, every copy
NOTICE = "\n\n[loopwarden] Output cut: the same text repeated 10 times in the reasoning."
MAX_TOKENS = 8000


def varied_reasoning(length: int = 3000) -> str:
    """Reasoning that moves on: sentences of varied words, no long run shared."""
    words = ("column", "total", "carry", "digit", "check", "row", "sum", "value", "first", "second", "table",
             "number", "add", "compare", "result", "left", "right", "next", "so", "then", "maybe", "because",
             "eleven", "seven", "forty", "nine", "twelve", "wrong", "right", "fine", "hmm", "okay")
    pick = random.Random(29)
    text = ""
    while len(text) < length:
        text += " ".join(pick.choice(words) for _ in range(pick.randint(5, 12))).capitalize() + ". "
    return text


def chant_turn(**fields) -> Turn:
    return Turn(content="The answer is 42.", thinking=REASONING, thinking_chars=9, delay=0.002, **fields)


def assert_cut_early(upstream) -> None:
    record = upstream.streams[-1]
    assert not record.completed  # the upstream was dropped at once
    assert record.sent < record.planned // 4


async def detection(proxy, session: str) -> dict:
    (row,) = await logged(proxy, session, 1)
    assert (row["type"], row["action"]) == ("content", "cut")
    return row


async def nothing_logged(proxy, session: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.root}/loopwarden/api/detections", params={"session": session}) as response:
            assert (await response.json())["data"] == []


def openai_client(proxy, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test-1", max_retries=0,
                              default_headers={"X-Loopwarden-Session": session})


async def chat_stream(client: openai.AsyncOpenAI) -> tuple[str, str, str | None]:
    """(reasoning, content, finish_reason) as the openai SDK gives a streamed chat answer."""
    reasoning, content, finish = "", "", None
    stream = await client.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "Add them."}],
                                                  stream=True, max_tokens=MAX_TOKENS)
    async for chunk in stream:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            reasoning += extra.get("reasoning_content") or extra.get("reasoning") or ""
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return reasoning, content, finish


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "openrouter", "think"])
async def test_a_chat_reasoning_chant_is_cut_and_the_turn_ends_with_the_notice(upstream, proxy, field):
    upstream.script.append(chant_turn(reasoning_field=field))
    async with openai_client(proxy, f"chat-{field}") as client:
        reasoning, content, finish = await chat_stream(client)
    assert finish == "stop"
    if field == "think":  # the `<think>` part closed, the notice after it: the answer
        assert content.startswith("<think>") and content.endswith("</think>" + NOTICE)
        reasoning = content[len("<think>"):-len("</think>" + NOTICE)]
    else:
        assert content == NOTICE
    assert CHANT * 9 in reasoning and len(reasoning) < len(CHANT) * 12
    assert_cut_early(upstream)
    row = await detection(proxy, f"chat-{field}")
    assert row["detail"]["channel"] == "reasoning" and row["detail"]["api"] == "chat"
    assert row["detail"]["repeated"].strip() and row["detail"]["occurrences"] == 10
    assert MAX_TOKENS - 200 < row["tokens_saved_estimate"] < MAX_TOKENS  # counted from the request's max tokens


async def test_six_copies_in_the_reasoning_and_six_in_the_answer_are_one_chant_cut_at_the_tenth(upstream, proxy):
    upstream.script.append(Turn(thinking=CHANT * 6, thinking_chars=9, content=CHANT * 6, chunk_chars=9))
    async with openai_client(proxy, "crossing") as client:
        reasoning, content, finish = await chat_stream(client)
    assert reasoning == CHANT * 6 and finish == "stop"
    assert content.endswith("\n\n[loopwarden] Output cut: the same text repeated 10 times.")
    answered = content.split("\n\n[loopwarden]")[0]
    assert CHANT * 3 in answered and CHANT * 4 not in answered  # the tenth copy, cut inside it
    row = await detection(proxy, "crossing")
    assert "channel" not in row["detail"]  # it completed in the answer


async def test_varied_reasoning_goes_through_untouched_and_nothing_is_logged(upstream, proxy):
    thinking = varied_reasoning()
    upstream.script.append(Turn(thinking=thinking, thinking_chars=9, content="Done."))
    async with openai_client(proxy, "varied") as client:
        reasoning, content, finish = await chat_stream(client)
    assert (reasoning, content, finish) == (thinking, "Done.", "stop")
    assert upstream.streams[-1].completed
    await nothing_logged(proxy, "varied")


async def test_a_chant_in_a_json_answers_reasoning_is_relayed_whole_and_the_next_request_warned(upstream, proxy):
    upstream.script.append(Turn(thinking=CHANT * 40, tool_calls=[("read_file", {"path": "sum.py"})]))
    messages = [{"role": "user", "content": "Add."}]
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    async with openai_client(proxy, "json") as client:
        answer = await client.chat.completions.create(model="qwen3", messages=messages, tools=tools)
        message = answer.choices[0].message  # no cut is possible in a whole answer: relayed as it came
        assert message.model_extra["reasoning_content"] == CHANT * 40 and message.tool_calls
        # The agent sends the call and its result on, without the reasoning (as DeepSeek asks): warned anyway.
        call = message.tool_calls[0]
        messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "a = 40\nb = 2"}]
        upstream.script.append(Turn(content="42."))
        await client.chat.completions.create(model="qwen3", messages=messages, tools=tools)
    sent = upstream.chat_requests[-1]["messages"]
    warnings = [m["content"] for m in sent if "[loopwarden]" in str(m.get("content"))]
    assert len(warnings) == 1 and "repeat" in warnings[0] and sent[-1]["content"] == warnings[0]
    (row,) = await logged(proxy, "json", 1)
    assert (row["type"], row["action"], row["detail"]["channel"]) == ("content", "warned", "reasoning")


@pytest.mark.parametrize("kind", ["reasoning_text", "summary"])
async def test_a_responses_reasoning_chant_is_cut_into_a_completed_response(upstream, proxy, kind):
    upstream.script.append(chant_turn(reasoning_field=kind))
    events = []
    async with openai_client(proxy, f"responses-{kind}") as client:
        stream = await client.responses.create(model="gpt-oss-120b", input="Add them.", stream=True,
                                               max_output_tokens=MAX_TOKENS)
        async for event in stream:
            events.append(event)
    assert events[-1].type == "response.completed"
    response = events[-1].response
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content is None  # none invented
    parts = reasoning.content if kind == "reasoning_text" else reasoning.summary
    assert CHANT * 9 in parts[0].text and len(parts[0].text) < len(CHANT) * 12
    assert message.type == "message" and response.output_text == NOTICE
    done = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert done == [reasoning.id, message.id]
    sequence = [e.sequence_number for e in events]
    assert sequence == sorted(set(sequence))
    assert_cut_early(upstream)
    row = await detection(proxy, f"responses-{kind}")
    assert row["detail"]["channel"] == "reasoning" and row["detail"]["api"] == "responses"


async def test_an_anthropic_thinking_chant_is_cut_and_the_conversation_goes_on(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, anthropic_upstream_url=upstream.root)
    client = anthropic.AsyncAnthropic(base_url=proxy.root, api_key="sk-ant-1", max_retries=0,
                                      default_headers={"X-Loopwarden-Session": "thinking"})
    request = {"model": "claude-sonnet-5-5", "max_tokens": MAX_TOKENS,
               "thinking": {"type": "enabled", "budget_tokens": 6000}}
    messages = [{"role": "user", "content": "Add the columns."}]
    upstream.script.append(chant_turn())
    async with client.messages.stream(messages=messages, **request) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_message()
    assert final.stop_reason == "end_turn"
    thinking, text = final.content
    assert thinking.type == "thinking" and not thinking.signature  # closed where it was cut, unsigned
    assert CHANT * 9 in thinking.thinking and len(thinking.thinking) < len(CHANT) * 12
    assert text.type == "text" and text.text == NOTICE
    assert b"event: error" not in bytes(upstream.streams[-1].body)
    assert_cut_early(upstream)
    row = await detection(proxy, "thinking")
    assert row["detail"]["channel"] == "reasoning" and row["detail"]["api"] == "messages"

    # The conversation goes on with the cut message in it: the unsigned block is left out (the upstream, as
    # Anthropic does, refuses one), the rest goes as it came. The agent's own next message starts no task: the
    # request carries the warning, read from the notice (the reasoning itself is gone).
    messages.append({"role": "assistant", "content": final.content})
    upstream.script.append(Turn(content="Sorry."))
    reminder = {"role": "user", "content": [{"type": "text", "text": "<system-reminder>go on</system-reminder>"}]}
    await client.messages.create(messages=messages + [reminder], **request)
    sent = upstream.messages_requests[-1]["messages"]
    assert sent[1]["content"] == [{"type": "text", "text": NOTICE}]
    warning = sent[2]["content"][0]["text"]  # right after the turn it warns about
    assert warning.startswith("[loopwarden] Loop detected (1/2): your reasoning keeps repeating the same text.")
    assert len(await logged(proxy, "thinking", 2)) == 1  # the warning of a cut is not logged again

    # A new prompt: the request succeeds.
    messages.append({"role": "user", "content": "Try again."})
    upstream.script.append(Turn(thinking="Add column by column.", content="42."))
    answer = await client.messages.create(messages=messages, **request)
    assert answer.content[-1].text == "42."
    sent = upstream.messages_requests[-1]["messages"]
    assert sent[1]["content"] == [{"type": "text", "text": NOTICE}] and b"[loopwarden] Loop" not in \
        upstream.messages_raw[-1]

    # With the thinking signed, the request goes upstream byte for byte.
    messages[1] = {"role": "assistant", "content": [answer.content[0].model_dump(), {"type": "text", "text": "42."}]}
    upstream.script.append(Turn(content="ok"))
    raw = orjson.dumps({**request, "messages": messages[:2] + [{"role": "user", "content": "Thanks."}]})
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.root}/v1/messages", data=raw,
                             headers={"x-api-key": "k", "anthropic-version": "2023-06-01",
                                      "Content-Type": "application/json"}) as response:
            assert response.status == 200
    assert upstream.messages_raw[-1] == raw
    await client.close()


async def test_a_gemini_thought_chant_is_cut_with_a_last_text_part(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, gemini_upstream_url=upstream.root)
    client = genai.Client(api_key="gemini-key-1", http_options=types.HttpOptions(
        base_url=proxy.root, api_version="v1beta", headers={"X-Loopwarden-Session": "gemini"},
        retry_options=types.HttpRetryOptions(attempts=1)))
    upstream.script.append(chant_turn())
    thoughts, answer, finish = "", "", None
    config = types.GenerateContentConfig(max_output_tokens=MAX_TOKENS,
                                         thinking_config=types.ThinkingConfig(include_thoughts=True))
    async for chunk in await client.aio.models.generate_content_stream(
            model="gemini-test", contents="Add the columns.", config=config):
        candidate = chunk.candidates[0]
        for part in candidate.content.parts or ():
            if part.thought:
                thoughts += part.text
            else:
                answer += part.text or ""
        finish = candidate.finish_reason or finish
    assert finish == types.FinishReason.STOP and answer == NOTICE
    assert CHANT * 9 in thoughts and len(thoughts) < len(CHANT) * 12
    assert_cut_early(upstream)
    row = await detection(proxy, "gemini")
    assert row["detail"]["channel"] == "reasoning" and row["detail"]["api"] == "gemini"


# The pieces on their own, without a server.


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 50])
def test_think_tags_split_anywhere_give_the_same_reasoning_and_answer(size):
    content = "  <think>Let me see: a < b, and </thin is no tag.</think>The answer is 3."
    tags = ThinkTags()
    reasoning = answer = ""
    for start in range(0, len(content), size):
        thought, said = tags.feed(content[start:start + size])
        reasoning, answer = reasoning + thought, answer + said
    assert (reasoning, answer) == ("Let me see: a < b, and </thin is no tag.", "The answer is 3.")
    assert ThinkTags().feed("No thinking here.") == ("", "No thinking here.")


def test_chat_reasoning_is_counted_once_whichever_fields_carry_it():
    stream = ChatStream()
    for delta in ({"reasoning": "a", "reasoning_details": [{"type": "reasoning.text", "text": "a"}]},
                  {"reasoning_content": "b", "reasoning": "b"}, {"content": "c"}):
        assert stream.add({"choices": [{"index": 0, "delta": delta}]})[0] == delta.get("content", "")
    assert (stream.reasoning_text, stream.text) == ("ab", "c")
    body = {"choices": [{"message": {"role": "assistant", "content": "<think>hm</think>42"}}]}
    assert ChatDialect.reasoning(body) == "hm" and ChatDialect.answer(body).text == "42"


def test_a_responses_cut_inside_the_reasoning_closes_its_item_and_adds_a_message():
    stream = ResponsesStream()
    for event in ({"type": "response.created", "response": {"id": "resp_1", "model": "m"}, "sequence_number": 0},
                  {"type": "response.output_item.added", "output_index": 0, "sequence_number": 1,
                   "item": {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": None}},
                  {"type": "response.reasoning_text.delta", "item_id": "rs_1", "output_index": 0,
                   "content_index": 0, "delta": "la la", "sequence_number": 2}):
        stream.add(event)
    assert stream.last_reasoning == "la la"
    events = [orjson.loads(line[6:]) for line in stream.cut_ending({"loop": "content"}, NOTICE).split(b"\n")
              if line.startswith(b"data: ")]
    assert [e["type"] for e in events] == [
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(3, 13))
    reasoning, message = events[-1]["response"]["output"]
    assert reasoning == {"id": "rs_1", "type": "reasoning", "summary": [],
                         "content": [{"type": "reasoning_text", "text": "la la"}]}
    assert message["content"][0]["text"] == NOTICE and events[3]["output_index"] == 1


def test_only_an_unsigned_thinking_block_is_left_out_of_a_messages_request():
    signed = {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "sig"},
                                               {"type": "text", "text": "ok"}]}
    assert MessagesDialect.forwardable({"messages": [{"role": "user", "content": "hi"}, signed]}) is None
    cut = {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": ""},
                                            {"type": "text", "text": NOTICE}]}
    bare = {"role": "assistant", "content": [{"type": "thinking", "thinking": "y"}]}
    sent = MessagesDialect.forwardable({"max_tokens": 5, "messages": [signed, cut, bare]})
    assert sent == {"max_tokens": 5, "messages": [signed, {"role": "assistant", "content": [cut["content"][1]]},
                                                  {"role": "assistant", "content": [
                                                      {"type": "text", "text": "[loopwarden] Output cut:"}]}]}


def test_the_cli_shows_the_channel():
    chant = {"repeated": "Wait, let me", "occurrences": 10}
    assert _summary({"type": "content", "detail": {**chant, "channel": "reasoning"}}) == '[reasoning] "Wait, let me"'
    assert _summary({"type": "content", "detail": chant}) == '"Wait, let me"'
