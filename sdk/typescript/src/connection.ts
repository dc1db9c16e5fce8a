/**
 * One way to reach the active node of a dex-ha cluster (used by the Client and the Worker).
 *
 * Only the active node serves the API; the others answer 503 `not_active` with
 * `leader_url`. A Connection sends each request to the node it believes active and, when
 * the answer says otherwise or the node cannot be reached, moves on and tries again:
 *
 * - ONE URL (a readiness-following address: HAProxy, a Kubernetes Service) is always used;
 *   the address itself routes to the active node.
 * - SEVERAL node URLs: a 503 naming `leader_url` moves to that URL; a 503 without it, a
 *   502/504 or a connection error rotates to the next URL. A 503 `overloaded` or
 *   `unavailable` comes from the active node itself: stay, and back off.
 *
 * Switching node is free for the first pass through the list; after that it backs off
 * exponentially (full jitter) from `backoffInitialMs` to `backoffMaxMs`. It never gives up
 * while the cluster has no active node unless `giveUpAfterMs` is set. Retrying is safe:
 * every API call is idempotent by design (caller-chosen ids, fenced task results).
 */
import WebSocket from "ws";
import { DexError, DexUnavailable } from "./errors.js";
import { splitUrls } from "./env.js";
import { type Logger, defaultLogger } from "./log.js";

const RETRYABLE_STATUSES = new Set([502, 503, 504]);
/** 503s of the active node itself: retried on the same node. */
const ACTIVE_NODE_REFUSALS = new Set(["overloaded", "unavailable"]);

export interface ConnectionOptions {
  token?: string | null;
  namespace?: string | null;
  requestTimeoutMs?: number;
  giveUpAfterMs?: number | null;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  logger?: Logger;
}

/** A 502/503/504 answer: try again, maybe on another node. */
class RetryableAnswer extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    readonly detail: string,
    readonly leaderUrl: string | null,
    readonly retryAfterMs: number | null,
  ) {
    super(`${status} ${code}: ${detail}`);
  }
}

/** `url` checked (an absolute http(s) URL), without its trailing '/'. */
export function normalizeUrl(url: unknown, argument: string): string {
  if (typeof url !== "string") throw new TypeError(`${argument} must be a URL string, got ${typeof url}`);
  const text = url.trim();
  let parsed: URL;
  try {
    parsed = new URL(text);
  } catch {
    throw new Error(`${argument} must be an http:// or https:// URL, got ${JSON.stringify(url)}`);
  }
  if (!["http:", "https:"].includes(parsed.protocol) || /[\s,]/.test(text)) {
    throw new Error(`${argument} must be one http:// or https:// URL, got ${JSON.stringify(url)}`);
  }
  return text.replace(/\/+$/, "");
}

export function normalizeUrls(urls: string | string[]): string[] {
  const list = typeof urls === "string" ? splitUrls(urls) : urls;
  if (!Array.isArray(list) || list.length === 0) {
    throw new Error("urls must not be empty: give one URL or a list of node URLs");
  }
  return list.map((url, i) => normalizeUrl(url, list.length === 1 ? "urls" : `urls[${i}]`));
}

function decodeBody(text: string): unknown {
  if (!text.trim()) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** The error to throw for a non-2xx answer: retryable, or a DexError. */
function answerError(status: number, text: string, retryAfter: string | null): Error {
  const body = decodeBody(text);
  const fields = body !== null && typeof body === "object" ? (body as Record<string, unknown>) : {};
  const code = String(fields.error ?? `http_${status}`);
  const message = String(fields.message ?? text.trim().slice(0, 500));
  if (RETRYABLE_STATUSES.has(status)) {
    const leader = typeof fields.leader_url === "string" && fields.leader_url ? fields.leader_url : null;
    const seconds = retryAfter === null ? NaN : Number(retryAfter);
    return new RetryableAnswer(status, code, message, leader, Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : null);
  }
  return new DexError(status, code, message, body);
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

export class Connection {
  readonly urls: string[];
  private currentUrlValue: string;
  private listIndex = 0;
  private failures = 0;
  private readonly token: string | null;
  private readonly namespace: string | null;
  private readonly requestTimeoutMs: number;
  private readonly giveUpAfterMs: number | null;
  private readonly backoffInitialMs: number;
  private readonly backoffMaxMs: number;
  readonly logger: Logger;

  constructor(urls: string | string[], options: ConnectionOptions = {}) {
    this.urls = normalizeUrls(urls);
    this.currentUrlValue = this.urls[0]!;
    for (const name of ["token", "namespace"] as const) {
      const value = options[name];
      if (value !== undefined && value !== null && (typeof value !== "string" || value === "")) {
        throw new Error(`${name} must be a non-empty string or null`);
      }
    }
    this.token = options.token ?? null;
    this.namespace = options.namespace ?? null;
    this.requestTimeoutMs = positive(options.requestTimeoutMs ?? 30_000, "requestTimeoutMs");
    this.giveUpAfterMs = options.giveUpAfterMs ?? null;
    this.backoffInitialMs = positive(options.backoffInitialMs ?? 50, "backoffInitialMs");
    this.backoffMaxMs = positive(options.backoffMaxMs ?? 2_000, "backoffMaxMs");
    if (this.backoffMaxMs < this.backoffInitialMs) throw new Error("backoffMaxMs must be >= backoffInitialMs");
    this.logger = options.logger ?? defaultLogger;
  }

  /** The node URL (or the single URL) the next request goes to. */
  get currentUrl(): string {
    return this.currentUrlValue;
  }

  /** One API call to the active node; the JSON body of its 2xx answer (null when empty).
   * Throws DexError for a 4xx or 500; retries the rest (see the module comment). */
  async request(
    method: string,
    path: string,
    body?: unknown,
    options: { params?: Record<string, string>; timeoutMs?: number } = {},
  ): Promise<any> {
    checkPath(path);
    const headers = this.headers(body !== undefined || method !== "GET");
    const data = body === undefined ? undefined : JSON.stringify(body);
    const query = options.params ? "?" + new URLSearchParams(options.params).toString() : "";
    return this.withRetries(`${method} ${path}`, async (baseUrl) => {
      const resp = await fetch(baseUrl + path + query, {
        method,
        headers,
        body: data,
        signal: AbortSignal.timeout(options.timeoutMs ?? this.requestTimeoutMs),
      });
      const text = await resp.text();
      if (resp.ok) return decodeBody(text);
      throw answerError(resp.status, text, resp.headers.get("retry-after"));
    });
  }

  /** A GET whose body the caller reads as it comes (SSE), on the active node. */
  async openStream(path: string, headers: Record<string, string>, signal: AbortSignal): Promise<Response> {
    checkPath(path);
    const all = { ...this.headers(false), ...headers };
    return this.withRetries(`GET ${path} (stream)`, async (baseUrl) => {
      const resp = await fetch(baseUrl + path, { headers: all, signal });
      if (resp.ok) return resp;
      throw answerError(resp.status, await resp.text(), resp.headers.get("retry-after"));
    });
  }

  /** A WebSocket on the active node, followed and retried as `request` is; a refused
   * upgrade throws what its answer says (404 from a node without the route, 401, ...).
   * The socket comes paused: call `resume()` once its listeners are in place. */
  async openWebSocket(path: string, params: Record<string, string>): Promise<WebSocket> {
    checkPath(path);
    const headers = this.headers(false);
    const query = "?" + new URLSearchParams(params).toString();
    return this.withRetries(`GET ${path} (WebSocket)`, (baseUrl) =>
      openSocket(baseUrl.replace(/^http/, "ws") + path + query, headers, this.requestTimeoutMs),
    );
  }

  /** The wait after `failures` failures in a row: full jitter under a doubling cap. */
  retryDelayMs(failures: number): number {
    return Math.random() * this.backoffCap(failures);
  }

  private backoffCap(failures: number): number {
    return Math.min(this.backoffMaxMs, this.backoffInitialMs * 2 ** Math.min(Math.max(failures, 0), 60));
  }

  private async withRetries<T>(what: string, sendOnce: (baseUrl: string) => Promise<T>): Promise<T> {
    const started = Date.now();
    let freeSwitches = this.urls.length - 1;
    for (;;) {
      const baseUrl = this.currentUrlValue;
      let retryAfterMs: number | null = null;
      let lastError: string;
      try {
        const result = await sendOnce(baseUrl);
        this.failures = 0;
        return result;
      } catch (exc) {
        if (exc instanceof RetryableAnswer) {
          lastError = `${baseUrl} answered ${exc.message}`;
          retryAfterMs = exc.retryAfterMs;
          this.moveAfterAnswer(baseUrl, exc);
        } else if (exc instanceof DexError) {
          throw exc;
        } else {
          lastError = `${baseUrl}: ${describe(exc)}`;
          this.rotate(baseUrl, `cannot reach it (${describe(exc)})`);
        }
      }
      const waited = Date.now() - started;
      if (this.giveUpAfterMs !== null && waited >= this.giveUpAfterMs) {
        throw new DexUnavailable(
          `${what}: no active dex-ha node answered after ${waited} ms on ${this.urls.join(", ")}; last error: ${lastError}`,
        );
      }
      if (this.currentUrlValue !== baseUrl && freeSwitches > 0) {
        freeSwitches -= 1;
        continue;
      }
      const cap = this.backoffCap(this.failures);
      let delay = this.retryDelayMs(this.failures);
      this.failures += 1;
      if (retryAfterMs !== null) delay = Math.min(Math.max(delay, retryAfterMs), cap);
      await sleep(delay);
    }
  }

  private moveAfterAnswer(baseUrl: string, answer: RetryableAnswer): void {
    if (this.urls.length === 1 || this.currentUrlValue !== baseUrl) return;
    if (ACTIVE_NODE_REFUSALS.has(answer.code)) return; // the active node itself: stay
    if (answer.leaderUrl !== null) {
      let leader: string;
      try {
        leader = normalizeUrl(answer.leaderUrl, "leader_url");
      } catch {
        this.logger.warn(`dex-ha node ${baseUrl} sent an unusable leader_url ${answer.leaderUrl}`);
        this.rotate(baseUrl, "unusable leader_url");
        return;
      }
      if (leader !== baseUrl) this.switchTo(leader, `${baseUrl} is not active and names the leader`);
      return;
    }
    this.rotate(baseUrl, `it answered ${answer.status} ${answer.code}`);
  }

  private rotate(baseUrl: string, reason: string): void {
    if (this.urls.length === 1 || this.currentUrlValue !== baseUrl) return;
    this.switchTo(this.urls[(this.listIndex + 1) % this.urls.length]!, `${baseUrl}: ${reason}`);
  }

  private switchTo(url: string, reason: string): void {
    this.logger.info(`dex-ha client: switching to ${url} (${reason})`);
    this.currentUrlValue = url;
    const index = this.urls.indexOf(url);
    if (index >= 0) this.listIndex = index;
  }

  private headers(jsonBody: boolean): Record<string, string> {
    const headers: Record<string, string> = { Accept: "application/json" };
    if (this.token !== null) headers.Authorization = `Bearer ${this.token}`;
    if (this.namespace !== null) headers["Dex-Namespace"] = this.namespace;
    if (jsonBody) headers["Content-Type"] = "application/json";
    return headers;
  }
}

/** Open one WebSocket; a refused upgrade becomes the error its HTTP answer says. */
function openSocket(url: string, headers: Record<string, string>, timeoutMs: number): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers, handshakeTimeout: timeoutMs, perMessageDeflate: false });
    ws.once("open", () => {
      ws.removeAllListeners("error");
      // Hold what the node sends (its welcome comes at once) until the caller listens.
      ws.pause();
      resolve(ws);
    });
    ws.once("unexpected-response", (_req, res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => {
        const retryAfter = res.headers["retry-after"];
        reject(answerError(res.statusCode ?? 0, Buffer.concat(chunks).toString("utf8"), typeof retryAfter === "string" ? retryAfter : null));
        ws.terminate();
      });
      res.on("error", reject);
    });
    ws.once("error", reject);
  });
}

function checkPath(path: string): void {
  if (!path.startsWith("/")) throw new Error(`path must start with '/', got ${JSON.stringify(path)}`);
}

function positive(value: number, name: string): number {
  if (!(typeof value === "number" && value > 0)) throw new Error(`${name} must be > 0, got ${value}`);
  return value;
}

function describe(exc: unknown): string {
  if (exc instanceof Error) {
    const cause = (exc as { cause?: unknown }).cause;
    return cause instanceof Error ? `${exc.name}: ${exc.message} (${cause.message})` : `${exc.name}: ${exc.message}`;
  }
  return String(exc);
}
