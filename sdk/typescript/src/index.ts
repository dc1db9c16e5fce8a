/** @dex-ha/sdk: the TypeScript Worker and Client SDK of dex-ha. */
export { Agent, BUILTIN_TOOL_NAMES, EFFECTS, Tool } from "./agent.js";
export type { AgentOptions, Effect, PollFunction, ToolArguments, ToolFunction, ToolOptions } from "./agent.js";
export { DexClient, IdleTimeoutError } from "./client.js";
export { Connection } from "./connection.js";
export type { ConnectionOptions } from "./connection.js";
export { Pending, TaskHandle, ToolContext } from "./context.js";
export {
  AttemptCancelled,
  DexError,
  DexUnavailable,
  NonRetryableError,
  ToolError,
  toolCallNotRunErrorPrefix,
} from "./errors.js";
export type { Logger } from "./log.js";
export { ScriptedModel, ScriptExhausted, coerceResponse, responsesSoFar } from "./model.js";
export type { DeltaSink, HistoryItem, Model, ModelRequest, ModelResponse, ModelResponseLike, ToolCall } from "./model.js";
export { decodeFrame, encodeFrame, parseTask } from "./protocol.js";
export type { Report, ServerFrame, Task, WorkerFrameParts } from "./protocol.js";
export { isIdle, parseSession } from "./results.js";
export type * from "./results.js";
export { WORKER_FAILPOINTS, Worker } from "./worker.js";
export type { Outcome, WorkerOptions } from "./worker.js";
