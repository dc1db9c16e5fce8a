/**
 * The typed results of the Client: the JSON the server sends, as TypeScript types. Fields
 * are named as in the HTTP API (snake_case), so what docs/api.md says applies as is.
 */

export interface Attempt {
  number: number;
  status: string;
  worker_id: string | null;
  term: number | null;
  idempotency_key: string | null;
  started_at: number | null;
  ended_at: number | null;
  error: string | null;
  attempt_progress: string | null;
  [field: string]: unknown;
}

export interface Step {
  step_id: string;
  kind: string;
  status: string;
  call_id: string | null;
  attempts_used: number;
  max_attempts: number | null;
  error: string | null;
  attempts: Attempt[];
  [field: string]: unknown;
}

export interface Turn {
  turn_id: string;
  number: number | null;
  status: string;
  message_id: string | null;
  started_at: number | null;
  ended_at: number | null;
  error: string | null;
  steps: Step[];
  [field: string]: unknown;
}

export interface ToolCallRecord {
  call_id: string;
  turn_id: string | null;
  name: string;
  arguments: unknown;
  effect: string | null;
  status: "pending" | "running" | "succeeded" | "failed" | "outcome_unknown" | string;
  output: unknown;
  error: string | null;
  attempt_progress: "NOT_STARTED" | "NOT_COMPLETED" | string | null;
  idempotency_key: string | null;
  steps: Step[];
  [field: string]: unknown;
}

export interface PendingApproval {
  call_id: string;
  name: string | null;
  arguments: unknown;
  requested_at: number | null;
  [field: string]: unknown;
}

export interface PendingQuestion {
  question_id: string;
  call_id: string | null;
  source: string | null;
  question: unknown;
  asked_at: number | null;
  [field: string]: unknown;
}

/** The agent snapshot of a session (`GET /v1/sessions/{id}`). */
export interface Session {
  session_id: string;
  namespace: string;
  agent: string;
  status: "idle" | "running" | string;
  metadata: Record<string, unknown> | null;
  created_at: number | null;
  updated_at: number | null;
  waiting_for: string | null;
  current_turn: Turn | null;
  turns: Turn[];
  history: Array<Record<string, any>>;
  summary: Record<string, unknown> | null;
  tool_calls: ToolCallRecord[];
  pending_approvals: PendingApproval[];
  pending_questions: PendingQuestion[];
  pending_timers: Array<Record<string, any>>;
  waiting_messages: Array<Record<string, any>>;
  [field: string]: unknown;
}

/** The 202 answer to a message. */
export interface MessageAccepted {
  session_id: string;
  message_id: string;
  /** true when this message_id was accepted before (a retry). */
  duplicate?: boolean;
  [field: string]: unknown;
}

/** The answer of approve, answer, reconcile: `noop` is true for a repeat. */
export interface Decision {
  noop?: boolean;
  [field: string]: unknown;
}

/** The answer of cancel: `cancelled` is the turn's id, or null when none was running. */
export interface Cancelled {
  cancelled: string | null;
  [field: string]: unknown;
}

/** One event of a session's stream. Committed events have an `id` (resume after it);
 * live deltas have id null and carry `step_id` and `attempt`, so that a client can drop
 * the deltas of an attempt that failed (an `attempt_failed` event names it). */
export interface SessionEvent {
  id: string | null;
  type: string;
  data: Record<string, any>;
  at: number | null;
  step_id: string | null;
  attempt: number | null;
}

/** Whether the snapshot is idle with no waiting messages. */
export function isIdle(session: Session): boolean {
  return session.status === "idle" && (session.waiting_messages ?? []).length === 0;
}

/** The list fields of a snapshot: an older node may leave one out; it reads as empty. */
const SESSION_LISTS = [
  "turns",
  "history",
  "tool_calls",
  "pending_approvals",
  "pending_questions",
  "pending_timers",
  "waiting_messages",
] as const;

/** A Session from the JSON of a snapshot: the fields every caller reads are checked (a
 * TypeError names the one that does not fit), missing lists read as empty and missing
 * optional fields as null, so code written against the types does not meet `undefined`. */
export function parseSession(raw: unknown): Session {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) throw new TypeError("a session snapshot must be an object");
  const s = raw as Record<string, any>;
  for (const key of ["session_id", "agent", "status"]) {
    if (typeof s[key] !== "string") throw new TypeError(`session.${key} must be a string`);
  }
  const session: Record<string, any> = { ...s };
  for (const key of SESSION_LISTS) {
    if (s[key] === undefined || s[key] === null) session[key] = [];
    else if (!Array.isArray(s[key])) throw new TypeError(`session.${key} must be an array`);
  }
  for (const key of ["metadata", "created_at", "updated_at", "waiting_for", "current_turn", "summary"]) {
    session[key] = s[key] ?? null;
  }
  session.namespace = typeof s.namespace === "string" ? s.namespace : "default";
  return session as Session;
}
