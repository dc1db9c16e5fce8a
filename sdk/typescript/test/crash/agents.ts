/**
 * The agents the crash cells run with the TypeScript Worker, one per row: the same scripts
 * and tools as the Python ones (tests/crash/agents.py), writing the same ledger lines, so
 * the Python cells check them the same way.
 *
 * A call that must be interrupted *hangs* on the attempts the row names: it stays in the
 * Worker until the failure hits it. `beats: true`: the hanging call sends heartbeats and
 * records each one that got through ("beat"); `beats: false`: it sends none.
 */
import { Agent, type DeltaSink, type ModelRequest, type ModelResponseLike, type Model, type ToolContext } from "../../src/index.js";
import { type Ledger, canonical } from "./ledger.js";

const HANG_TICK_MS = 100;
const LONG_TASK_POLL_MS = 100;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

type Script = (request: ModelRequest, nth: number, stream: DeltaSink) => Promise<ModelResponseLike>;
type SummaryScript = (history: Array<Record<string, any>>, summary: string | null, nth: number) => Promise<string>;
type CallSpec = [string, string, Record<string, unknown>];

export class Kit {
  constructor(
    readonly ledger: Ledger,
    readonly column: string,
  ) {}

  /** Never return: the failure ends this attempt (the process dies, or the server says stop). */
  async hang(kind: string, name: string, ctx: ToolContext | null, beats: boolean): Promise<never> {
    for (;;) {
      if (beats && ctx !== null) {
        await ctx.heartbeat(); // AttemptCancelled once the server says the attempt is over
        this.ledger.record(kind, name, "beat", { call_id: ctx.callId, key: ctx.idempotencyKey, attempt: ctx.attempt });
      }
      if (ctx?.cancelled) throw ctx.signal.reason;
      await sleep(HANG_TICK_MS);
    }
  }

  /** A tool that records its runs and hangs on the attempts `hangOn` picks. */
  tool(
    agent: Agent,
    name: string,
    options: { effect: "read" | "idempotent_write" | "write"; hangOn?: (attempt: number) => boolean; beats?: boolean; output?: unknown; approval?: boolean },
  ): void {
    const { hangOn = () => false, beats = false, output = "done", ...policy } = options;
    agent.tool({ ...policy, name }, async (ctx, args) => {
      const record = { call_id: ctx.callId, key: ctx.idempotencyKey, attempt: ctx.attempt };
      this.ledger.record("tool", name, "started", { ...record, data: args });
      if (hangOn(ctx.attempt)) await this.hang("tool", name, ctx, beats);
      this.ledger.record("tool", name, "finished", { ...record, data: args });
      return output;
    });
  }

  /** A tool that starts a task (recorded as a tool run), then polled by `poll(ctx, handle,
   * before)`, `before` counting the polls that ran before this one (in any attempt). */
  longRunningTool(agent: Agent, name: string, poll: (ctx: ToolContext, handle: unknown, before: number) => Promise<unknown>): void {
    const tool = agent.tool({ effect: "idempotent_write", name }, async (ctx, args) => {
      this.ledger.record("tool", name, "started", { call_id: ctx.callId, key: ctx.idempotencyKey, attempt: ctx.attempt, data: args });
      return ctx.taskHandle(`task-of-${ctx.idempotencyKey}`, LONG_TASK_POLL_MS);
    });
    tool.poll(async (ctx, handle) => {
      const before = this.ledger.count("poll", name);
      this.ledger.record("poll", name, "started", { call_id: ctx.callId, key: ctx.idempotencyKey, attempt: ctx.attempt, data: handle });
      const value = await poll(ctx, handle, before);
      this.ledger.record("poll", name, "finished", { call_id: ctx.callId, attempt: ctx.attempt, data: handle });
      return value;
    });
  }
}

/** A model that records every call with what it saw, then answers from `script(request,
 * nth, stream)`; nth is 1 for the first call with this exact input, 2 for its repeat. */
class LedgerModel implements Model {
  constructor(
    private readonly kit: Kit,
    private readonly name: string,
    private readonly script: Script,
    private readonly summarizer: SummaryScript | null = null,
  ) {}

  private nth(kind: string, seen: unknown): number {
    const text = canonical(seen);
    return 1 + this.kit.ledger.runs(kind, this.name, "started").filter((run) => canonical(run.data) === text).length;
  }

  async respond(request: ModelRequest, stream: DeltaSink): Promise<ModelResponseLike> {
    const seen = { history: request.history, summary: request.summary };
    const nth = this.nth("model", seen);
    this.kit.ledger.record("model", this.name, "started", { attempt: nth, data: seen });
    const reply = await this.script(request, nth, stream);
    this.kit.ledger.record("model", this.name, "finished", { attempt: nth, data: reply });
    return reply;
  }

  async summarize(history: Array<Record<string, any>>, summary: string | null): Promise<string> {
    const seen = { history, summary };
    const nth = this.nth("summary", seen);
    this.kit.ledger.record("summary", this.name, "started", { attempt: nth, data: seen });
    const text = this.summarizer ? await this.summarizer(history, summary, nth) : `summary ${nth}`;
    this.kit.ledger.record("summary", this.name, "finished", { attempt: nth, data: text });
    return text;
  }
}

// ---------------------------------------------------------------- script helpers

function turnItems(request: ModelRequest): Array<Record<string, any>> {
  const users = request.history.flatMap((item, i) => (item.type === "user" ? [i] : []));
  return users.length ? request.history.slice(users[users.length - 1]) : [...request.history];
}

const resultsInTurn = (request: ModelRequest) => turnItems(request).filter((item) => item.type === "tool_result").length;
const userText = (request: ModelRequest): string => turnItems(request)[0]?.text ?? "";
const answer = (text: string): ModelResponseLike => ({ content: text, toolCalls: [] });
const calls = (...specs: CallSpec[]): ModelResponseLike => ({
  content: "",
  toolCalls: specs.map(([id, name, args]) => ({ id, name, arguments: args })),
});
const oneCallThenDone =
  (call: CallSpec): Script =>
  async (request) =>
    resultsInTurn(request) === 0 ? calls(call) : answer("done");
const firstAttempt = (attempt: number) => attempt === 1;
const everyAttempt = () => true;
const numberedAnswer: Script = async (request) => answer(`answer to ${userText(request)}`);

// ---------------------------------------------------------------- one agent per row

type Build = (kit: Kit, name: string) => Agent;

const r01: Build = (kit, name) => {
  const agent = new Agent(name, {
    model: new LedgerModel(kit, name, async (request) => {
      if (userText(request) === "again") return answer("ok");
      if (resultsInTurn(request) === 0) return calls(["c1", "lookup", { q: "x" }]);
      return kit.hang("model", name, null, false); // no output reaches the server
    }),
  });
  kit.tool(agent, "lookup", { effect: "read" });
  return agent;
};

const r02: Build = (kit, name) =>
  new Agent(name, {
    model: new LedgerModel(kit, name, async (_request, nth, stream) => {
      if (nth === 1) {
        for (const word of ["partial ", "answer ", "of attempt one"]) stream.sendText(word);
        await kit.hang("model", name, null, false);
      }
      stream.sendText("final answer");
      return answer("final answer");
    }),
  });

function singleToolRow(tool: string, effect: "read" | "idempotent_write" | "write", hangOn: (attempt: number) => boolean, beats: boolean): Build {
  return (kit, name) => {
    const agent = new Agent(name, { model: new LedgerModel(kit, name, oneCallThenDone(["c1", tool, { id: 7 }])) });
    kit.tool(agent, tool, { effect, hangOn, beats });
    return agent;
  };
}

const r06: Build = (kit, name) => {
  const agent = new Agent(name, {
    model: new LedgerModel(kit, name, async (request) =>
      resultsInTurn(request) === 0 ? calls(["r", "lookup", { q: "x" }], ["w", "put_item", { id: 7 }]) : answer("done"),
    ),
  });
  kit.tool(agent, "lookup", { effect: "read", hangOn: everyAttempt, beats: true });
  kit.tool(agent, "put_item", { effect: "idempotent_write", hangOn: everyAttempt, beats: true });
  return agent;
};

const r09: Build = (kit, name) => {
  const agent = new Agent(name, { model: new LedgerModel(kit, name, oneCallThenDone(["c1", "wire_money", { amount: 5 }])) });
  kit.tool(agent, "wire_money", { effect: "write", approval: true, output: "wired" });
  return agent;
};

const r10: Build = (kit, name) => {
  const agent = new Agent(name, {
    model: new LedgerModel(kit, name, async (request) =>
      resultsInTurn(request) === 0
        ? calls(["ask", "ask_user", { question: "which colour?" }], ["b", "build_branch", { x: 1 }])
        : answer("done"),
    ),
  });
  agent.tool({ effect: "idempotent_write", name: "build_branch" }, async (ctx) => {
    kit.ledger.record("tool", "build_branch", "started", {
      call_id: ctx.callId,
      key: ctx.idempotencyKey,
      attempt: ctx.attempt,
      data: { answer: ctx.answer, has_answer: ctx.hasAnswer },
    });
    const branch = await ctx.ask("which branch?");
    kit.ledger.record("tool", "build_branch", "finished", { call_id: ctx.callId, attempt: ctx.attempt });
    return `built ${branch}`;
  });
  return agent;
};

const SLEEP_MS = 1500;
const r11: Build = (kit, name) => new Agent(name, { model: new LedgerModel(kit, name, oneCallThenDone(["z", "sleep", { ms: SLEEP_MS }])) });

const r12: Build = (kit, name) => {
  const agent = new Agent(name, { model: new LedgerModel(kit, name, oneCallThenDone(["t", "build", { target: "all" }])) });
  kit.longRunningTool(agent, "build", async (ctx, _handle, before) => (before === 0 ? ctx.pending(1500) : "artifact"));
  return agent;
};

const r13: Build = (kit, name) => {
  const agent = new Agent(name, { model: new LedgerModel(kit, name, oneCallThenDone(["t", "build", { target: "all" }])) });
  kit.longRunningTool(agent, "build", async (ctx, _handle, before) => {
    if (before === 0 && kit.column !== "worker_kill") await kit.hang("poll", "build", ctx, true);
    return "artifact";
  });
  return agent;
};

function hangFirstSummary(kit: Kit, name: string): SummaryScript {
  return async (history) => {
    if (kit.ledger.count("summary", name) === 1) await kit.hang("summary", name, null, false);
    return `summary of ${history.length} items`;
  };
}

const R14_MAX_ITEMS = 3;
const r14: Build = (kit, name) =>
  new Agent(name, { model: new LedgerModel(kit, name, numberedAnswer, hangFirstSummary(kit, name)), compaction: { max_items: R14_MAX_ITEMS } });

const r15: Build = (kit, name) => new Agent(name, { model: new LedgerModel(kit, name, numberedAnswer) });

const r16Busy: Build = (kit, name) => {
  const agent = new Agent(name, {
    model: new LedgerModel(kit, name, async (request) => {
      if (userText(request) !== "go") return answer(`answer to ${userText(request)}`);
      return resultsInTurn(request) === 0 ? calls(["c1", "put_item", { id: 7 }]) : answer("done");
    }),
  });
  kit.tool(agent, "put_item", { effect: "idempotent_write", hangOn: firstAttempt, beats: true });
  return agent;
};

export const AGENTS: Record<string, Build> = {
  R01: r01,
  R02: r02,
  R03: singleToolRow("put_item", "idempotent_write", firstAttempt, false),
  R04: singleToolRow("put_item", "idempotent_write", firstAttempt, true),
  R05: singleToolRow("lookup", "read", firstAttempt, true),
  R06: r06,
  R07: singleToolRow("send_email", "write", firstAttempt, false),
  R08: singleToolRow("send_email", "write", firstAttempt, true),
  R09: r09,
  R10: r10,
  R11: r11,
  R12: r12,
  R13: r13,
  R14: r14,
  R15: r15,
  R16: r15,
  "R16-busy": r16Busy,
  R19: singleToolRow("lookup", "read", () => false, false),
  "R19-write": singleToolRow("send_email", "write", () => false, false),
};
