/**
 * What a tool function sees while it runs: the ToolContext, and the values it may return.
 *
 * A tool is called as `fn(ctx, args)`. Through `ctx` it learns which call it serves
 * (session, step, attempt, idempotency key), reports progress (`heartbeat`), asks the user
 * (`ask`), and builds the results of a long-running tool (`taskHandle` from the tool,
 * `pending` from its poll function).
 */
import { AttemptCancelled, QuestionAsked } from "./errors.js";

export const DEFAULT_POLL_AFTER_MS = 1000;

/** Returned by a long-running tool: the server polls it later with `handle`. */
export class TaskHandle {
  constructor(
    readonly handle: unknown,
    readonly pollAfterMs: number = DEFAULT_POLL_AFTER_MS,
  ) {}
}

/** Returned by a poll function: not done yet; poll again after `pollAfterMs` (or the
 * previous interval when null). */
export class Pending {
  constructor(readonly pollAfterMs: number | null = null) {}
}

/** How the Worker sends a heartbeat for the attempt: false when the attempt must stop. */
export type HeartbeatSender = (progress: Record<string, unknown>) => Promise<boolean>;

export interface ToolContextInit {
  sessionId: string;
  turnId: string;
  stepId: string;
  callId: string | null;
  attempt: number;
  idempotencyKey: string | null;
  workerId: string;
  answer?: unknown;
  hasAnswer?: boolean;
  sendHeartbeat?: HeartbeatSender;
}

/** The context of one tool run (one attempt of one call). */
export class ToolContext {
  readonly sessionId: string;
  readonly turnId: string;
  readonly stepId: string;
  readonly callId: string | null;
  readonly attempt: number;
  /** `"{session_id}:{call_id}"`: the same on every attempt of the call. Pass it to the
   * API you write to, so a repeated attempt does the write once. */
  readonly idempotencyKey: string | null;
  readonly workerId: string;
  /** The user's answer to the question this tool asked in an earlier run. */
  readonly answer: unknown;
  readonly hasAnswer: boolean;
  private readonly abort = new AbortController();
  private readonly sendHeartbeat: HeartbeatSender | null;

  constructor(init: ToolContextInit) {
    this.sessionId = init.sessionId;
    this.turnId = init.turnId;
    this.stepId = init.stepId;
    this.callId = init.callId;
    this.attempt = init.attempt;
    this.idempotencyKey = init.idempotencyKey;
    this.workerId = init.workerId;
    this.answer = init.answer ?? null;
    this.hasAnswer = init.hasAnswer ?? false;
    this.sendHeartbeat = init.sendHeartbeat ?? null;
  }

  /** Aborted when the server says stop (the turn was cancelled, or this attempt is no
   * longer current): pass it to fetch() and the like. */
  get signal(): AbortSignal {
    return this.abort.signal;
  }

  get cancelled(): boolean {
    return this.abort.signal.aborted;
  }

  /** Called by the Worker when the server says stop. */
  cancel(reason: string): void {
    if (!this.abort.signal.aborted) this.abort.abort(new AttemptCancelled(reason));
  }

  /** Report progress now (`progress` travels as a delta); throws AttemptCancelled once the
   * server said this attempt must stop. Without a Worker (a test) it does nothing. */
  async heartbeat(progress: Record<string, unknown> = {}): Promise<void> {
    this.throwIfCancelled();
    if (this.sendHeartbeat === null) return;
    if (!(await this.sendHeartbeat(progress))) {
      this.cancel(`attempt ${this.attempt} of step ${this.stepId} was cancelled`);
    }
    this.throwIfCancelled();
  }

  /** Ask the user `question` (any JSON value) and return the answer. The first run ends
   * here (the call waits for the answer); once the user answers, the step runs again from
   * the start and this returns the answer at once. One question per call. */
  async ask(question: unknown): Promise<unknown> {
    if (this.hasAnswer) return this.answer;
    throw new QuestionAsked(question);
  }

  /** The result of a tool that started long-running work: the server calls the tool's
   * poll function with `handle` after `pollAfterMs`, until it is done. */
  taskHandle(handle: unknown, pollAfterMs: number = DEFAULT_POLL_AFTER_MS): TaskHandle {
    if (handle === null || handle === undefined) throw new Error("handle must not be null (the server polls with it)");
    checkPollAfter(pollAfterMs);
    return new TaskHandle(handle, pollAfterMs);
  }

  /** The result of a poll function whose task is not done yet. */
  pending(pollAfterMs: number | null = null): Pending {
    if (pollAfterMs !== null) checkPollAfter(pollAfterMs);
    return new Pending(pollAfterMs);
  }

  private throwIfCancelled(): void {
    if (this.abort.signal.aborted) {
      throw new AttemptCancelled(`attempt ${this.attempt} of step ${this.stepId} was cancelled`);
    }
  }
}

function checkPollAfter(ms: unknown): void {
  if (typeof ms !== "number" || !Number.isInteger(ms) || ms < 0) {
    throw new Error(`pollAfterMs must be a non-negative integer, got ${String(ms)}`);
  }
}
