/**
 * Quick start in TypeScript: an agent with two tools, run by a Worker, driven by a client.
 *
 *     dex-ha dev &                                   # in another terminal: the server on :8801
 *     cd examples/typescript && npm install && npm run build
 *     node dist/agent.js                             # or: node dist/agent.js http://127.0.0.1:8801
 *
 * (`npm install` links the SDK from ../../sdk/typescript: build it first, see its README.)
 * With a cluster that has tokens, source the file that `dex-ha cluster up` wrote first; the
 * SDK then reads the node URLs (DEX_HA_URLS) and the tokens (DEX_HA_WORKER_TOKEN for the
 * Worker, DEX_HA_CLIENT_TOKEN for the client, else DEX_HA_TOKEN) from the environment.
 *
 * The model is scripted (no API key needed): it calls a read tool and a write tool that
 * needs approval, the script approves it, and the model answers. Swap ScriptedModel for your
 * own object with `respond(request, stream)` and `summarize(history, summary)` to use a real
 * model, or run an `@openai/agents` agent with `durableAgent` from `@dex-ha/sdk/openai-agents`.
 */
import { Agent, DexClient, type ModelRequest, ScriptedModel, Worker } from "@dex-ha/sdk";

function script(request: ModelRequest) {
  const last = request.history[request.history.length - 1];
  if (last?.type === "user") {
    return {
      content: "Let me check the order and refund it.",
      toolCalls: [
        { id: "lookup-1", name: "lookup_order", arguments: { order_id: "A17" } },
        { id: "refund-1", name: "refund", arguments: { order_id: "A17", cents: 1299 } },
      ],
    };
  }
  return { content: "Done: order A17 is refunded." };
}

const agent = new Agent("support", { model: new ScriptedModel(script) });

agent.tool({ effect: "read", name: "lookup_order" }, async (ctx, args) => {
  return { order_id: args.order_id, status: "delivered" };
});

// A write runs at most once, and only after a person approves it.
agent.tool({ effect: "write", name: "refund", approval: true }, async (ctx, args) => {
  // ctx.idempotencyKey is "{session_id}:{call_id}": pass it to the payment API.
  return `refunded ${args.cents} cents on ${args.order_id} (key ${ctx.idempotencyKey})`;
});

async function main(urls: string | undefined): Promise<void> {
  // undefined: DEX_HA_URLS, else http://127.0.0.1:8801 (the tokens are read the same way).
  const worker = new Worker(urls ?? null, { agents: [agent] });
  const running = worker.run();
  const client = new DexClient(urls ?? null);
  const session = await client.createSession("support");
  const sessionId = session.session_id;
  await client.sendMessage(sessionId, "Please refund order A17");
  for await (const event of client.events(sessionId)) {
    const shown = event.type === "delta" ? (event.data.text ?? "") : JSON.stringify(event.data);
    console.log(`${event.type.padStart(20)}  ${shown}`);
    if (event.type === "approval_requested") await client.approve(sessionId, event.data.call_id);
    if (event.type === "turn_completed" || event.type === "turn_failed") break;
  }
  const snapshot = await client.waitUntilIdle(sessionId);
  console.log("answer:", snapshot.history[snapshot.history.length - 1]?.content);
  await worker.stop();
  await running;
}

await main(process.argv[2]);
