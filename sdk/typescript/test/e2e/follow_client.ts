/**
 * The TypeScript DexClient as its own process, for the real-process tests: create a
 * session, send one message, follow the session's events until the turn completes, then
 * print one JSON line: the committed event types seen, the text deltas joined, and the
 * final snapshot.
 *
 *     node dist/test/e2e/follow_client.js --url URL --agent NAME --text TEXT
 */
import { parseArgs } from "node:util";
import { DexClient } from "../../src/index.js";

const { values } = parseArgs({ options: { url: { type: "string" }, agent: { type: "string" }, text: { type: "string" } } });
if (!values.url || !values.agent || values.text === undefined) throw new Error("--url, --agent and --text are required");

const client = new DexClient(values.url);
const created = await client.createSession(values.agent, { metadata: { from: "typescript" } });
const sessionId = created.session_id;
const accepted = await client.sendMessage(sessionId, values.text);
const types: string[] = [];
let text = "";
const stop = new AbortController();
const deadline = setTimeout(() => stop.abort(), 30_000);
for await (const event of client.events(sessionId, { signal: stop.signal })) {
  if (event.id === null) {
    if (typeof event.data.text === "string") text += event.data.text;
    continue;
  }
  types.push(event.type);
  if (event.type === "turn_completed" || event.type === "turn_failed") break;
}
clearTimeout(deadline);
const snapshot = await client.waitUntilIdle(sessionId, 10_000);
console.log(JSON.stringify({ created, accepted, types, text, snapshot }));
