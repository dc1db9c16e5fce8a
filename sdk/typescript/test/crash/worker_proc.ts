/**
 * The TypeScript Worker as its own OS process, for the crash cells: the real SDK running
 * the row's agent (agents.ts), writing its side effects to the ledger.
 *
 *     node dist/test/crash/worker_proc.js --urls URL[,URL...] --ledger FILE --row R05 \
 *         --agent NAME --column worker_kill [--token T] [--max-concurrency N]
 *
 * It runs until SIGTERM (a drain) or SIGKILL (the crash). DEX_HA_FAILPOINTS arms the
 * Worker's failpoints: the process then exits with code 99 at that moment.
 */
import { parseArgs } from "node:util";
import { Worker } from "../../src/index.js";
import { AGENTS, Kit } from "./agents.js";
import { Ledger } from "./ledger.js";

const { values } = parseArgs({
  options: {
    urls: { type: "string" },
    token: { type: "string" },
    ledger: { type: "string" },
    row: { type: "string" },
    agent: { type: "string" },
    column: { type: "string" },
    "heartbeat-interval": { type: "string" }, // HTTP Workers only: the channel sends no heartbeats
    "max-concurrency": { type: "string" },
  },
});
for (const required of ["urls", "ledger", "row", "agent", "column"] as const) {
  if (!values[required]) throw new Error(`--${required} is required`);
}
const build = AGENTS[values.row!];
if (build === undefined) throw new Error(`--row: no agent for ${values.row} (known: ${Object.keys(AGENTS).join(", ")})`);

const worker = new Worker(values.urls!.split(","), {
  token: values.token ?? null,
  agents: [build(new Kit(new Ledger(values.ledger!), values.column!), values.agent!)],
  drainTimeoutMs: 1000,
  backoffMaxMs: 200, // reconnect fast after a server restart or a takeover
  ...(values["max-concurrency"] ? { maxConcurrency: Number(values["max-concurrency"]) } : {}),
});
process.on("SIGTERM", () => {
  void worker.stop().then(() => process.exit(0));
});
await worker.run();
