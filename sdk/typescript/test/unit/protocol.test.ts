/** The channel's JSON frames (docs/worker-protocol.md): what the Worker sends, what it
 * accepts from the server, and the error prefix shared with the Python SDK. */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { test } from "node:test";
import { decodeFrame, encodeFrame, parseTask, toolCallNotRunErrorPrefix } from "../../src/index.js";

test("toolCallNotRunErrorPrefix is the Python SDK's TOOL_CALL_NOT_RUN_ERROR_PREFIX", (t) => {
  const python = process.env.DEX_HA_PYTHON ?? "python3";
  let prefix: string;
  try {
    prefix = execFileSync(python, ["-c", "import dex_ha; print(dex_ha.TOOL_CALL_NOT_RUN_ERROR_PREFIX, end='')"], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    });
  } catch (exc) {
    if (process.env.DEX_HA_PYTHON) throw exc; // the repository's test run sets it: dex_ha must import
    t.skip(`dex_ha is not importable with ${python}`);
    return;
  }
  assert.equal(toolCallNotRunErrorPrefix, prefix);
});

test("a results frame carries reports, deltas, credit and the tasks ack", () => {
  const text = encodeFrame({
    reports: [
      { task_token: "t1", outcome: "complete", result: { content: "hi" } },
      { task_token: "t2", outcome: "fail", error: "boom", retryable: true, not_started: false },
    ],
    deltas: [{ task_token: "t3", deltas: [{ text: "Hel" }] }],
    credit: 2,
    ack: 4,
  });
  assert.deepEqual(JSON.parse(text), {
    type: "results",
    ack: 4,
    results: [
      { task_token: "t1", outcome: "complete", result: { content: "hi" } },
      { task_token: "t2", outcome: "fail", error: "boom", retryable: true, not_started: false },
    ],
    deltas: [{ task_token: "t3", deltas: [{ text: "Hel" }] }],
    credit: 2,
  });
});

test("a frame with nothing to report is a credit frame; zero credit is left out", () => {
  assert.deepEqual(JSON.parse(encodeFrame({ reports: [], deltas: [], credit: 8, ack: 0 })), { type: "credit", ack: 0, credit: 8 });
  assert.deepEqual(JSON.parse(encodeFrame({ reports: [], deltas: [], credit: 0, ack: 3 })), { type: "credit", ack: 3 });
});

test("the server's frames decode to their types; an unknown type is null (ignored)", () => {
  assert.deepEqual(decodeFrame('{"type":"welcome","protocol":1,"worker_id":"w","held":["a"]}'), {
    type: "welcome",
    worker_id: "w",
    held: ["a"],
  });
  assert.deepEqual(decodeFrame('{"type":"tasks","seq":3,"tasks":[{"x":1}]}'), { type: "tasks", seq: 3, tasks: [{ x: 1 }] });
  assert.deepEqual(decodeFrame('{"type":"acks","acks":[{"task_token":"t","status":409,"error":"stale_attempt"}]}'), {
    type: "acks",
    acks: [{ task_token: "t", status: 409, error: "stale_attempt" }],
  });
  assert.deepEqual(decodeFrame('{"type":"cancel","task_token":"t","reason":"cancel_requested"}'), {
    type: "cancel",
    task_token: "t",
    reason: "cancel_requested",
  });
  assert.equal(decodeFrame('{"type":"from_the_future","x":1}'), null);
});

test("a frame that does not fit names what is wrong", () => {
  assert.throws(() => decodeFrame("[1]"), /a frame must be a JSON object/);
  assert.throws(() => decodeFrame('{"kind":"tasks"}'), /frame.type must be a string/);
  assert.throws(() => decodeFrame('{"type":"tasks","seq":"3","tasks":[]}'), /tasks.seq must be an integer/);
  assert.throws(() => decodeFrame('{"type":"acks","acks":[{"task_token":"t"}]}'), /acks.acks\[0\].status/);
  assert.throws(() => decodeFrame('{"type":"cancel"}'), /cancel.task_token/);
  assert.throws(() => decodeFrame("{not json"), SyntaxError);
});

test("a task parses with defaults, and a malformed one names the field", () => {
  const task = parseTask({ task_token: "tt", session_id: "s", turn_id: "t", step_id: "st", kind: "CallTool", attempt: 1, agent: "a" });
  assert.deepEqual(task, {
    task_token: "tt",
    session_id: "s",
    turn_id: "t",
    step_id: "st",
    kind: "CallTool",
    attempt: 1,
    agent: "a",
    input: {},
    idempotency_key: null,
    deadline_ms: null,
    heartbeat_timeout_ms: 30_000,
  });
  assert.throws(() => parseTask({ ...task, step_id: "" }), /task.step_id must be a non-empty string/);
  assert.throws(() => parseTask({ ...task, attempt: "1" }), /task.attempt must be an integer/);
});
