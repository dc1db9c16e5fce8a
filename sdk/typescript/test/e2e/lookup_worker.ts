/**
 * A TypeScript Worker as its own process, for the real-process tests: one agent whose
 * scripted model calls the `lookup` tool, then answers with what it returned.
 *
 *     node dist/test/e2e/lookup_worker.js --url URL --agent NAME
 *
 * Prints "registered" once the agent is registered; runs until SIGTERM (a drain).
 */
import { parseArgs } from "node:util";
import { Agent, ScriptedModel, ToolError, Worker } from "../../src/index.js";

const { values } = parseArgs({ options: { url: { type: "string" }, agent: { type: "string" } } });
if (!values.url || !values.agent) throw new Error("--url and --agent are required");

const model = new ScriptedModel((request) => {
  const last = request.history[request.history.length - 1];
  if (last?.type === "user") return { toolCalls: [{ name: "lookup", arguments: { order: last.text } }] };
  return { content: `lookup said ${JSON.stringify(last?.output ?? last?.error)}` };
});
const agent = new Agent(values.agent, { model });
agent.tool({ effect: "read", name: "lookup", description: "Where an order is" }, (ctx, args) => {
  if (args.order === "unknown") throw new ToolError("no such order");
  return { order: args.order, status: "shipped", key: ctx.idempotencyKey };
});

const worker = new Worker(values.url, {
  agents: [agent],
  drainTimeoutMs: 2000,
  onResult: () => {},
});
process.on("SIGTERM", () => {
  void worker.stop().then(() => process.exit(0));
});
const running = worker.run();
console.log("registered");
await running;
