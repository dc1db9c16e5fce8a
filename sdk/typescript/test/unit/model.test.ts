/** ScriptedModel: answers by script position derived from the request (so a repeated
 * attempt, or a restarted Worker, gets the same answer), streams its text, and says when
 * the script has run out. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { type DeltaSink, ScriptExhausted, ScriptedModel, coerceResponse, responsesSoFar } from "../../src/index.js";

function sink(): DeltaSink & { texts: string[] } {
  const texts: string[] = [];
  return { texts, sendText: (text) => texts.push(text), send: () => {} };
}

const script = [{ toolCalls: [{ name: "lookup", arguments: { id: 7 } }] }, { content: "order 7 has shipped" }];

test("the first response of a fresh session calls the tool, with a deterministic call id", async () => {
  const model = new ScriptedModel(script);
  const request = { history: [{ type: "user", text: "where is 7?" }], summary: null, tools: [] };
  const first = await model.respond(request, sink());
  const again = await model.respond(request, sink());
  assert.deepEqual(first.toolCalls, [{ id: "c0_0", name: "lookup", arguments: { id: 7 } }]);
  assert.deepEqual(again, first); // a repeated attempt answers the same call
});

test("the position follows the assistant items of the history, and the text streams in word pieces", async () => {
  const model = new ScriptedModel(script);
  const stream = sink();
  const history = [{ type: "user" }, { type: "assistant" }, { type: "tool_result" }];
  const response = await model.respond({ history, summary: null, tools: [] }, stream);
  assert.equal(response.content, "order 7 has shipped");
  assert.deepEqual(stream.texts, ["order ", "7 ", "has ", "shipped"]);
  assert.deepEqual(response.usage, { input_items: 3, output_words: 4 });
});

test("past the end of the script it throws ScriptExhausted naming the position", async () => {
  const model = new ScriptedModel(script);
  const history = [{ type: "assistant" }, { type: "assistant" }];
  await assert.rejects(model.respond({ history, summary: null, tools: [] }, sink()), (exc: unknown) => {
    assert.ok(exc instanceof ScriptExhausted);
    assert.match(exc.message, /has 2 responses; the session asks for response #3/);
    return true;
  });
});

test("the default summary keeps the count of responses, so the position survives compaction", async () => {
  const model = new ScriptedModel(script);
  const summary = await model.summarize([{ type: "assistant" }], null);
  assert.equal(responsesSoFar([], summary), 1);
  const response = await model.respond({ history: [], summary, tools: [] }, sink());
  assert.equal(response.content, "order 7 has shipped");
});

test("a script function answers from the request; a bad response names the field", async () => {
  const model = new ScriptedModel((request) => ({ content: `${request.history.length} items` }));
  assert.equal((await model.respond({ history: [{}, {}], summary: null, tools: [] }, sink())).content, "2 items");
  assert.throws(() => new ScriptedModel([{ content: 3 } as never]), /responses\[0\]\.content must be a string/);
  assert.throws(() => coerceResponse({ text: "x" }), /unknown field 'text'/);
  assert.throws(() => coerceResponse({ toolCalls: [{ arguments: {} }] }), /toolCalls\[0\]\.name/);
});
