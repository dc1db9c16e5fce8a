/**
 * Run an OpenAI Agents SDK for JS agent (`@openai/agents`) durably on dex-ha.
 *
 *     import { Agent as SDKAgent, tool } from "@openai/agents";
 *     import { durableAgent, toolContext } from "@dex-ha/sdk/openai-agents";
 *
 *     const support = new SDKAgent({ name: "support", instructions: "...", tools: [lookupOrder, refund] });
 *     const agent = durableAgent(support, { effects: { lookup_order: "read", refund: "write" } });
 *     await new Worker(urls, { agents: [agent] }).run();
 *
 * The agent keeps its instructions, model, model settings and function tools. dex-ha runs
 * the loop instead of `run()`: each model call is a RunModel step (the agent's own `Model`
 * called inside it, streamed), and each function tool call is its own tool step with the
 * effect you declare (default "write": at most once). Hosted tools run at OpenAI inside the
 * model call, so they repeat when the model step does. What cannot run durably (handoffs,
 * MCP servers, guardrails, local tools) is refused when you call durableAgent, with the
 * reason. The design is the Python adapter's (`dex_ha.adapters.openai_agents`).
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { OpenAIProvider, RunContext, invokeFunctionTool } from "@openai/agents";
import type {
  Agent as SDKAgent,
  AgentInputItem,
  FunctionTool,
  Model as SDKModel,
  ModelProvider,
  ModelRequest as SDKModelRequest,
  ModelResponse as SDKModelResponse,
  SerializedOutputType,
  SerializedTool,
  Tool as SDKTool,
} from "@openai/agents";
import { Agent, BUILTIN_TOOL_NAMES, EFFECTS, type Effect } from "../agent.js";
import type { ToolContext } from "../context.js";
import { NonRetryableError, ToolError } from "../errors.js";
import type { DeltaSink, HistoryItem, Model, ModelRequest, ModelResponse, ToolCall } from "../model.js";
import { type Entry, SUMMARY_INSTRUCTIONS, modelOrder, summaryText, transcript } from "./history.js";

/** A tool whose effect nobody declared runs at most once: the one safe default. */
export const DEFAULT_EFFECT: Effect = "write";
/** HTTP statuses that another attempt with the same input would get again. */
const NON_RETRYABLE_STATUSES = new Set([400, 401, 403, 404, 422]);
/** The role of the session's notes and summary in the model input. */
const NOTE_ROLE = "system";

export interface DurableAgentOptions {
  /** The dex-ha agent name (default: the agent's own name). */
  name?: string;
  /** `{ toolName: effect }`; a tool not named here is a "write" (at most once). */
  effects?: Record<string, Effect>;
  /** Tools that wait for a person's approval in dex-ha before every call. */
  approvals?: string[];
  /** Resolves the agent's model when it is a name or unset (default: an OpenAIProvider
   * made at the first model call, from OPENAI_API_KEY / OPENAI_BASE_URL). */
  modelProvider?: ModelProvider;
  /** The object tools and dynamic instructions see as `runContext.context`. */
  context?: unknown;
  compaction?: { max_items?: number; max_tokens?: number };
  modelStartToCloseMs?: number;
  description?: string;
}

// The dex-ha context of the tool step running now (per async call chain, not a global).
const runningTool = new AsyncLocalStorage<ToolContext>();

/** The dex-ha ToolContext of the tool step running now: call it inside a function tool to
 * read `idempotencyKey`, `attempt`, `sessionId`, or to `heartbeat()`. Throws outside one. */
export function toolContext(): ToolContext {
  const ctx = runningTool.getStore();
  if (ctx === undefined) throw new Error("toolContext() is only available inside a tool that runs as a dex-ha tool step");
  return ctx;
}

/** A dex-ha Agent that runs `agent` (an `@openai/agents` Agent) one durable step at a time. */
export function durableAgent(agent: SDKAgent<any, any>, options: DurableAgentOptions = {}): Agent {
  refuseWhatCannotRunDurably(agent);
  const tools = functionTools(agent);
  const effects = resolveEffects(
    tools.map((tool) => tool.name),
    options.effects ?? {},
  );
  const approvals = resolveApprovals(
    tools.map((tool) => tool.name),
    options.approvals ?? [],
  );
  const dexAgent = new Agent(options.name ?? agent.name, {
    model: new AgentsModel(agent, { modelProvider: options.modelProvider, context: options.context }),
    compaction: options.compaction,
    modelStartToCloseMs: options.modelStartToCloseMs,
    description: options.description ?? (agent.handoffDescription || undefined),
  });
  for (const tool of tools) {
    const approval = approvals.has(tool.name);
    dexAgent.tool(
      {
        effect: effects[tool.name]!,
        name: tool.name,
        description: tool.description || undefined,
        inputSchema: tool.parameters as Record<string, any>,
        approval,
      },
      toolStep(tool, options.context, approval),
    );
  }
  return dexAgent;
}

/** The dex-ha model of an `@openai/agents` Agent: one model call of the agent per RunModel step. */
export class AgentsModel implements Model {
  private provider: ModelProvider | null;
  private readonly context: unknown;

  constructor(
    readonly agent: SDKAgent<any, any>,
    options: { modelProvider?: ModelProvider; context?: unknown } = {},
  ) {
    this.provider = options.modelProvider ?? null;
    this.context = options.context;
  }

  /** Resolve the agent's instructions, tools and prompt as the SDK's runner would, call its
   * model with the session's history, stream the text, return the text and tool calls. */
  async respond(request: ModelRequest, stream: DeltaSink): Promise<ModelResponse> {
    const runContext = new RunContext(this.context);
    const tools = [...(await this.agent.getAllTools(runContext)), ...serverTools(request.tools)];
    const sdkRequest: SDKModelRequest = {
      systemInstructions: await this.agent.getSystemPrompt(runContext),
      input: responsesInput(modelOrder(request.history), request.summary),
      modelSettings: this.agent.modelSettings,
      tools: tools.map(serializeTool),
      outputType: serializedOutputType(this.agent),
      handoffs: [],
      tracing: false,
      prompt: await this.agent.getPrompt(runContext),
    };
    try {
      const model = await this.model();
      return fromResponse(await readStream(model.getStreamedResponse(withoutSdkRetries(sdkRequest)), stream));
    } catch (error) {
      throw mappedError(error);
    }
  }

  /** A summary for compaction, by the agent's model, from the history as a transcript. */
  async summarize(history: HistoryItem[], summary: string | null): Promise<string> {
    try {
      const model = await this.model();
      const response = await model.getResponse(
        withoutSdkRetries({
          systemInstructions: SUMMARY_INSTRUCTIONS,
          input: [{ type: "message", role: "user", content: transcript(history, summary) }],
          modelSettings: {},
          tools: [],
          outputType: "text",
          handoffs: [],
          tracing: false,
        }),
      );
      return fromResponse(response).content;
    } catch (error) {
      throw mappedError(error);
    }
  }

  private async model(): Promise<SDKModel> {
    if (typeof this.agent.model === "object" && this.agent.model !== null) return this.agent.model;
    // Made at the first call, so that building the agent needs no API key.
    this.provider ??= new OpenAIProvider();
    return this.provider.getModel(this.agent.model || undefined);
  }
}

// ---------------------------------------------------------------- the model call

/** The session's entries as the SDK's input items (the Responses API's, in the SDK's names). */
export function responsesInput(entries: Entry[], summary: string | null): AgentInputItem[] {
  const items: AgentInputItem[] = [];
  if (summary) items.push({ type: "message", role: NOTE_ROLE, content: summaryText(summary) });
  for (const entry of entries) {
    if (entry.type === "user") items.push({ type: "message", role: "user", content: entry.text });
    else if (entry.type === "note") items.push({ type: "message", role: NOTE_ROLE, content: entry.text });
    else {
      if (entry.content) {
        items.push({
          type: "message",
          role: "assistant",
          status: "completed",
          content: [{ type: "output_text", text: entry.content }],
        });
      }
      for (const call of entry.calls) {
        items.push({
          type: "function_call",
          callId: call.id,
          name: call.name,
          arguments: JSON.stringify(call.arguments),
          status: "completed",
        });
      }
      for (const call of entry.calls) {
        items.push({ type: "function_call_result", callId: call.id, name: call.name, status: "completed", output: call.output });
      }
    }
  }
  return items;
}

/** The final response of a streamed model call; its text deltas go to `stream` as they come. */
async function readStream(events: AsyncIterable<any>, stream: DeltaSink): Promise<SDKModelResponse> {
  let final: SDKModelResponse | null = null;
  for await (const event of events) {
    if (event.type === "output_text_delta") stream.sendText(event.delta);
    else if (event.type === "response_done") final = event.response as SDKModelResponse;
  }
  if (final === null) throw new Error("the model's stream ended before the response was complete");
  return final;
}

/** A dex-ha ModelResponse from the SDK's: the text, the function calls (their callId is the
 * id the history keeps), the usage. */
export function fromResponse(response: SDKModelResponse): ModelResponse {
  const texts: string[] = [];
  const toolCalls: ToolCall[] = [];
  for (const item of response.output as any[]) {
    if (item.type === "function_call") {
      toolCalls.push({ id: item.callId, name: item.name, arguments: parseArguments(item.arguments, item.name) });
    } else if ((item.type === undefined || item.type === "message") && item.role === "assistant") {
      for (const part of item.content ?? []) {
        if (part.type === "output_text") texts.push(part.text);
        else if (part.type === "refusal") texts.push(part.refusal);
      }
    }
  }
  const usage = response.usage;
  return {
    content: texts.join(""),
    toolCalls,
    usage: usage
      ? { input_tokens: usage.inputTokens, output_tokens: usage.outputTokens, total_tokens: usage.inputTokens + usage.outputTokens }
      : {},
  };
}

function parseArguments(text: string, name: string): Record<string, unknown> {
  let value: unknown = null;
  try {
    value = text.trim() ? JSON.parse(text) : {};
  } catch {
    // reported below
  }
  if (value !== null && typeof value === "object" && !Array.isArray(value)) return value as Record<string, unknown>;
  // Retryable: a model may do better next time.
  throw new Error(`the model called '${name}' with arguments that are not a JSON object: ${text.slice(0, 200)}`);
}

/** The server decides whether a model call runs again: the SDK and its OpenAI client must
 * not retry inside one attempt (that would hide failures and stretch the attempt). The
 * SDK's OpenAI models read this flag of the request, which its own runner sets when it
 * manages retries itself. */
function withoutSdkRetries(request: SDKModelRequest): SDKModelRequest {
  return { ...request, _internal: { runnerManagedRetry: true } } as SDKModelRequest;
}

/** An API error another attempt would get again (400, 401, ...) fails the turn at once. */
function mappedError(error: unknown): unknown {
  const status = (error as { status?: unknown } | null)?.status;
  if (typeof status === "number" && NON_RETRYABLE_STATUSES.has(status)) {
    return new NonRetryableError(`OpenAI API error ${status}: ${(error as Error).message}`);
  }
  return error;
}

function serializeTool(tool: SDKTool<any>): SerializedTool {
  if (tool.type === "function") {
    return { type: "function", name: tool.name, description: tool.description, parameters: tool.parameters, strict: tool.strict };
  }
  return { type: "hosted_tool", name: tool.name, providerData: (tool as any).providerData };
}

function serializedOutputType(agent: SDKAgent<any, any>): SerializedOutputType {
  const outputType = agent.outputType as unknown;
  if (outputType === undefined || outputType === "text") return "text";
  return outputType as SerializedOutputType; // a JSON schema definition (checked in durableAgent)
}

/** The server's built-in tools (ask_user, sleep) as function tools the model can call; the
 * server runs them, never this process. */
function serverTools(tools: Array<Record<string, any>>): FunctionTool<any, any, any>[] {
  return tools
    .filter((tool) => tool.builtin)
    .map(
      (tool) =>
        ({
          type: "function",
          name: tool.name,
          description: tool.description ?? "",
          parameters: tool.input_schema ?? { type: "object", properties: {}, required: [], additionalProperties: true },
          strict: false,
        }) as FunctionTool<any, any, any>,
    );
}

// ---------------------------------------------------------------- tool steps

/** The function of the dex-ha tool step that runs `tool`: the SDK's own invoker (with the
 * tool's timeout), the JSON arguments the model sent, and `toolContext()` for this call. */
function toolStep(tool: FunctionTool<any, any, any>, context: unknown, approval: boolean) {
  const run = async (ctx: ToolContext, args: Record<string, unknown>): Promise<unknown> => {
    const input = JSON.stringify(args);
    const callId = ctx.callId ?? ctx.stepId;
    const runContext = new RunContext(context);
    if (!approval && (await tool.needsApproval(runContext, args, callId))) {
      // Never run a call the SDK says needs approval without one.
      throw new ToolError(
        `tool '${tool.name}' needs approval for this call; list it in durableAgent's approvals to have dex-ha ask for one`,
      );
    }
    const toolCall = { type: "function_call" as const, callId, name: tool.name, arguments: input, status: "completed" as const };
    const output = await runningTool.run(ctx, () =>
      invokeFunctionTool({ tool, runContext, input, details: { toolCall, signal: ctx.signal } }),
    );
    return jsonOutput(output);
  };
  Object.defineProperty(run, "name", { value: tool.name });
  return run;
}

/** A tool's output as a JSON value for the tool step's result. */
function jsonOutput(value: unknown): unknown {
  return value === undefined ? null : JSON.parse(JSON.stringify(value));
}

function functionTools(agent: SDKAgent<any, any>): FunctionTool<any, any, any>[] {
  const tools = agent.tools.filter((tool): tool is FunctionTool<any, any, any> => tool.type === "function");
  for (const tool of tools) {
    if (BUILTIN_TOOL_NAMES.has(tool.name)) {
      throw new Error(`tool '${tool.name}': the name of a built-in tool of the dex-ha server; rename the tool`);
    }
    if (tool.inputGuardrails?.length || tool.outputGuardrails?.length) {
      throw new Error(
        `tool '${tool.name}': tool guardrails are not supported by the dex-ha adapter (check the input inside the tool instead)`,
      );
    }
  }
  return tools;
}

/** Every tool's effect: from `effects`, else DEFAULT_EFFECT. A name that is not a function
 * tool, or an unknown effect, is refused naming it. */
function resolveEffects(names: string[], effects: Record<string, Effect>): Record<string, Effect> {
  for (const [name, effect] of Object.entries(effects)) {
    if (!names.includes(name)) {
      throw new Error(`effects: '${name}' is not a function tool of this agent (its tools: ${names.join(", ") || "none"})`);
    }
    if (!(EFFECTS as readonly string[]).includes(effect)) {
      throw new Error(`effects['${name}']: the effect must be one of ${EFFECTS.join(", ")}; got ${JSON.stringify(effect)}`);
    }
  }
  return Object.fromEntries(names.map((name) => [name, effects[name] ?? DEFAULT_EFFECT]));
}

function resolveApprovals(names: string[], approvals: string[]): Set<string> {
  if (!Array.isArray(approvals)) throw new Error("approvals must be an array of tool names");
  for (const name of approvals) {
    if (!names.includes(name)) throw new Error(`approvals: '${name}' is not a function tool of this agent`);
  }
  return new Set(approvals);
}

/** An Error naming what the adapter cannot run as durable steps, and why. */
function refuseWhatCannotRunDurably(agent: SDKAgent<any, any>): void {
  const what = `agent '${agent.name}'`;
  if (agent.handoffs.length) {
    throw new Error(
      `${what}: handoffs are not supported by the dex-ha adapter (run each agent as its own dex-ha agent, or give it the other agent as a tool with agent.asTool())`,
    );
  }
  if (agent.mcpServers.length) {
    throw new Error(
      `${what}: MCP servers are not supported by the dex-ha adapter (their tools are only known at run time; use hostedMcpTool or wrap the calls in function tools)`,
    );
  }
  if (agent.inputGuardrails.length || agent.outputGuardrails.length) {
    throw new Error(`${what}: input and output guardrails are not supported by the dex-ha adapter`);
  }
  if (agent.toolUseBehavior !== "run_llm_again") {
    throw new Error(
      `${what}: toolUseBehavior must be 'run_llm_again' (dex-ha always gives the tool results back to the model), got ${JSON.stringify(agent.toolUseBehavior)}`,
    );
  }
  const outputType = agent.outputType as any;
  if (outputType !== undefined && outputType !== "text" && outputType?.type !== "json_schema") {
    throw new Error(`${what}: outputType must be "text" or a JSON schema definition ({ type: "json_schema", name, strict, schema })`);
  }
  for (const tool of agent.tools) refuseTool(what, tool);
}

function refuseTool(what: string, tool: SDKTool<any>): void {
  if (tool.type === "function") return;
  if (tool.type !== "hosted_tool") {
    throw new Error(
      `${what}: tool '${tool.name}' (${tool.type}) runs in the agent's process and is not supported by the dex-ha adapter; wrap it in a function tool to run it as a durable step`,
    );
  }
  const config = (tool as any).providerData ?? {};
  if (config.type === "mcp" && (config.require_approval ?? "always") !== "never") {
    throw new Error(
      `${what}: hosted MCP tool '${tool.name}' needs requireApproval 'never' (its approvals would happen inside the model call)`,
    );
  }
}
