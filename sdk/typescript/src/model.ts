/**
 * The model interface a Worker calls, and ScriptedModel, a deterministic model for tests
 * and demos.
 *
 * A model implements `respond(request, stream)` and `summarize(history, summary)`.
 * `respond` gets the model-visible history (after the session's summary), the summary and
 * the tool list; it may stream text through `stream.sendText()` while it works (the Worker
 * relays the deltas to the server at once). Throwing fails the attempt as retryable (the
 * server decides whether to retry); throwing NonRetryableError fails it with no retry.
 */

export type HistoryItem = Record<string, any>;

export interface ToolCall {
  /** May be null in a script: ScriptedModel then makes a deterministic one. */
  id: string | null;
  name: string;
  arguments: Record<string, unknown>;
}

export interface ModelResponse {
  content: string;
  toolCalls: ToolCall[];
  usage: Record<string, unknown>;
}

/** What a model or a script may return: `toolCalls` (or the wire's `tool_calls`) optional. */
export interface ModelResponseLike {
  content?: string;
  toolCalls?: Array<Partial<ToolCall> & { name: string }>;
  tool_calls?: Array<Partial<ToolCall> & { name: string }>;
  usage?: Record<string, unknown>;
}

/** What RunModel gives the model. */
export interface ModelRequest {
  history: HistoryItem[];
  summary: string | null;
  /** The agent's tools, then the server's built-ins ask_user and sleep. */
  tools: Array<Record<string, any>>;
}

/** Where a model streams live output. */
export interface DeltaSink {
  sendText(text: string): void;
  send(delta: Record<string, unknown>): void;
}

export interface Model {
  respond(request: ModelRequest, stream: DeltaSink): Promise<ModelResponse | ModelResponseLike>;
  summarize(history: HistoryItem[], summary: string | null): Promise<string>;
}

/** A ModelResponse from what a model returned; TypeError naming the bad field otherwise. */
export function coerceResponse(value: unknown, where = "response"): ModelResponse {
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new TypeError(`${where} must be an object {content, toolCalls, usage}`);
  }
  const fields = value as Record<string, unknown>;
  for (const key of Object.keys(fields)) {
    if (!["content", "toolCalls", "tool_calls", "usage"].includes(key)) throw new TypeError(`${where}: unknown field '${key}'`);
  }
  const content = fields.content ?? "";
  if (typeof content !== "string") throw new TypeError(`${where}.content must be a string`);
  const calls = fields.toolCalls ?? fields.tool_calls ?? [];
  if (!Array.isArray(calls)) throw new TypeError(`${where}.toolCalls must be an array`);
  const usage = fields.usage ?? {};
  if (usage === null || typeof usage !== "object") throw new TypeError(`${where}.usage must be an object`);
  return {
    content,
    toolCalls: calls.map((call, i) => coerceCall(call, `${where}.toolCalls[${i}]`)),
    usage: usage as Record<string, unknown>,
  };
}

function coerceCall(value: unknown, where: string): ToolCall {
  if (value === null || typeof value !== "object") throw new TypeError(`${where} must be an object`);
  const { id = null, name, arguments: args = {} } = value as Record<string, any>;
  if (id !== null && (typeof id !== "string" || !id)) throw new TypeError(`${where}.id must be a non-empty string or null`);
  if (typeof name !== "string" || !name) throw new TypeError(`${where}.name must be a non-empty string`);
  if (args === null || typeof args !== "object" || Array.isArray(args)) throw new TypeError(`${where}.arguments must be an object`);
  return { id, name, arguments: args };
}

export class ScriptExhausted extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ScriptExhausted";
  }
}

export type ScriptFunction = (request: ModelRequest) => ModelResponseLike | Promise<ModelResponseLike>;
export type Summarizer = (history: HistoryItem[], summary: string | null) => string | Promise<string>;

/** The default summary records how many responses it covers, so a session's script
 * position survives compaction. */
const RESPONSES_IN_SUMMARY = /model responses so far: (\d+)\)/;

/**
 * A model that answers from a script: a list used in order (each session at its own
 * position), or a function of the request. The position is derived from the request
 * (assistant items in the history, plus those a default summary covers), never kept in
 * memory: it survives a Worker restart, and a repeated attempt gets the same answer.
 */
export class ScriptedModel implements Model {
  private readonly script: ScriptFunction | null;
  private readonly responses: ModelResponse[];
  private readonly summarizer: Summarizer | null;
  private readonly deltaDelayMs: number;

  constructor(
    responses: ModelResponseLike[] | ScriptFunction,
    options: { summarizer?: Summarizer; deltaDelayMs?: number } = {},
  ) {
    if (typeof responses === "function") {
      this.script = responses;
      this.responses = [];
    } else if (Array.isArray(responses)) {
      this.script = null;
      this.responses = responses.map((r, i) => coerceResponse(r, `responses[${i}]`));
    } else {
      throw new TypeError("responses must be an array of responses or a function of the request");
    }
    this.summarizer = options.summarizer ?? null;
    this.deltaDelayMs = options.deltaDelayMs ?? 0;
    if (!(this.deltaDelayMs >= 0)) throw new Error("deltaDelayMs must be a non-negative number");
  }

  async respond(request: ModelRequest, stream: DeltaSink): Promise<ModelResponse> {
    const position = responsesSoFar(request.history, request.summary);
    const response = withCallIds(await this.scripted(request, position), `c${position}`);
    const pieces = wordPieces(response.content);
    for (const piece of pieces) {
      stream.sendText(piece);
      // Yield (or pause) between pieces so the deltas really are live, not one burst.
      await new Promise((resolve) => setTimeout(resolve, this.deltaDelayMs));
    }
    const usage = Object.keys(response.usage).length
      ? response.usage
      : { input_items: request.history.length, output_words: pieces.length };
    return { ...response, usage };
  }

  async summarize(history: HistoryItem[], summary: string | null): Promise<string> {
    if (this.summarizer !== null) {
      const text = await this.summarizer(history, summary);
      if (typeof text !== "string") throw new TypeError(`summarizer must return a string, got ${typeof text}`);
      return text;
    }
    return `summary of ${history.length} items (model responses so far: ${responsesSoFar(history, summary)})`;
  }

  private async scripted(request: ModelRequest, position: number): Promise<ModelResponse> {
    if (this.script !== null) return coerceResponse(await this.script(request), "the script function's response");
    const response = this.responses[position];
    if (response === undefined) {
      throw new ScriptExhausted(
        `ScriptedModel has ${this.responses.length} responses; the session asks for response #${position + 1}`,
      );
    }
    return response;
  }
}

/** Calls without an id get `{prefix}_{index}`: the same script position gives the same ids
 * on every attempt, so a re-run RunModel answers the same calls. */
export function withCallIds(response: ModelResponse, prefix: string): ModelResponse {
  return { ...response, toolCalls: response.toolCalls.map((call, i) => (call.id ? call : { ...call, id: `${prefix}_${i}` })) };
}

/** How many model responses a session has had (assistant items, plus a default summary's count). */
export function responsesSoFar(history: HistoryItem[], summary: string | null): number {
  const match = summary ? RESPONSES_IN_SUMMARY.exec(summary) : null;
  const inSummary = match ? Number(match[1]) : 0;
  return inSummary + history.filter((item) => item !== null && typeof item === "object" && item.type === "assistant").length;
}

/** `text` cut into word-sized pieces that join back to it exactly. */
function wordPieces(text: string): string[] {
  return text.match(/\S+\s*|\s+/g) ?? [];
}
