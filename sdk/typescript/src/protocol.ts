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

/** A frame from the server, checked: the fields the Worker relies on have their types.
 * `null` stands for a frame type this Worker does not know (a newer node): ignored. */
export type ServerFrame =
  | { type: "welcome"; worker_id: string; held: string[] }
  | { type: "tasks"; seq: number; tasks: unknown[] }
  | { type: "acks"; acks: Ack[] }
  | { type: "cancel"; task_token: string; reason: string };

/** A JSON frame of the channel (a text message) as a ServerFrame; TypeError naming the
 * field that does not fit, null for an unknown type. */
export function decodeFrame(text: string): ServerFrame | null {
  const frame: unknown = JSON.parse(text);
  if (frame === null || typeof frame !== "object" || Array.isArray(frame)) throw new TypeError("a frame must be a JSON object");
  const f = frame as Record<string, any>;
  if (typeof f.type !== "string") throw new TypeError("frame.type must be a string");
  switch (f.type) {
    case "welcome":
      return { type: "welcome", worker_id: String(f.worker_id ?? ""), held: Array.isArray(f.held) ? f.held.map(String) : [] };
    case "tasks":
      if (!Number.isInteger(f.seq)) throw new TypeError("tasks.seq must be an integer");
      if (!Array.isArray(f.tasks)) throw new TypeError("tasks.tasks must be an array");
      return { type: "tasks", seq: f.seq, tasks: f.tasks };
    case "acks":
      if (!Array.isArray(f.acks)) throw new TypeError("acks.acks must be an array");
      for (const [i, ack] of f.acks.entries()) {
        if (typeof ack?.task_token !== "string") throw new TypeError(`acks.acks[${i}].task_token must be a string`);
        if (!Number.isInteger(ack.status)) throw new TypeError(`acks.acks[${i}].status must be an integer`);
      }
      return { type: "acks", acks: f.acks };
    case "cancel":
      if (typeof f.task_token !== "string") throw new TypeError("cancel.task_token must be a string");
      return { type: "cancel", task_token: f.task_token, reason: String(f.reason ?? "") };
    default:
      return null;
  }
}

/** What one frame from the Worker carries. */
export interface WorkerFrameParts {
  reports: Report[];
  deltas: Array<{ task_token: string; deltas: Record<string, unknown>[] }>;
  credit: number;
  /** The `seq` of the last `tasks` frame received. */
  ack: number;
}

/** The JSON text of a Worker frame: `results` when it carries reports or deltas, else
 * `credit`; empty parts are left out. */
export function encodeFrame(parts: WorkerFrameParts): string {
  const carries = parts.reports.length > 0 || parts.deltas.length > 0;
  const frame: Record<string, unknown> = { type: carries ? "results" : "credit", ack: parts.ack };
  if (parts.reports.length) frame.results = parts.reports;
  if (parts.deltas.length) frame.deltas = parts.deltas;
  if (parts.credit) frame.credit = parts.credit;
  return JSON.stringify(frame);
}
