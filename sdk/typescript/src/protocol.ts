/**
 * The shapes of the Worker channel (docs/worker-protocol.md in the dex-ha repository):
 * a task handed to the Worker, and a report of how its attempt ended.
 */

export const CHANNEL_PATH = "/v1/worker/channel";
export const CLOSE_NOT_ACTIVE = 4000;
export const MAX_BATCH = 256;
export const CANCEL_REQUESTED = "cancel_requested";

export type TaskKind = "RunModel" | "CallTool" | "CallSingleAttemptTool" | "PollToolTask" | "CompactContext";

/** One attempt of one step, as the server hands it out. */
export interface Task {
  task_token: string;
  session_id: string;
  turn_id: string;
  step_id: string;
  kind: TaskKind | string;
  attempt: number;
  agent: string | null;
  input: Record<string, any>;
  idempotency_key: string | null;
  deadline_ms: number | null;
  heartbeat_timeout_ms: number;
}

/** A task from its JSON; TypeError naming the field that does not fit. */
export function parseTask(raw: unknown): Task {
  if (raw === null || typeof raw !== "object") throw new TypeError("a task must be an object");
  const t = raw as Record<string, any>;
  for (const key of ["task_token", "session_id", "turn_id", "step_id", "kind"]) {
    if (typeof t[key] !== "string" || !t[key]) throw new TypeError(`task.${key} must be a non-empty string`);
  }
  if (!Number.isInteger(t.attempt)) throw new TypeError("task.attempt must be an integer");
  const input = t.input ?? {};
  if (typeof input !== "object" || Array.isArray(input)) throw new TypeError("task.input must be an object");
  return {
    task_token: t.task_token,
    session_id: t.session_id,
    turn_id: t.turn_id,
    step_id: t.step_id,
    kind: t.kind,
    attempt: t.attempt,
    agent: typeof t.agent === "string" ? t.agent : null,
    input,
    idempotency_key: typeof t.idempotency_key === "string" ? t.idempotency_key : null,
    deadline_ms: typeof t.deadline_ms === "number" ? t.deadline_ms : null,
    heartbeat_timeout_ms: typeof t.heartbeat_timeout_ms === "number" ? t.heartbeat_timeout_ms : 30_000,
  };
}

export function describeTask(task: Task): string {
  return `${task.kind} ${task.step_id}#${task.attempt}`;
}

/** How an attempt ended: `complete` with a result, or `fail`. */
export type Report =
  | { task_token: string; outcome: "complete"; result: unknown }
  | { task_token: string; outcome: "fail"; error: string; retryable: boolean; not_started: boolean };

export interface Ack {
  task_token: string;
  status: number;
  error?: string;
  message?: string;
}
