/** The Client's typed results: a session snapshot parsed into a Session. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { isIdle, parseSession } from "../../src/index.js";

const snapshot = {
  session_id: "s-1",
  namespace: "default",
  agent: "shop",
  status: "idle",
  metadata: { user: "u1" },
  created_at: 1,
  updated_at: 2,
  waiting_for: null,
  current_turn: null,
  turns: [{ turn_id: "t1", status: "completed", steps: [] }],
  history: [{ type: "user", text: "hi" }, { type: "assistant", content: "hello" }],
  summary: null,
  tool_calls: [{ call_id: "c0_0", name: "lookup", status: "succeeded", output: 7 }],
  pending_approvals: [],
  pending_questions: [],
  pending_timers: [],
  waiting_messages: [],
  a_newer_field: true,
};

test("a full snapshot parses with its fields as sent (unknown ones kept)", () => {
  const session = parseSession(snapshot);
  assert.deepEqual(session, snapshot);
  assert.equal(session.tool_calls[0]!.output, 7);
  assert.equal(isIdle(session), true);
});

test("lists an older node leaves out read as empty, optional fields as null", () => {
  const session = parseSession({ session_id: "s", agent: "a", status: "running" });
  assert.deepEqual(session.history, []);
  assert.deepEqual(session.waiting_messages, []);
  assert.equal(session.current_turn, null);
  assert.equal(session.namespace, "default");
  assert.equal(isIdle(session), false);
});

test("a snapshot that does not fit names the field", () => {
  assert.throws(() => parseSession(null), /must be an object/);
  assert.throws(() => parseSession({ agent: "a", status: "idle" }), /session.session_id must be a string/);
  assert.throws(() => parseSession({ ...snapshot, history: {} }), /session.history must be an array/);
});

test("idle with a waiting message is not idle", () => {
  assert.equal(isIdle(parseSession({ ...snapshot, waiting_messages: [{ message_id: "m" }] })), false);
});
