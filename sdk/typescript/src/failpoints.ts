/**
 * Named crash points for crash tests, armed by DEX_HA_FAILPOINTS as in the Python SDK:
 * `DEX_HA_FAILPOINTS="worker.complete.after-send@2"` makes the process exit with code 99
 * the 2nd time it passes that point (`@N` optional, default 1). Unset, a point costs one
 * map lookup. The Worker's points are listed in WORKER_FAILPOINTS (worker.ts).
 */
export const FAILPOINT_ENV = "DEX_HA_FAILPOINTS";
export const FAILPOINT_EXIT_CODE = 99;

export class Failpoints {
  private readonly remaining = new Map<string, number>();

  constructor(spec: string = process.env[FAILPOINT_ENV] ?? "") {
    for (const item of spec.split(",").map((s) => s.trim()).filter(Boolean)) {
      const [name, count] = item.split("@") as [string, string | undefined];
      if (name.includes(":")) throw new Error(`${FAILPOINT_ENV}: the TypeScript SDK has no failpoint actions (${item})`);
      const times = count === undefined ? 1 : Number(count);
      if (!Number.isInteger(times) || times < 1) throw new Error(`${FAILPOINT_ENV}: bad count in ${JSON.stringify(item)}`);
      this.remaining.set(name, times);
    }
  }

  /** Whether `name` is armed and not yet reached. */
  armed(name: string): boolean {
    return (this.remaining.get(name) ?? 0) > 0;
  }

  hit(name: string): void {
    const left = this.remaining.get(name);
    if (left === undefined) return;
    this.remaining.set(name, left - 1);
    if (left - 1 === 0) process.exit(FAILPOINT_EXIT_CODE);
  }
}
