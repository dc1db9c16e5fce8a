/**
 * The errors of the SDK: what the server answered (DexError), what a tool or a model
 * raises to tell the Worker how its attempt ended (ToolError, NonRetryableError), and
 * what a tool sees when the server said stop (AttemptCancelled).
 */

/** The error prefix of a tool call that did not run (the server records it; mirrors
 * `dex_ha.TOOL_CALL_NOT_RUN_ERROR_PREFIX`): such a call is safe to make again. */
export const toolCallNotRunErrorPrefix = "the tool did not run, so it is safe to call again";

/** An answer the caller must handle: any 4xx, or a 500. */
export class DexError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly body: unknown = null,
  ) {
    super(`${status} ${code}: ${message}`);
    this.name = "DexError";
    this.detail = message;
  }
  /** The server's message alone (without status and code). */
  readonly detail: string;
}

/** No active node answered within `giveUpAfterMs`. Status 503, code `unavailable`. */
export class DexUnavailable extends DexError {
  constructor(message: string) {
    super(503, "unavailable", message);
    this.name = "DexUnavailable";
  }
}

/** Thrown by a tool to report its own failure: the call records `failed` with the
 * message, the model sees it, and the tool is not run again. */
export class ToolError extends Error {
  constructor(message: string) {
    if (typeof message !== "string") throw new TypeError(`message must be a string, got ${typeof message}`);
    super(message);
    this.name = "ToolError";
  }
}

/** The call's arguments do not fit the tool, so it was never called: the attempt is
 * reported as not started (the tool did not run). */
export class ArgumentsRefused extends ToolError {
  constructor(message: string) {
    super(message);
    this.name = "ArgumentsRefused";
  }
}

/** Thrown by a model (or a tool) when another attempt would fail the same way (a 400 or
 * 401 from the model API): the attempt fails with `retryable: false`. */
export class NonRetryableError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NonRetryableError";
  }
}

/** Thrown by `ToolContext.heartbeat()` once the server said stop (the turn was
 * cancelled, or the attempt is no longer current). What the tool returns afterwards is
 * not delivered. */
export class AttemptCancelled extends Error {
  constructor(message: string) {
    super(message);
    this.name = "AttemptCancelled";
  }
}

/** Thrown by `ToolContext.ask()` to end the attempt with a question. Not an `Error`, so a
 * tool's `catch (e) { if (e instanceof Error) ... }` does not swallow it by mistake. */
export class QuestionAsked {
  constructor(readonly question: unknown) {}
}

/** The Worker cannot run this task at all (unknown agent, tool or kind; a tool that breaks
 * the protocol): it fails with `retryable: false`. */
export class Unrunnable extends Error {
  constructor(message: string) {
    super(message);
    this.name = "Unrunnable";
  }
}

/** Unrunnable, found before any tool or model function was called: the fail report says
 * `not_started`, so the server may record the call as not run. */
export class NotStarted extends Unrunnable {
  constructor(message: string) {
    super(message);
    this.name = "NotStarted";
  }
}
