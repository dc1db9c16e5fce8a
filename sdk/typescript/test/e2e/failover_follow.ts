/**
 * The TypeScript DexClient following one session's events as its own process, for the
 * failover tests: given every node URL, it prints each event as a JSON line the moment it
 * comes (committed ones with their id; live deltas with id null), and exits 0 after the
 * session's `turn_completed` (or 1 when the deadline passes first).
 *
 *     node dist/test/e2e/failover_follow.js --urls URL,URL,URL --token T --session ID
 */
import { parseArgs } from "node:util";
import { DexClient } from "../../src/index.js";

const DEADLINE_MS = 60_000;

const { values } = parseArgs({ options: { urls: { type: "string" }, token: { type: "string" }, session: { type: "string" } } });
if (!values.urls || !values.token || !values.session) throw new Error("--urls, --token and --session are required");

const client = new DexClient(values.urls.split(","), { token: values.token, backoffMaxMs: 200 });
const stop = new AbortController();
const deadline = setTimeout(() => stop.abort(), DEADLINE_MS);
let completed = false;
for await (const event of client.events(values.session, { signal: stop.signal })) {
  console.log(JSON.stringify({ id: event.id, type: event.type, attempt: event.attempt }));
  if (event.type === "turn_completed") {
    completed = true;
    break;
  }
}
clearTimeout(deadline);
process.exit(completed ? 0 : 1);
