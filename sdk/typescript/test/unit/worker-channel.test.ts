/** The Worker on the channel against a fake node (an HTTP server with a WebSocket route):
 * after its channel breaks and opens again, the attempts the node's welcome does not list
 * as held (a takeover failed them) are stopped and report nothing; a held one runs on. */
import assert from "node:assert/strict";
import { type AddressInfo } from "node:net";
import { createServer } from "node:http";
import { test } from "node:test";
import { type WebSocket, WebSocketServer } from "ws";
import { Agent, ScriptedModel, Worker } from "../../src/index.js";

const DEADLINE_MS = 10_000;
const quiet = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

async function until(check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + DEADLINE_MS;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${DEADLINE_MS} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

function toolTask(token: string): Record<string, unknown> {
  return {
    task_token: token,
    session_id: "s1",
    turn_id: "t1",
    step_id: `st-${token}`,
    kind: "CallTool",
    attempt: 1,
    agent: "a",
    input: { call_id: token, name: "hang", arguments: {} },
    idempotency_key: `s1:${token}`,
  };
}

test("a reconnected channel stops the attempts the node no longer holds and keeps the held ones", async () => {
  const http = createServer((req, res) => {
    req.resume();
    res.writeHead(200, { "Content-Type": "application/json" }).end("{}"); // PUT /v1/agents/a
  });
  const server = new WebSocketServer({ server: http });
  const channels: WebSocket[] = [];
  const received: Array<Array<Record<string, any>>> = []; // the frames of each channel
  server.on("connection", (ws) => {
    const frames: Array<Record<string, any>> = [];
    channels.push(ws);
    received.push(frames);
    ws.on("message", (data) => frames.push(JSON.parse(data.toString())));
    const held = channels.length === 1 ? [] : ["held"]; // after the break, the node holds one attempt
    ws.send(JSON.stringify({ type: "welcome", protocol: 1, worker_id: "w1", node_id: "n1", term: channels.length, grace_ms: 1000, held }));
    if (channels.length === 1) ws.send(JSON.stringify({ type: "tasks", seq: 1, tasks: [toolTask("held"), toolTask("lost")] }));
  });
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;

  const started = new Set<string>();
  const stopped = new Set<string>();
  const agent = new Agent("a", { model: new ScriptedModel([{ content: "unused" }]) });
  agent.tool({ effect: "read", name: "hang" }, async (ctx) => {
    started.add(ctx.callId!);
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
    stopped.add(ctx.callId!);
    throw ctx.signal.reason;
  });
  const worker = new Worker(url, { agents: [agent], token: null, maxConcurrency: 2, drainTimeoutMs: 100, backoffMaxMs: 100, logger: quiet });
  const running = worker.run();
  try {
    await until(() => started.size === 2, "both attempts to start");
    channels[0]!.terminate(); // the node died: the connection breaks (1006)
    await until(() => channels.length === 2 && stopped.has("lost"), "the attempt the new channel does not hold to stop");
    const credit = () => received[1]!.reduce((sum, frame) => sum + (frame.credit ?? 0), 0);
    await until(() => credit() === 1, "the stopped attempt's slot (of two) to come back as credit");
    assert.deepEqual([...stopped], ["lost"], "the held attempt runs on");
    assert.equal(worker.running, 1);
    const reports = received.flat().flatMap((frame) => frame.results ?? []);
    assert.deepEqual(reports, [], "a stopped attempt that is no longer this Worker's reports nothing");
  } finally {
    await worker.stop();
    await running;
    server.close();
    http.close();
  }
});
