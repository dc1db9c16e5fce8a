/** The @openai/agents adapter without a network: the agent's Model is a fake that records
 * the requests the adapter builds and answers with scripted stream events. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Agent as SDKAgent, tool } from "@openai/agents";
import type { Model as SDKModel, ModelRequest as SDKModelRequest, ModelResponse as SDKModelResponse } from "@openai/agents";
import { type DeltaSink, NonRetryableError, ToolContext, ToolError } from "../../src/index.js";
import { durableAgent, toolContext } from "../../src/adapters/openai-agents.js";

const usage = { requests: 1, inputTokens: 10, outputTokens: 4, totalTokens: 14 };

class FakeModel implements SDKModel {
  readonly requests: SDKModelRequest[] = [];
  constructor(private readonly answer: (request: SDKModelRequest) => SDKModelResponse | Error) {}

  async getResponse(request: SDKModelRequest): Promise<SDKModelResponse> {
    this.requests.push(request);
    const answer = this.answer(request);
    if (answer instanceof Error) throw answer;
    return answer;
  }

  async *getStreamedResponse(request: SDKModelRequest) {
    const response = await this.getResponse(request);
    for (const item of response.output as any[]) {
      for (const part of item.content ?? []) if (part.type === "output_text") yield { type: "output_text_delta" as const, delta: part.text };
    }
    yield { type: "response_done" as const, response: { ...response, id: "resp_1" } } as any;
  }
}

function textAnswer(text: string): SDKModelResponse {
  return { usage: usage as any, output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text }] }] };
}

function sink(): DeltaSink & { texts: string[] } {
  const texts: string[] = [];
  return { texts, sendText: (text) => texts.push(text), send: () => {} };
}

function contextFor(callId: string): ToolContext {
  return new ToolContext({ sessionId: "s1", turnId: "t1", stepId: "st1", callId, attempt: 1, idempotencyKey: `s1:${callId}`, workerId: "w1" });
}

const lookup = tool({
  name: "lookup",
  description: "Where an order is",
  parameters: { type: "object", properties: { order: { type: "string" } }, required: ["order"], additionalProperties: false },
  strict: true,
  execute: async (args: any) => ({ order: args.order, key: toolContext().idempotencyKey }),
});

test("each tool is declared with its effect (a write by default) and its schema", () => {
  const refund = tool({ name: "refund", description: "Refund", parameters: { type: "object", properties: {}, required: [], additionalProperties: false }, strict: true, execute: async () => "ok" });
  const agent = durableAgent(new SDKAgent({ name: "shop", tools: [lookup, refund] }), { effects: { lookup: "read" }, approvals: ["refund"] });
  const tools = (agent.definition().tools as any[]).map((t) => [t.name, t.effect, t.approval, t.input_schema.required]);
  assert.deepEqual(tools, [
    ["lookup", "read", false, ["order"]],
    ["refund", "write", true, []],
  ]);
});

test("what cannot run durably is refused, naming it", () => {
  const other = new SDKAgent({ name: "other" });
  assert.throws(() => durableAgent(new SDKAgent({ name: "a", handoffs: [other] })), /handoffs are not supported/);
  assert.throws(() => durableAgent(new SDKAgent({ name: "a", tools: [lookup] }), { effects: { lookp: "read" } }), /'lookp' is not a function tool/);
  assert.throws(() => durableAgent(new SDKAgent({ name: "a", tools: [lookup] }), { effects: { lookup: "reed" as any } }), /effect must be one of/);
  const askUser = tool({ name: "ask_user", description: "", parameters: { type: "object", properties: {}, required: [], additionalProperties: false }, strict: true, execute: async () => "" });
  assert.throws(() => durableAgent(new SDKAgent({ name: "a", tools: [askUser] })), /built-in tool/);
  assert.throws(() => durableAgent(new SDKAgent({ name: "a", toolUseBehavior: "stop_on_first_tool" })), /run_llm_again/);
});

test("a model call sends the history in model order with the agent's instructions and tools, and streams the text", async () => {
  const model = new FakeModel(() => textAnswer("It has shipped."));
  const agent = durableAgent(new SDKAgent({ name: "shop", instructions: "Be brief.", model, tools: [lookup] }), { effects: { lookup: "read" } });
  const stream = sink();
  const history = [
    { type: "user", text: "where is A-17?" },
    { type: "assistant", content: "", tool_calls: [{ id: "call_1", name: "lookup", arguments: { order: "A-17" } }] },
    { type: "note", text: "a note between call and result" },
    { type: "tool_result", call_id: "call_1", name: "lookup", status: "succeeded", output: { status: "shipped" } },
  ];
  const builtin = { name: "ask_user", description: "Ask the user", input_schema: { type: "object" }, builtin: true };
  const response = await agent.model!.respond({ history, summary: "earlier talk", tools: [builtin] }, stream);
  assert.deepEqual(response, { content: "It has shipped.", toolCalls: [], usage: { input_tokens: 10, output_tokens: 4, total_tokens: 14 } });
  assert.deepEqual(stream.texts, ["It has shipped."]);
  const request = model.requests[0]!;
  assert.equal(request.systemInstructions, "Be brief.");
  assert.deepEqual(
    request.tools.map((t) => t.name),
    ["lookup", "ask_user"],
  );
  assert.deepEqual(
    (request.input as any[]).map((item) => [item.type, item.role ?? item.callId, item.output ?? item.content]),
    [
      ["message", "system", "Summary of the conversation before the messages below:\nearlier talk"],
      ["message", "user", "where is A-17?"],
      ["function_call", "call_1", undefined],
      ["function_call_result", "call_1", '{"status":"shipped"}'],
      ["message", "system", "a note between call and result"],
    ],
  );
  assert.equal((request as any)._internal.runnerManagedRetry, true); // the server owns retries
});

test("a model's function calls become the step's tool calls", async () => {
  const call = { type: "function_call", callId: "call_9", name: "lookup", arguments: '{"order":"B-2"}', status: "completed" };
  const model = new FakeModel(() => ({ usage: usage as any, output: [call as any] }));
  const agent = durableAgent(new SDKAgent({ name: "shop", model, tools: [lookup] }));
  const response = await agent.model!.respond({ history: [{ type: "user", text: "B-2?" }], summary: null, tools: [] }, sink());
  assert.deepEqual(response.toolCalls, [{ id: "call_9", name: "lookup", arguments: { order: "B-2" } }]);
});

test("an API error another attempt would get again fails for good; others stay retryable", async () => {
  const failing = (status: number) => Object.assign(new Error("bad key"), { status });
  for (const [status, nonRetryable] of [
    [401, true],
    [500, false],
  ] as const) {
    const agent = durableAgent(new SDKAgent({ name: "shop", model: new FakeModel(() => failing(status)) }));
    await assert.rejects(agent.model!.respond({ history: [], summary: null, tools: [] }, sink()), (error: Error) => {
      assert.equal(error instanceof NonRetryableError, nonRetryable);
      return true;
    });
  }
});

test("a tool step runs the SDK tool with the model's arguments and the dex-ha context", async () => {
  const agent = durableAgent(new SDKAgent({ name: "shop", tools: [lookup] }), { effects: { lookup: "read" } });
  const output = await agent.tools.get("lookup")!.invoke(contextFor("call_3"), { order: "C-3" });
  assert.deepEqual(output, { order: "C-3", key: "s1:call_3" });
});

test("a tool the SDK says needs approval never runs without a dex-ha approval", async () => {
  let ran = false;
  const wire = tool({
    name: "wire",
    description: "",
    parameters: { type: "object", properties: {}, required: [], additionalProperties: false },
    strict: true,
    needsApproval: true,
    execute: async () => {
      ran = true;
      return "sent";
    },
  });
  const agent = durableAgent(new SDKAgent({ name: "bank", tools: [wire] }));
  await assert.rejects(agent.tools.get("wire")!.invoke(contextFor("c1"), {}), (error: Error) => error instanceof ToolError && /approvals/.test(error.message));
  assert.equal(ran, false);
  const approved = durableAgent(new SDKAgent({ name: "bank", tools: [wire] }), { approvals: ["wire"] });
  assert.equal(await approved.tools.get("wire")!.invoke(contextFor("c1"), {}), "sent");
});

test("the summary of compaction comes from the agent's model", async () => {
  const model = new FakeModel(() => textAnswer("they talked about A-17"));
  const agent = durableAgent(new SDKAgent({ name: "shop", model }));
  assert.equal(await agent.model!.summarize([{ type: "user", text: "A-17?" }], null), "they talked about A-17");
  assert.match((model.requests[0]!.input as any[])[0].content, /User: A-17\?/);
});
