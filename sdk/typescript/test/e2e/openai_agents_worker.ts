/**
 * A TypeScript Worker serving an `@openai/agents` agent through the adapter, as its own
 * process, for the real-process test: the agent's model is the SDK's own OpenAI model,
 * pointed at a fake OpenAI API by the client's base URL; its one function tool `lookup`
 * (a read) answers with the order and the dex-ha idempotency key of the call.
 *
 *     node dist/test/e2e/openai_agents_worker.js --url URL --agent NAME --openai-base-url URL
 *
 * Prints "registered" once started; runs until SIGTERM (a drain).
 */
import { parseArgs } from "node:util";
import { Agent as SDKAgent, OpenAIProvider, tool } from "@openai/agents";
import { Worker } from "../../src/index.js";
import { durableAgent, toolContext } from "../../src/adapters/openai-agents.js";

const { values } = parseArgs({
  options: { url: { type: "string" }, agent: { type: "string" }, "openai-base-url": { type: "string" } },
});
if (!values.url || !values.agent || !values["openai-base-url"]) {
  throw new Error("--url, --agent and --openai-base-url are required");
}

const lookup = tool({
  name: "lookup",
  description: "Where an order is",
  parameters: { type: "object", properties: { order: { type: "string" } }, required: ["order"], additionalProperties: false },
  strict: true,
  execute: async (args: any) => ({ order: args.order, status: "shipped", key: toolContext().idempotencyKey }),
});
const support = new SDKAgent({ name: values.agent, instructions: "You help customers.", model: "gpt-4.1", tools: [lookup] });
const agent = durableAgent(support, {
  effects: { lookup: "read" },
  modelProvider: new OpenAIProvider({ apiKey: "test-key", baseURL: values["openai-base-url"] }),
});

const worker = new Worker(values.url, { agents: [agent], drainTimeoutMs: 2000, onResult: () => {} });
process.on("SIGTERM", () => {
  void worker.stop().then(() => process.exit(0));
});
const running = worker.run();
console.log("registered");
await running;
