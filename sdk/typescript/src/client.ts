/**
 * DexClient: the client routes of the dex-ha HTTP API.
 *
 * Every call goes through a Connection, which follows the active node across failovers
 * and retries. Retrying is safe because each call is idempotent: the client picks the
 * session id and the message id itself (when the caller does not), so a call retried after
 * a failover never makes two sessions or starts two turns; repeating the same approval,
 * answer, cancel or reconcile is a no-op.
 *
 *     const client = new DexClient(["http://n1:8801", "http://n2:8801"], { token });
 *     const session = await client.createSession("support-bot");
 *     await client.sendMessage(session.session_id, "Hello");
 *     const snapshot = await client.waitUntilIdle(session.session_id);
 */
import { randomUUID } from "node:crypto";
import { Connection, type ConnectionOptions, sleep } from "./connection.js";
import { CLIENT_TOKEN_VAR, TOKEN_VAR, namespaceFromEnv, tokenFromEnv, urlsFromEnv } from "./env.js";
import { type Cancelled, type Decision, type MessageAccepted, type Session, type SessionEvent, isIdle, parseSession } from "./results.js";
import { type RawEvent, SSEParser } from "./sse.js";

/** The server sends a keep-alive every 15 s: three missed ones mean the stream is dead. */
const STREAM_IDLE_TIMEOUT_MS = 45_000;

export class IdleTimeoutError extends Error {
  constructor(
    readonly sessionId: string,
    readonly lastStatus: string | null,
    timeoutMs: number,
  ) {
    super(`session '${sessionId}' is not idle after ${timeoutMs} ms (last status: ${lastStatus})`);
    this.name = "IdleTimeoutError";
  }
}

export class DexClient {
  readonly connection: Connection;

  /** `urls`: one URL, a list, or null (DEX_HA_URLS, else http://127.0.0.1:8801). `token`:
   * else DEX_HA_CLIENT_TOKEN, else DEX_HA_TOKEN. `namespace`: else DEX_HA_NAMESPACE. */
  constructor(urls: string | string[] | null = null, options: ConnectionOptions = {}) {
    this.connection = new Connection(urls ?? urlsFromEnv(), {
      ...options,
      token: options.token ?? tokenFromEnv([CLIENT_TOKEN_VAR, TOKEN_VAR]),
      namespace: options.namespace ?? namespaceFromEnv(),
    });
  }

  /** Create a session of `agent` (or get it, when `sessionId` already exists for that agent).
   * The id is chosen here when not given, so a retry finds the session the first try made. */
  async createSession(agent: string, options: { sessionId?: string; metadata?: Record<string, unknown> } = {}): Promise<Session> {
    segment(agent, "agent");
    const body: Record<string, unknown> = { agent, session_id: options.sessionId ?? `s-${randomUUID().replaceAll("-", "")}` };
    segment(body.session_id, "sessionId");
    if (options.metadata !== undefined) body.metadata = options.metadata;
    return parseSession(await this.connection.request("POST", "/v1/sessions", body));
  }

  /** The agent snapshot: status, turns, history, tool calls, pending waits. */
  async getSession(sessionId: string): Promise<Session> {
    return parseSession(await this.connection.request("GET", `/v1/sessions/${segment(sessionId, "sessionId")}`));
  }

  /** Send a user message. The message id is chosen here when not given: a retry after a
   * failover repeats it, which the server treats as a no-op (no second turn). `mode:
   * "steer"` delivers it at the running turn's next model call. */
  async sendMessage(
    sessionId: string,
    text: string,
    options: { messageId?: string; mode?: "queue" | "steer" } = {},
  ): Promise<MessageAccepted> {
    if (typeof text !== "string") throw new TypeError(`text must be a string, got ${typeof text}`);
    const mode = options.mode ?? "queue";
    if (mode !== "queue" && mode !== "steer") throw new Error(`mode must be queue or steer, got ${JSON.stringify(mode)}`);
    const messageId = options.messageId ?? randomUUID().replaceAll("-", "");
    segment(messageId, "messageId");
    return this.connection.request("POST", `/v1/sessions/${segment(sessionId, "sessionId")}/messages`, {
      text,
      message_id: messageId,
      mode,
    });
  }

  /** Decide a tool call that waits for approval (the same decision again is a no-op). */
  async approve(sessionId: string, callId: string, options: { approved?: boolean; reason?: string } = {}): Promise<Decision> {
    const body: Record<string, unknown> = { approved: options.approved ?? true };
    if (options.reason !== undefined) body.reason = options.reason;
    return this.connection.request(
      "POST",
      `/v1/sessions/${segment(sessionId, "sessionId")}/approvals/${segment(callId, "callId")}`,
      body,
    );
  }

  /** Refuse a tool call that waits for approval; the call records `failed` with the reason. */
  async deny(sessionId: string, callId: string, reason?: string): Promise<Decision> {
    return this.approve(sessionId, callId, { approved: false, ...(reason === undefined ? {} : { reason }) });
  }

  /** Answer a pending question (asked by the model or by a tool). */
  async answer(sessionId: string, questionId: string, answer: unknown): Promise<Decision> {
    return this.connection.request(
      "POST",
      `/v1/sessions/${segment(sessionId, "sessionId")}/questions/${segment(questionId, "questionId")}/answer`,
      { answer },
    );
  }

  /** Cancel the running turn; `cancelled` is the turn's id, or null when none was running. */
  async cancel(sessionId: string, reason?: string): Promise<Cancelled> {
    return this.connection.request(
      "POST",
      `/v1/sessions/${segment(sessionId, "sessionId")}/cancel`,
      reason === undefined ? {} : { reason },
    );
  }

  /** Settle a tool call whose outcome is unknown, after checking what really happened. */
  async reconcile(
    sessionId: string,
    callId: string,
    outcome: "succeeded" | "failed",
    options: { result?: unknown; error?: string } = {},
  ): Promise<Decision> {
    if (outcome !== "succeeded" && outcome !== "failed") {
      throw new Error(`outcome must be succeeded or failed, got ${JSON.stringify(outcome)}`);
    }
    const body: Record<string, unknown> = { outcome };
    if (options.result !== undefined) body.result = options.result;
    if (options.error !== undefined) body.error = options.error;
    return this.connection.request(
      "POST",
      `/v1/sessions/${segment(sessionId, "sessionId")}/tool-calls/${segment(callId, "callId")}/reconcile`,
      body,
    );
  }

  /**
   * The session's events (committed ones after `after`, and live deltas), without end.
   * When the stream ends or drops (the node died, a failover), it reconnects through the
   * Connection, resumes after the last committed event seen (Last-Event-ID) and never
   * yields an event twice. It stops when the caller stops iterating (`break`, or `signal`).
   */
  async *events(sessionId: string, options: { after?: string; signal?: AbortSignal } = {}): AsyncGenerator<SessionEvent> {
    const path = `/v1/sessions/${segment(sessionId, "sessionId")}/events`;
    let lastId = options.after ?? null;
    let emptyStreams = 0;
    while (!options.signal?.aborted) {
      const headers: Record<string, string> = { Accept: "text/event-stream", "Cache-Control": "no-cache" };
      if (lastId !== null) headers["Last-Event-ID"] = lastId;
      const abort = new AbortController();
      const stopOnCaller = () => abort.abort();
      options.signal?.addEventListener("abort", stopOnCaller);
      let gotEvent = false;
      try {
        const resp = await this.connection.openStream(path, headers, abort.signal);
        for await (const raw of readEvents(resp, abort)) {
          gotEvent = true;
          const event = decodeEvent(raw);
          if (event === null) continue;
          if (event.id !== null) {
            if (lastId !== null && !isNewer(event.id, lastId)) continue; // seen before a reconnect
            lastId = event.id;
          }
          yield event;
        }
      } catch (exc) {
        if (options.signal?.aborted) return;
        if (exc instanceof Error && exc.name === "DexError") throw exc;
        this.connection.logger.info(`dex-ha client: event stream of ${path} dropped (${String(exc)}); reconnecting`);
      } finally {
        options.signal?.removeEventListener("abort", stopOnCaller);
        abort.abort();
      }
      emptyStreams = gotEvent ? 0 : emptyStreams + 1;
      if (emptyStreams) await sleep(this.connection.retryDelayMs(emptyStreams - 1));
    }
  }

  /** Wait until the session is idle with no waiting messages; return that snapshot. */
  async waitUntilIdle(sessionId: string, timeoutMs = 60_000): Promise<Session> {
    const deadline = Date.now() + timeoutMs;
    let interval = 50;
    let lastStatus: string | null = null;
    for (;;) {
      const snapshot = await this.getSession(sessionId);
      lastStatus = snapshot.status;
      if (isIdle(snapshot)) return snapshot;
      if (Date.now() >= deadline) throw new IdleTimeoutError(sessionId, lastStatus, timeoutMs);
      await sleep(Math.min(interval, deadline - Date.now()));
      interval = Math.min(interval * 1.5, 500);
    }
  }
}

/** The raw events of one response; aborts the stream when nothing came for the idle timeout. */
async function* readEvents(resp: Response, abort: AbortController): AsyncGenerator<RawEvent> {
  if (resp.body === null) return;
  const parser = new SSEParser();
  const decoder = new TextDecoder();
  let idle = setTimeout(() => abort.abort(), STREAM_IDLE_TIMEOUT_MS);
  try {
    for await (const chunk of resp.body as unknown as AsyncIterable<Uint8Array>) {
      clearTimeout(idle);
      idle = setTimeout(() => abort.abort(), STREAM_IDLE_TIMEOUT_MS);
      yield* parser.feed(decoder.decode(chunk, { stream: true }));
    }
  } finally {
    clearTimeout(idle);
  }
}

function decodeEvent(raw: RawEvent): SessionEvent | null {
  let payload: any;
  try {
    payload = JSON.parse(raw.data);
  } catch {
    return null;
  }
  if (payload === null || typeof payload !== "object") return null;
  const data = payload.data && typeof payload.data === "object" ? payload.data : payload.data == null ? {} : { value: payload.data };
  const at = Number.isInteger(payload.at) ? payload.at : null;
  const type = String(payload.type ?? raw.event);
  if (raw.id === null) {
    return { id: null, type, data, at, step_id: payload.step_id ?? null, attempt: Number.isInteger(payload.attempt) ? payload.attempt : null };
  }
  const namesAttempt = typeof data.step_id === "string" && Number.isInteger(data.attempt);
  return { id: raw.id, type, data, at, step_id: namesAttempt ? data.step_id : null, attempt: namesAttempt ? data.attempt : null };
}

/** Ids are decimal strings that grow. */
function isNewer(eventId: string, lastId: string): boolean {
  if (/^\d+$/.test(eventId) && /^\d+$/.test(lastId)) return BigInt(eventId) > BigInt(lastId);
  return eventId !== lastId;
}

function segment(value: unknown, argument: string): string {
  if (typeof value !== "string") throw new TypeError(`${argument} must be a string, got ${typeof value}`);
  if (!value) throw new Error(`${argument} must not be empty`);
  return encodeURIComponent(value);
}
