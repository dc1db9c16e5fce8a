/**
 * A TypeScript Worker as its own process, for the failover tests on a three-node cluster:
 * given every node URL, it serves one agent whose model calls `slow_put` (an idempotent
 * write) once per user message, then answers "all done". The tool's first attempt runs
 * until the Worker stops it (the node that handed it out died: the attempt is no longer
 * this Worker's); later attempts return at once. Each run, and each stop, is a line of the
 * ledger (test/crash/ledger.ts), which records this process's pid.
 *
 *     node dist/test/e2e/failover_worker.js --urls URL,URL,URL --token T --agent NAME --ledger FILE
 *
 * Runs until SIGTERM (a drain).
 */
import { parseArgs } from "node:util";
import { Agent, ScriptedModel, Worker } from "../../src/index.js";
import { Ledger } from "../crash/ledger.js";

const TICK_MS = 50;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const { values } = parseArgs({
  options: { urls: { type: "string" }, token: { type: "string" }, agent: { type: "string" }, ledger: { type: "string" } },
});
if (!values.urls || !values.token || !values.agent || !values.ledger) throw new Error("--urls, --token, --agent and --ledger are required");
const ledger = new Ledger(values.ledger);

const model = new ScriptedModel((request) => {
  const last = request.history[request.history.length - 1];
  if (last?.type === "user") return { content: "on it", toolCalls: [{ id: `c-${last.text}`, name: "slow_put", arguments: { item: last.text } }] };
  return { content: "all done" };
});
const agent = new Agent(values.agent, { model });
agent.tool({ effect: "idempotent_write", name: "slow_put" }, async (ctx, args) => {
  const run = { call_id: ctx.callId, key: ctx.idempotencyKey, attempt: ctx.attempt };
  ledger.record("tool", "slow_put", "started", run);
  if (ctx.attempt === 1) {
    while (!ctx.cancelled) await sleep(TICK_MS);
    ledger.record("tool", "slow_put", "cancelled", run);
    throw ctx.signal.reason;
  }
  return `stored ${args.item}`;
});

const worker = new Worker(values.urls.split(","), { token: values.token, agents: [agent], drainTimeoutMs: 1000, backoffMaxMs: 200 });
process.on("SIGTERM", () => {
  void worker.stop().then(() => process.exit(0));
});
await worker.run();
