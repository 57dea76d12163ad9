// One turn through the Vercel AI SDK, as an application makes it, printed as one JSON line for
// tests/agents/test_reasoning_clients.py to read. The packages are those `make agents-check` installs into
// .venv-agents/node; the script is read from stdin there, so that its imports resolve against them:
//
//     cd .venv-agents/node && node --input-type=module - <chat|anthropic> <streamText|conversation|generateText> \
//         <base URL, e.g. http://127.0.0.1:8080/v1> <session> < ../../tests/agents/ai_sdk_reasoning.mjs
//
// `chat` is the OpenAI-compatible provider (Chat Completions; it reads the reasoning from `reasoning_content`
// or `reasoning`), `anthropic` the Anthropic provider with extended thinking on. The SDK's own retries are
// left at their default (two), so a turn it would retry shows in the upstream's request count. Prints
// {text, reasoning, finishReason, rawFinishReason, errors, parts} (parts: how many stream or content parts of
// each type; `conversation` adds the same for the next turn as `next`), or {thrown} when a call threw.

import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText } from "ai";

const [api, call, baseURL, session] = process.argv.slice(2);
const headers = { "X-Loopwarden-Session": session };

function model() {
  if (api === "chat") {
    return createOpenAICompatible({ name: "local", baseURL, apiKey: "sk-local-1", headers }).chatModel("qwen3");
  }
  if (api === "anthropic") {
    return createAnthropic({ baseURL, apiKey: "sk-ant-1", headers })("claude-sonnet-4-5");
  }
  throw new Error(`unknown api ${api}`);
}

const settings = {
  model: model(),
  maxOutputTokens: 8000,
  providerOptions: { anthropic: { thinking: { type: "enabled", budgetTokens: 6000 } } },
};
const prompt = [{ role: "user", content: "Add the first two columns of the table." }];

async function streamed(messages) {
  const errors = [];
  const parts = {};
  const onError = ({ error }) => errors.push(`${error?.message ?? error}`);
  const result = streamText({ ...settings, messages, onError });
  for await (const part of result.fullStream) {
    parts[part.type] = (parts[part.type] ?? 0) + 1;
  }
  return {
    text: await result.text,
    reasoning: await result.reasoningText,
    finishReason: await result.finishReason,
    rawFinishReason: await result.rawFinishReason,
    errors,
    parts,
    messages: (await result.response).messages,
  };
}

async function main() {
  if (call === "streamText") {
    const { messages, ...turn } = await streamed(prompt);
    return turn;
  }
  if (call === "conversation") {
    // The turn, then the next one: the cut turn as the SDK keeps it, and the user's next message.
    const { messages, ...turn } = await streamed(prompt);
    const { messages: _, ...next } = await streamed([...prompt, ...messages, { role: "user", content: "Try again." }]);
    return { ...turn, next };
  }
  if (call === "generateText") {
    const result = await generateText({ ...settings, messages: prompt });
    const parts = {};
    for (const part of result.content) parts[part.type] = (parts[part.type] ?? 0) + 1;
    return {
      text: result.text,
      reasoning: result.reasoningText,
      finishReason: result.finishReason,
      rawFinishReason: result.rawFinishReason,
      errors: [],
      parts,
    };
  }
  throw new Error(`unknown call ${call}`);
}

try {
  console.log(JSON.stringify(await main()));
} catch (error) {
  console.log(JSON.stringify({ thrown: `${error?.name}: ${error?.message ?? error}` }));
}
