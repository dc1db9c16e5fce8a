/**
 * The Worker: registers its agents, opens the Worker channel to the active node, runs
 * each task it is handed and reports how it ended.
 *
 *     const worker = new Worker(["http://127.0.0.1:8801"], { token, agents: [agent] });
 *     const running = worker.run();
 *     ...
 *     await worker.stop();      // drain, then close the channel
 *     await running;
 *
 * Every request goes through a Connection, which retries transport errors and 503s while
 * following the active node; the channel reconnects after a failover (close code 4000) or
 * a broken connection. Results are fenced by the server (step, attempt, term): a 409 means
 * the attempt is no longer current, and the Worker drops it.
 */
import { hostname } from "node:os";
import { randomBytes } from "node:crypto";
import type { Agent, Tool } from "./agent.js";
import { ChannelLink, type ChannelPeer } from "./channel.js";
import { Connection, type ConnectionOptions, sleep } from "./connection.js";
import { Pending, TaskHandle, ToolContext } from "./context.js";
import { TOKEN_VAR, WORKER_TOKEN_VAR, namespaceFromEnv, tokenFromEnv, urlsFromEnv } from "./env.js";
import {
  ArgumentsRefused,
  AttemptCancelled,
  NonRetryableError,
  NotStarted,
  QuestionAsked,
  ToolError,
  Unrunnable,
} from "./errors.js";
import { Failpoints } from "./failpoints.js";
import { type DeltaSink, type ModelRequest, coerceResponse } from "./model.js";
import { type Ack, CANCEL_REQUESTED, type Report, type Task, describeTask, parseTask } from "./protocol.js";

/** Crash points of the Worker (armed with DEX_HA_FAILPOINTS): the moments of the crash
 * matrix that only the Worker process knows. The same names as the Python Worker's. */
export const WORKER_FAILPOINTS = [
  "worker.<Kind>.before-first-heartbeat", // an attempt of that kind runs; nothing of it reached the server
  "worker.PollToolTask.during-poll", // the poll function returned; its answer is not delivered
  "worker.complete.after-send", // the server accepted a result; the Worker has not gone on
  "worker.channel.before-results", // a frame of reports is ready; it is not sent
] as const;

export function firstHeartbeatFailpoint(kind: string): string {
  return `worker.${kind}.before-first-heartbeat`;
}

/** How long stop() waits for the acks of the last reports. */
const ACK_WAIT_MS = 5_000;
const MAX_HEARTBEAT_INTERVAL_MS = 5_000;
const MIN_HEARTBEAT_INTERVAL_MS = 10;

/** What a finished attempt reports: a result, or a failure. */
export interface Outcome {
  result?: unknown;
  error?: string;
  retryable?: boolean;
  /** No tool or model function was called for this attempt. */
  notStarted?: boolean;
}

export interface WorkerOptions extends ConnectionOptions {
  agents: Agent[];
  workerId?: string;
  /** Attempts run at once (default 8). */
  maxConcurrency?: number;
  /** How long stop() lets running attempts finish (default 30 s). */
  drainTimeoutMs?: number;
  /** Called for each report (complete or fail) the server accepted. */
  onResult?: (task: Task, outcome: Outcome) => void;
}

/**
 * One running attempt on the channel: the DeltaSink a model streams into and the
 * heartbeat a tool calls. No heartbeats travel (the open channel keeps the attempt alive);
 * deltas and progress go in the channel's next frame; a `cancel` frame stops it.
 */
class ChannelAttempt implements DeltaSink {
  stopped = false;
  cancelledByServer = false;
  stopReason = "";
  readonly contexts: ToolContext[] = [];
  private first = true;
  private readonly firstBeat: NodeJS.Timeout | null = null;
  private stopResolve: () => void = () => {};
  /** Resolves when the server says stop. */
  readonly stoppedSignal = new Promise<void>((resolve) => (this.stopResolve = resolve));

  constructor(
    private readonly task: Task,
    private readonly link: ChannelLink,
    private readonly failpoints: Failpoints,
  ) {
    // Where an HTTP Worker would send its first heartbeat, a Worker armed to die "before
    // the first heartbeat" dies: the attempt runs, and nothing of it reached the server.
    if (failpoints.armed(firstHeartbeatFailpoint(task.kind))) {
      const interval = Math.min(Math.max(task.heartbeat_timeout_ms / 3, MIN_HEARTBEAT_INTERVAL_MS), MAX_HEARTBEAT_INTERVAL_MS);
      this.firstBeat = setTimeout(() => this.firstMessage(), interval);
    }
  }

  sendText(text: string): void {
    if (typeof text !== "string") throw new TypeError(`text must be a string, got ${typeof text}`);
    if (text) this.send({ text });
  }

  send(delta: Record<string, unknown>): void {
    if (delta === null || typeof delta !== "object") throw new TypeError("delta must be an object");
    this.firstMessage();
    this.link.sendDeltas(this.task.task_token, [delta]);
  }

  /** Before anything of this attempt goes to the server: the failpoint's moment. */
  firstMessage(): void {
    if (this.first) {
      this.first = false;
      this.dispose();
      this.failpoints.hit(firstHeartbeatFailpoint(this.task.kind));
    }
  }

  /** `ToolContext.heartbeat`: progress travels as a delta; false once the attempt must stop. */
  async beat(progress: Record<string, unknown>): Promise<boolean> {
    this.firstMessage();
    if (Object.keys(progress).length) this.send({ progress });
    await new Promise((resolve) => setImmediate(resolve)); // a cancel frame read meanwhile is seen
    return !this.stopped;
  }

  stop(reason: string, cancelledByServer: boolean): void {
    if (this.stopped) return;
    this.stopped = true;
    this.stopReason = reason;
    this.cancelledByServer = cancelledByServer;
    for (const ctx of this.contexts) ctx.cancel(reason);
    this.stopResolve();
  }

  dispose(): void {
    if (this.firstBeat !== null) clearTimeout(this.firstBeat);
  }
}

export class Worker implements ChannelPeer {
  readonly workerId: string;
  readonly maxConcurrency: number;
  readonly drainTimeoutMs: number;
  /** Reports (complete or fail) the server accepted. */
  completed = 0;
  private readonly agents: Map<string, Agent>;
  private readonly conn: Connection;
  private readonly failpoints = new Failpoints();
  private readonly onResult: WorkerOptions["onResult"];
  private readonly attempts = new Map<string, ChannelAttempt>();
  private readonly reported = new Map<string, { task: Task; outcome: Outcome }>();
  private readonly runners = new Set<Promise<void>>();
  private busy = 0; // attempts running whose report is not queued yet
  private link: ChannelLink | null = null;
  private started = false;
  private stopping = false;

  /** `urls`: one readiness-following URL or the node URLs (null: DEX_HA_URLS, else
   * http://127.0.0.1:8801). `token`: else DEX_HA_WORKER_TOKEN, else DEX_HA_TOKEN. */
  constructor(urls: string | string[] | null, options: WorkerOptions) {
    this.agents = checkAgents(options.agents);
    this.workerId = options.workerId ?? `${hostname()}-${process.pid}-${randomBytes(2).toString("hex")}`;
    this.maxConcurrency = options.maxConcurrency ?? 8;
    if (!Number.isInteger(this.maxConcurrency) || this.maxConcurrency < 1) {
      throw new Error(`maxConcurrency must be a positive integer, got ${options.maxConcurrency}`);
    }
    this.drainTimeoutMs = options.drainTimeoutMs ?? 30_000;
    this.onResult = options.onResult;
    this.conn = new Connection(urls ?? urlsFromEnv(), {
      ...options,
      token: options.token ?? tokenFromEnv([WORKER_TOKEN_VAR, TOKEN_VAR]),
      namespace: options.namespace ?? namespaceFromEnv(),
    });
  }

  /** Attempts running now (never more than maxConcurrency). */
  get running(): number {
    return this.busy;
  }

  /** The channel's link while the Worker runs (its `sessions` count the reconnects). */
  get channel(): ChannelLink | null {
    return this.link;
  }

  /** Register every agent, then run tasks until stop(). Throws DexError when the server
   * refuses the registration or the channel's token (401/403): configuration errors that
   * retrying cannot fix. */
  async run(): Promise<void> {
    if (this.started) throw new Error("Worker.run() was already called; make a new Worker");
    this.started = true;
    for (const agent of this.agents.values()) {
      if (this.stopping) return;
      await this.conn.request("PUT", `/v1/agents/${encodeURIComponent(agent.name)}`, agent.definition());
      this.conn.logger.info(`worker ${this.workerId} registered agent ${agent.name} (${agent.tools.size} tools)`);
    }
    if (this.stopping) return;
    this.link = new ChannelLink(this.conn, this.workerId, [...this.agents.keys()], this, this.failpoints, () => this.stopping);
    await this.link.run();
  }

  /** Take no more tasks; let running attempts finish for up to the drain timeout and their
   * reports be acknowledged; then close the channel. */
  async stop(drainTimeoutMs: number = this.drainTimeoutMs): Promise<void> {
    this.stopping = true;
    const deadline = Date.now() + drainTimeoutMs;
    while (this.runners.size > 0 && Date.now() < deadline) {
      await Promise.race([Promise.allSettled([...this.runners]), sleep(deadline - Date.now())]);
    }
    if (this.runners.size > 0) {
      this.conn.logger.warn(`worker ${this.workerId}: ${this.runners.size} attempts still running after the drain timeout`);
    }
    if (this.link !== null) {
      await this.link.settle(ACK_WAIT_MS);
      this.link.close();
    }
  }

  // ------------------------------------------------------------ ChannelPeer

  freeSlots(): number {
    return this.stopping ? 0 : this.maxConcurrency - this.busy;
  }

  onTasks(tasks: unknown[]): void {
    for (const raw of tasks) this.start(raw);
  }

  onCancel(taskToken: string, reason: string): void {
    const attempt = this.attempts.get(taskToken);
    if (attempt === undefined || attempt.stopped) return;
    if (reason === CANCEL_REQUESTED) attempt.stop("the server cancelled it", true);
    else attempt.stop("the attempt is no longer current", false);
  }

  /** A channel opened: the attempts still running here that the node does not list as held
   * are no longer this Worker's (a takeover failed them, or the channel stayed closed past
   * its grace). Stop them and send nothing, as for a cancel "not current". */
  onWelcome(held: string[]): void {
    const stillOurs = new Set(held);
    for (const [token, attempt] of this.attempts) {
      if (!stillOurs.has(token) && !attempt.stopped) attempt.stop("the node no longer holds this attempt", false);
    }
  }

  onAck(report: Report, ack: Ack): void {
    const entry = this.reported.get(report.task_token);
    if (entry === undefined) return;
    this.reported.delete(report.task_token);
    const { task, outcome } = entry;
    if (ack.status === 200) {
      if (report.outcome === "complete") this.failpoints.hit("worker.complete.after-send");
      this.completed += 1;
      this.onResult?.(task, outcome);
    } else if (ack.status === 409) {
      this.conn.logger.info(`${describeTask(task)}: report not needed any more (409: ${ack.message})`);
    } else if (report.outcome === "complete" && (ack.status === 400 || ack.status === 413)) {
      this.conn.logger.error(`${describeTask(task)}: the server refused the result (${ack.status}): ${ack.message}`);
      this.report(task, { error: `the server refused the result: ${ack.message}`, retryable: false }, 0);
    } else {
      this.conn.logger.error(`${describeTask(task)}: the server refused the report (${ack.status} ${ack.error}): ${ack.message}`);
    }
  }

  // ------------------------------------------------------------ one attempt

  private start(raw: unknown): void {
    let task: Task;
    try {
      task = parseTask(raw);
    } catch (exc) {
      this.conn.logger.error(`worker ${this.workerId}: ignoring a malformed task (${String(exc)})`);
      return;
    }
    const runner = this.runAttempt(task).finally(() => this.runners.delete(runner));
    this.runners.add(runner);
  }

  /** Run one attempt, then queue its report with the slot it frees (they travel in one
   * frame, and the server spends that slot on the next step in the report's own entry). */
  private async runAttempt(task: Task): Promise<void> {
    const link = this.link!;
    const attempt = new ChannelAttempt(task, link, this.failpoints);
    this.attempts.set(task.task_token, attempt);
    this.busy += 1;
    let outcome: Outcome | null;
    try {
      outcome = await Promise.race([this.execute(task, attempt), attempt.stoppedSignal.then(() => null)]);
    } finally {
      this.attempts.delete(task.task_token);
      this.busy -= 1;
      attempt.dispose();
    }
    if (attempt.stopped) outcome = this.stoppedOutcome(task, attempt);
    const credit = this.stopping ? 0 : 1;
    if (outcome === null) {
      link.addCredit(credit);
      return;
    }
    // No failpoint here: an HTTP Worker's report is no heartbeat either, so an attempt that
    // ends before its first heartbeat reports (as the Python Worker does).
    this.report(task, outcome, credit);
  }

  private report(task: Task, outcome: Outcome, credit: number): void {
    this.reported.set(task.task_token, { task, outcome });
    const report: Report =
      outcome.error !== undefined
        ? {
            task_token: task.task_token,
            outcome: "fail",
            error: outcome.error,
            retryable: outcome.retryable ?? true,
            not_started: outcome.notStarted ?? false,
          }
        : { task_token: task.task_token, outcome: "complete", result: outcome.result };
    this.link!.report(report, credit);
  }

  /** The server said stop. After a cancel, report that the work stopped (the attempt ends
   * now); after "not current" the attempt is someone else's business: send nothing. */
  private stoppedOutcome(task: Task, attempt: ChannelAttempt): Outcome | null {
    this.conn.logger.info(`${describeTask(task)}: ${attempt.stopReason}; dropping its result`);
    if (attempt.cancelledByServer) {
      return { error: "cancelled: the Worker stopped the attempt at the server's request", retryable: false };
    }
    return null;
  }

  /** Dispatch by kind; every exception becomes a failure. */
  private async execute(task: Task, attempt: ChannelAttempt): Promise<Outcome> {
    try {
      const agent = this.agentFor(task);
      let result: unknown;
      switch (task.kind) {
        case "RunModel":
          result = await this.runModel(task, agent, attempt);
          break;
        case "CallTool":
        case "CallSingleAttemptTool":
          result = await this.callTool(task, agent, attempt);
          break;
        case "PollToolTask":
          result = await this.pollToolTask(task, agent, attempt);
          break;
        case "CompactContext":
          result = await this.compactContext(task, agent);
          break;
        default:
          throw new NotStarted(`this Worker does not know the task kind '${task.kind}'`);
      }
      checkJson(result);
      return { result };
    } catch (exc) {
      return this.failure(task, exc);
    }
  }

  private failure(task: Task, exc: unknown): Outcome {
    if (exc instanceof Unrunnable) {
      this.conn.logger.error(`${describeTask(task)}: cannot run it: ${exc.message}`);
      return { error: exc.message, retryable: false, notStarted: exc instanceof NotStarted };
    }
    if (exc instanceof AttemptCancelled) return { error: "cancelled by the server", retryable: true };
    if (exc instanceof NonRetryableError) {
      this.conn.logger.error(`${describeTask(task)}: failed, not to be retried: ${exc.message}`);
      return { error: `${exc.name}: ${exc.message}`, retryable: false };
    }
    const name = exc instanceof Error ? exc.name : typeof exc;
    const message = exc instanceof Error ? exc.message : String(exc);
    this.conn.logger.error(`${describeTask(task)}: threw ${name}: ${message}`);
    return { error: `${name}: ${message}`, retryable: true };
  }

  private agentFor(task: Task): Agent {
    let name = task.agent;
    if (name === null && this.agents.size === 1) name = [...this.agents.keys()][0]!;
    const agent = name === null ? undefined : this.agents.get(name);
    if (agent === undefined) throw new NotStarted(`this Worker has no agent '${name}'`);
    return agent;
  }

  private context(task: Task, attempt: ChannelAttempt, callId: string | null, idempotencyKey: string | null): ToolContext {
    const ctx = new ToolContext({
      sessionId: task.session_id,
      turnId: task.turn_id,
      stepId: task.step_id,
      callId,
      attempt: task.attempt,
      idempotencyKey,
      workerId: this.workerId,
      answer: task.input.answer,
      hasAnswer: "answer" in task.input,
      sendHeartbeat: (progress) => attempt.beat(progress),
    });
    attempt.contexts.push(ctx);
    return ctx;
  }

  // ------------------------------------------------------------ task kinds

  private async runModel(task: Task, agent: Agent, attempt: ChannelAttempt): Promise<unknown> {
    if (agent.model === null) throw new NotStarted(`agent '${agent.name}' has no model`);
    const request: ModelRequest = {
      history: [...(task.input.history ?? [])],
      summary: task.input.summary ?? null,
      tools: [...(task.input.tools ?? [])],
    };
    const response = coerceResponse(await agent.model.respond(request, attempt), "the model's response");
    const calls: Record<string, unknown>[] = [];
    for (const [i, call] of response.toolCalls.entries()) {
      if (!call.id) throw new Error(`the model's toolCalls[${i}] has no id`);
      const entry: Record<string, unknown> = { id: call.id, name: call.name, arguments: call.arguments };
      const tool = agent.tools.get(call.name);
      if (tool !== undefined && tool.inline) {
        entry.result = await this.runInline(task, attempt, tool, call.id, call.arguments);
      }
      calls.push(entry);
    }
    return { content: response.content, tool_calls: calls, usage: response.usage };
  }

  /** An inline tool runs inside the model call; its result rides in the RunModel result.
   * A throw (not ToolError) fails the whole attempt, which runs again with its inline tools. */
  private async runInline(task: Task, attempt: ChannelAttempt, tool: Tool, callId: string, args: unknown): Promise<unknown> {
    const ctx = this.context(task, attempt, callId, `${task.session_id}:${callId}`);
    let value: unknown;
    try {
      value = await tool.invoke(ctx, args);
    } catch (exc) {
      if (exc instanceof ToolError) return { status: "error", error: exc.message };
      if (exc instanceof QuestionAsked) return { status: "error", error: `inline tool '${tool.name}' cannot ask the user a question` };
      throw exc;
    }
    if (value instanceof TaskHandle || value instanceof Pending) {
      return { status: "error", error: `inline tool '${tool.name}' cannot be long-running` };
    }
    return { status: "ok", output: value ?? null };
  }

  private async callTool(task: Task, agent: Agent, attempt: ChannelAttempt): Promise<unknown> {
    const tool = toolFor(agent, task);
    const ctx = this.context(task, attempt, task.input.call_id ?? null, task.idempotency_key);
    let value: unknown;
    try {
      value = await tool.invoke(ctx, task.input.arguments ?? {});
    } catch (exc) {
      if (exc instanceof ArgumentsRefused) throw new NotStarted(exc.message); // it did not run
      if (exc instanceof ToolError) return { status: "error", error: exc.message };
      if (exc instanceof QuestionAsked) return { status: "question", question: exc.question };
      throw exc;
    }
    if (value instanceof TaskHandle) {
      if (tool.pollFn === null) throw new Unrunnable(`tool '${tool.name}' returned a task handle but has no poll function`);
      return { status: "task", handle: value.handle, poll_after_ms: value.pollAfterMs };
    }
    if (value instanceof Pending) throw new Unrunnable(`tool '${tool.name}' returned ctx.pending(); only its poll function may`);
    return { status: "ok", output: value ?? null };
  }

  private async pollToolTask(task: Task, agent: Agent, attempt: ChannelAttempt): Promise<unknown> {
    const tool = toolFor(agent, task);
    if (tool.pollFn === null) throw new NotStarted(`tool '${tool.name}' has no poll function`);
    const ctx = this.context(task, attempt, task.input.call_id ?? null, task.idempotency_key);
    let value: unknown;
    try {
      value = await tool.invokePoll(ctx, task.input.handle);
    } catch (exc) {
      if (exc instanceof ToolError) return { status: "error", error: exc.message };
      if (exc instanceof QuestionAsked) throw new Unrunnable(`the poll function of tool '${tool.name}' cannot ask the user`);
      throw exc;
    }
    this.failpoints.hit("worker.PollToolTask.during-poll");
    if (value instanceof Pending) {
      // The server refuses a null poll_after_ms: leave it out to keep the old interval.
      return value.pollAfterMs === null ? { status: "pending" } : { status: "pending", poll_after_ms: value.pollAfterMs };
    }
    if (value instanceof TaskHandle) throw new Unrunnable(`the poll function of tool '${tool.name}' returned a new task handle`);
    return { status: "ok", output: value ?? null };
  }

  private async compactContext(task: Task, agent: Agent): Promise<unknown> {
    if (agent.model === null) throw new NotStarted(`agent '${agent.name}' has no model`);
    const summary = await agent.model.summarize([...(task.input.history ?? [])], task.input.summary ?? null);
    if (typeof summary !== "string") throw new TypeError(`the model's summarize() returned ${typeof summary}, not a string`);
    return { summary };
  }
}

function checkAgents(agents: unknown): Map<string, Agent> {
  if (!Array.isArray(agents) || agents.length === 0) throw new Error("agents must be a non-empty array of Agent objects");
  const byName = new Map<string, Agent>();
  for (const agent of agents as Agent[]) {
    if (byName.has(agent.name)) throw new Error(`agents: two agents are named '${agent.name}'`);
    byName.set(agent.name, agent);
  }
  return byName;
}

function toolFor(agent: Agent, task: Task): Tool {
  const name = task.input.name;
  const tool = typeof name === "string" ? agent.tools.get(name) : undefined;
  if (tool === undefined) throw new NotStarted(`agent '${agent.name}' has no tool '${name}'`);
  return tool;
}

function checkJson(result: unknown): void {
  try {
    JSON.stringify(result);
  } catch (exc) {
    throw new Unrunnable(`the result is not JSON: ${String(exc)}`);
  }
}
