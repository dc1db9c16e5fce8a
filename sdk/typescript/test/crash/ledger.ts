/**
 * The side-effect ledger of a crash cell, as the TypeScript Worker writes it: one JSON line
 * per thing that happened (a tool started or finished, a heartbeat got through, a poll ran,
 * the model was called with what it saw). The Python cell reads the same file
 * (tests/crash/ledger.py, JsonLedger). Every line is one append(2) of the whole line,
 * written synchronously, so a SIGKILL loses nothing written before it.
 */
import { appendFileSync, existsSync, readFileSync } from "node:fs";

export interface Run {
  seq: number;
  kind: string;
  name: string;
  moment: string;
  call_id: string | null;
  key: string | null;
  attempt: number | null;
  data: unknown;
  pid: number;
  at: number;
}

export interface RecordFields {
  call_id?: string | null;
  key?: string | null;
  attempt?: number | null;
  data?: unknown;
}

export class Ledger {
  constructor(readonly path: string) {}

  record(kind: string, name: string, moment: string, fields: RecordFields = {}): void {
    const line = {
      kind,
      name,
      moment,
      call_id: fields.call_id ?? null,
      key: fields.key ?? null,
      attempt: fields.attempt ?? null,
      data: fields.data ?? null,
      pid: process.pid,
      at: Date.now() / 1000,
    };
    appendFileSync(this.path, JSON.stringify(line) + "\n");
  }

  runs(kind?: string, name?: string, moment?: string): Run[] {
    if (!existsSync(this.path)) return [];
    const lines = readFileSync(this.path, "utf8").split("\n");
    const runs: Run[] = [];
    lines.forEach((line, i) => {
      if (!line.endsWith("}")) return; // the last line may be half written by a dying process
      const run = { seq: i + 1, ...JSON.parse(line) } as Run;
      if ((kind === undefined || run.kind === kind) && (name === undefined || run.name === name) && (moment === undefined || run.moment === moment)) {
        runs.push(run);
      }
    });
    return runs;
  }

  count(kind: string, name?: string, moment = "started"): number {
    return this.runs(kind, name, moment).length;
  }
}

/** JSON with sorted keys: two values the server sent are equal when their texts are. */
export function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, v) =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, v[k]]))
      : v,
  );
}
