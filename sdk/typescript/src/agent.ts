/**
 * An Agent: a model, the tools it may call, and the policy of each tool.
 *
 *     const agent = new Agent("support", { model: new ScriptedModel([...]) });
 *     agent.tool({ effect: "read", name: "lookup" }, async (ctx, args) => ...);
 *
 * `agent.definition()` is the body of `PUT /v1/agents/{name}`; the Worker registers it
 * before it runs. The policy fields (effect, approval, inline, timeouts, attempts) tell the
 * server how to run each call; the Worker only runs the functions.
 */
import { ArgumentsRefused } from "./errors.js";
import type { Pending, ToolContext } from "./context.js";
import type { Model } from "./model.js";

/** read: safe to repeat. idempotent_write: repeated with the same `ctx.idempotencyKey`.
 * write: at most one attempt (a crash mid-run records outcome_unknown). */
export const EFFECTS = ["read", "idempotent_write", "write"] as const;
export type Effect = (typeof EFFECTS)[number];
/** The server's own tools (ask_user: a question; sleep: a timer); never declared by an agent. */
export const BUILTIN_TOOL_NAMES: ReadonlySet<string> = new Set(["ask_user", "sleep"]);

export type ToolArguments = Record<string, any>;
export type ToolFunction = (ctx: ToolContext, args: ToolArguments) => unknown | Promise<unknown>;
/** Polls the task a long-running tool started: returns `ctx.pending()`, a value (done), or
 * throws ToolError (done, failed). */
export type PollFunction = (ctx: ToolContext, handle: any) => unknown | Promise<Pending | unknown>;

export interface ToolOptions {
  effect: Effect;
  /** The tool's name; defaults to the function's name. */
  name?: string;
  approval?: boolean;
  /** Run inside the model call (no step of its own); cannot ask, wait for approval, or be long-running. */
  inline?: boolean;
  startToCloseMs?: number;
  maxAttempts?: number;
  description?: string;
  /** The JSON schema of the arguments (the model sees it). Its `required` keys and
   * `additionalProperties: false` are checked before the function runs. */
  inputSchema?: Record<string, any>;
  /** The poll function of a long-running tool (or set it later with `tool.poll(fn)`). */
  poll?: PollFunction;
}

export interface AgentOptions {
  model?: Model | null;
  compaction?: { max_items?: number; max_tokens?: number };
  modelStartToCloseMs?: number;
  description?: string;
}

export class Tool {
  pollFn: PollFunction | null = null;

  constructor(
    readonly name: string,
    readonly fn: ToolFunction,
    readonly options: Omit<ToolOptions, "poll" | "name">,
  ) {}

  get effect(): Effect {
    return this.options.effect;
  }

  get inline(): boolean {
    return this.options.inline ?? false;
  }

  /** Set the poll function of this (long-running) tool. */
  poll(fn: PollFunction): PollFunction {
    if (typeof fn !== "function") throw new Error(`fn: the poll function of tool '${this.name}' must be a function`);
    if (this.inline) throw new Error(`fn: tool '${this.name}' is inline; an inline tool cannot be long-running`);
    if (this.pollFn !== null) throw new Error(`fn: tool '${this.name}' already has a poll function`);
    this.pollFn = fn;
    return fn;
  }

  /** This tool's entry in the agent definition (optional fields only when set). */
  definition(): Record<string, unknown> {
    const o = this.options;
    const entry: Record<string, unknown> = {
      name: this.name,
      effect: o.effect,
      approval: o.approval ?? false,
      inline: o.inline ?? false,
      input_schema: o.inputSchema ?? { type: "object" },
    };
    if (o.description !== undefined) entry.description = o.description;
    if (o.startToCloseMs !== undefined) entry.start_to_close_ms = o.startToCloseMs;
    if (o.maxAttempts !== undefined) entry.max_attempts = o.maxAttempts;
    return entry;
  }

  /** Run the tool with the call's arguments. Arguments that do not fit its schema throw
   * ArgumentsRefused before the function is called (the model sent a bad call). */
  async invoke(ctx: ToolContext, args: unknown): Promise<unknown> {
    if (args === null || typeof args !== "object" || Array.isArray(args)) {
      throw new ArgumentsRefused(`tool '${this.name}': arguments must be an object`);
    }
    checkArguments(this.name, this.options.inputSchema, args as ToolArguments);
    return this.fn(ctx, args as ToolArguments);
  }

  async invokePoll(ctx: ToolContext, handle: unknown): Promise<unknown> {
    if (this.pollFn === null) throw new Error(`tool '${this.name}' has no poll function (set one with tool.poll(fn))`);
    return this.pollFn(ctx, handle);
  }
}

export class Agent {
  readonly tools = new Map<string, Tool>();
  readonly model: Model | null;
  readonly compaction: AgentOptions["compaction"] | null;
  readonly modelStartToCloseMs: number | null;
  readonly description: string | null;

  constructor(
    readonly name: string,
    options: AgentOptions = {},
  ) {
    if (typeof name !== "string" || !name || name.includes("/")) {
      throw new Error(`name must be a non-empty string without '/', got ${JSON.stringify(name)}`);
    }
    this.model = options.model ?? null;
    this.compaction = options.compaction ?? null;
    for (const [key, value] of Object.entries(this.compaction ?? {})) {
      if (!["max_items", "max_tokens"].includes(key)) throw new Error(`compaction: unknown key '${key}' (known: max_items, max_tokens)`);
      positiveInt(value, `compaction.${key}`);
    }
    this.modelStartToCloseMs = options.modelStartToCloseMs === undefined ? null : positiveInt(options.modelStartToCloseMs, "modelStartToCloseMs");
    this.description = options.description ?? null;
  }

  /** Declare a tool of this agent; returns the Tool. `effect` is required. */
  tool(options: ToolOptions, fn: ToolFunction): Tool {
    if (!options || !(EFFECTS as readonly string[]).includes(options.effect)) {
      throw new Error(`effect must be one of ${EFFECTS.join(", ")}; got ${JSON.stringify(options?.effect)}`);
    }
    if (typeof fn !== "function") throw new Error("fn: a tool must be a function");
    const { poll, name, ...policy } = options;
    if (policy.approval && policy.inline) {
      throw new Error("approval: an inline tool runs inside the model call and cannot wait for approval");
    }
    if (policy.startToCloseMs !== undefined) positiveInt(policy.startToCloseMs, "startToCloseMs");
    if (policy.maxAttempts !== undefined) positiveInt(policy.maxAttempts, "maxAttempts");
    const toolName = this.checkNewToolName(name ?? fn.name);
    const tool = new Tool(toolName, fn, policy);
    if (poll !== undefined) tool.poll(poll);
    this.tools.set(toolName, tool);
    return tool;
  }

  /** The body of `PUT /v1/agents/{name}`. */
  definition(): Record<string, unknown> {
    const body: Record<string, unknown> = { tools: [...this.tools.values()].map((tool) => tool.definition()) };
    if (this.compaction && Object.keys(this.compaction).length) body.compaction = { ...this.compaction };
    if (this.modelStartToCloseMs !== null) body.model = { start_to_close_ms: this.modelStartToCloseMs };
    if (this.description !== null) body.description = this.description;
    return body;
  }

  private checkNewToolName(name: unknown): string {
    if (typeof name !== "string" || !name) {
      throw new Error("name: a tool needs a name (options.name, or a named function)");
    }
    if (BUILTIN_TOOL_NAMES.has(name)) throw new Error(`name: '${name}' is a built-in tool of the server; choose another name`);
    if (this.tools.has(name)) throw new Error(`name: agent '${this.name}' already has a tool named '${name}'`);
    return name;
  }
}

function checkArguments(tool: string, schema: Record<string, any> | undefined, args: ToolArguments): void {
  if (!schema) return;
  const properties = schema.properties && typeof schema.properties === "object" ? Object.keys(schema.properties) : [];
  for (const key of Array.isArray(schema.required) ? schema.required : []) {
    if (!(key in args)) throw new ArgumentsRefused(`tool '${tool}': bad arguments: missing required argument '${key}'`);
  }
  if (schema.additionalProperties === false) {
    const unexpected = Object.keys(args).filter((key) => !properties.includes(key));
    if (unexpected.length) {
      throw new ArgumentsRefused(`tool '${tool}': bad arguments: unexpected argument '${unexpected[0]}'`);
    }
  }
}

function positiveInt(value: unknown, name: string): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 1) {
    throw new Error(`${name} must be an integer of at least 1, got ${JSON.stringify(value)}`);
  }
  return value;
}
