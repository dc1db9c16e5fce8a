/** Agent and tool registration: effects, policy fields, the definition the server gets,
 * and the checks that refuse a bad declaration before the Worker ever runs. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Agent, EFFECTS, ToolContext, ToolError } from "../../src/index.js";

function context(): ToolContext {
  return new ToolContext({
    sessionId: "s1",
    turnId: "t1",
    stepId: "st1",
    callId: "c0_0",
    attempt: 1,
    idempotencyKey: "s1:c0_0",
    workerId: "w1",
  });
}

test("the three effects are read, idempotent_write and write", () => {
  assert.deepEqual([...EFFECTS], ["read", "idempotent_write", "write"]);
});

test("each effect registers and appears in the agent's definition", () => {
  const agent = new Agent("shop");
  agent.tool({ effect: "read" }, function lookup() {
    return 1;
  });
  agent.tool({ effect: "idempotent_write", name: "charge", maxAttempts: 3 }, () => 2);
  agent.tool({ effect: "write", name: "ship", approval: true, startToCloseMs: 5000, description: "ships it" }, () => 3);
  assert.deepEqual([...agent.tools.keys()], ["lookup", "charge", "ship"]);
  assert.deepEqual(agent.definition(), {
    tools: [
      { name: "lookup", effect: "read", approval: false, inline: false, input_schema: { type: "object" } },
      { name: "charge", effect: "idempotent_write", approval: false, inline: false, input_schema: { type: "object" }, max_attempts: 3 },
      {
        name: "ship",
        effect: "write",
        approval: true,
        inline: false,
        input_schema: { type: "object" },
        description: "ships it",
        start_to_close_ms: 5000,
      },
    ],
  });
});

test("an unknown or missing effect is refused, naming the effects", () => {
  const agent = new Agent("a");
  assert.throws(() => agent.tool({ effect: "delete" as never, name: "x" }, () => 0), /effect must be one of read, idempotent_write, write/);
  assert.throws(() => agent.tool({} as never, () => 0), /effect must be one of/);
});

test("a second tool of the same name, a built-in name or an anonymous function is refused", () => {
  const agent = new Agent("a");
  agent.tool({ effect: "read", name: "x" }, () => 0);
  assert.throws(() => agent.tool({ effect: "read", name: "x" }, () => 0), /already has a tool named 'x'/);
  assert.throws(() => agent.tool({ effect: "read", name: "ask_user" }, () => 0), /built-in tool/);
  assert.throws(() => agent.tool({ effect: "read" }, (() => () => 0)()), /a tool needs a name/);
});

test("an inline tool cannot need approval; policy numbers must be positive integers", () => {
  const agent = new Agent("a");
  assert.throws(() => agent.tool({ effect: "read", name: "x", inline: true, approval: true }, () => 0), /approval/);
  assert.throws(() => agent.tool({ effect: "read", name: "y", maxAttempts: 0 }, () => 0), /maxAttempts/);
  assert.throws(() => new Agent("bad/name"), /without '\/'/);
  assert.throws(() => new Agent("a", { compaction: { max_items: 2, other: 1 } as never }), /unknown key 'other'/);
});

test("a tool gets its context and arguments, and its schema is checked before it runs", async () => {
  const agent = new Agent("a");
  const seen: unknown[] = [];
  const tool = agent.tool(
    { effect: "write", name: "send", inputSchema: { type: "object", properties: { to: {} }, required: ["to"], additionalProperties: false } },
    (ctx, args) => {
      seen.push([ctx.idempotencyKey, args]);
      return "sent";
    },
  );
  assert.equal(await tool.invoke(context(), { to: "bob" }), "sent");
  await assert.rejects(tool.invoke(context(), {}), /missing required argument 'to'/);
  await assert.rejects(tool.invoke(context(), { to: "x", cc: "y" }), /unexpected argument 'cc'/);
  await assert.rejects(tool.invoke(context(), []), /arguments must be an object/);
  assert.deepEqual(seen, [["s1:c0_0", { to: "bob" }]]);
});

test("ToolError carries the tool's own message and is an Error", async () => {
  const agent = new Agent("a");
  const tool = agent.tool({ effect: "read", name: "fails" }, () => {
    throw new ToolError("no such order");
  });
  await assert.rejects(tool.invoke(context(), {}), (exc: unknown) => {
    assert.ok(exc instanceof ToolError && exc instanceof Error);
    assert.equal(exc.name, "ToolError");
    assert.equal(exc.message, "no such order");
    return true;
  });
  assert.throws(() => new ToolError(42 as never), TypeError);
});

test("ctx.ask() ends the first run with the question and returns the answer on the next", async () => {
  const first = context();
  await assert.rejects(first.ask("which size?"), (exc: unknown) => (exc as { question: unknown }).question === "which size?");
  const answered = new ToolContext({ ...contextInit(), answer: "XL", hasAnswer: true });
  assert.equal(await answered.ask("which size?"), "XL");
});

test("a long-running tool's handle and a poll function's pending carry their intervals", () => {
  const ctx = context();
  assert.deepEqual({ ...ctx.taskHandle({ job: 1 }, 250) }, { handle: { job: 1 }, pollAfterMs: 250 });
  assert.equal(ctx.pending().pollAfterMs, null);
  assert.throws(() => ctx.taskHandle(null), /handle must not be null/);
  assert.throws(() => ctx.pending(-1), /pollAfterMs/);
});

function contextInit() {
  return { sessionId: "s1", turnId: "t1", stepId: "st1", callId: "c", attempt: 2, idempotencyKey: "s1:c", workerId: "w" };
}
