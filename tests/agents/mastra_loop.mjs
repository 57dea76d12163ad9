// A Mastra agent (@mastra/core 0.24, pinned in the Makefile) with one tool and Mastra's defaults, over the AI SDK's
// OpenAI provider: `openai(model)` speaks the Responses API (Mastra's default), `openai.chat(model)` chat.
//
//   node mastra_loop.mjs BASE_URL responses|chat NOTES_FILE     (MAX_STEPS=N in the environment to pass maxSteps)
//
// Prints one JSON line: the steps taken, the finish reason, how often the tool ran, and what was thrown.
import { Agent } from "@mastra/core/agent";
import { createTool } from "@mastra/core/tools";
import { createOpenAI } from "@ai-sdk/openai";
import { readFile } from "node:fs/promises";
import { z } from "zod";

const [baseURL, api, notes] = process.argv.slice(2);
const openai = createOpenAI({ baseURL, apiKey: "sk-local-1" });
let ran = 0;
const agent = new Agent({
  name: "notes-agent",
  instructions: "You help with the user's notes. Use read_file to read files.",
  model: api === "chat" ? openai.chat("gpt-4o") : openai("gpt-4o"),
  tools: {
    read_file: createTool({
      id: "read_file",
      description: "Read a text file.",
      inputSchema: z.object({ path: z.string() }),
      execute: async ({ context }) => { ran += 1; return { content: await readFile(context.path, "utf8") }; },
    }),
  },
});
const out = { ran: 0 };
try {
  const result = await agent.generate(`Add the two columns of the table in ${notes}.`,
    process.env.MAX_STEPS ? { maxSteps: Number(process.env.MAX_STEPS) } : undefined);
  Object.assign(out, { steps: result.steps.length, finishReason: result.finishReason });
} catch (error) {
  Object.assign(out, { thrown: String(error?.message ?? error), status: error?.statusCode ?? null });
}
out.ran = ran;
console.log(JSON.stringify(out));
