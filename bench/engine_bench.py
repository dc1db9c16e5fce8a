"""Engine benchmark: commands applied per second on one core, and resident memory as the
number of sessions grows.

Workload, in waves of sessions (what a leader proposes for simple agent turns): create the
session, a user message, the model step's hand-out (hand-outs batched 32 per StartAttempts
as the leader does), the model's answer with two tool calls (a read and an idempotent
write), the two tool hand-outs, their results, the second model hand-out and the final
answer. Commands are encoded before the clock starts (the leader encodes them); the
measured time is `Engine.apply` / `Engine.apply_batch` only (decode + SQLite).

    python bench/engine_bench.py [--sessions 50000] [--quick]

Prints a table and writes bench/results/engine_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dex_ha.engine import (  # noqa: E402
    CompleteAttempt, CreateSession, Engine, Handout, RegisterAgent, SendMessage, StartAttempts,
    encode_command,
)

AGENT = "bench"
HANDOUTS_PER_COMMAND = 32
BATCH_ENTRIES = 64  # committed entries applied per transaction in the batch mode
CHECKPOINTS = (1_000, 5_000, 10_000, 25_000, 50_000)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Runner:
    """Proposes the workload to one engine and times the applies."""

    def __init__(self, path: str, batch: bool, durable: bool) -> None:
        self.engine = Engine(path, durable=durable)
        self.batch = batch
        self.index = 0
        self.at = 1_700_000_000_000
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # process CPU time: steadier than wall time on a shared machine
        self.commands = 0
        self.by_type: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def apply(self, commands: list[Any]) -> list[Any]:
        entries = []
        for cmd in commands:
            self.index += 1
            entries.append((self.index, encode_command(cmd)))
        name = type(commands[0]).__name__ if commands else "-"
        results = []
        cpu_start = time.process_time()
        start = time.perf_counter()
        if self.batch:
            for i in range(0, len(entries), BATCH_ENTRIES):
                results += self.engine.apply_batch(entries[i:i + BATCH_ENTRIES])
        else:
            results = [self.engine.apply(i, d) for i, d in entries]
        elapsed = time.perf_counter() - start
        self.cpu_seconds += time.process_time() - cpu_start
        self.seconds += elapsed
        self.commands += len(entries)
        self.by_type[name][0] += len(entries)
        self.by_type[name][1] += elapsed
        bad = [r for r in results if not r.ok]
        assert not bad, bad[:3]
        return results

    def hand_out_all(self, kind: str) -> list[str]:
        steps = [s.step_id for s in self.engine.queued_steps(AGENT, 1_000_000) if s.kind == kind]
        for i in range(0, len(steps), HANDOUTS_PER_COMMAND):
            chunk = steps[i:i + HANDOUTS_PER_COMMAND]
            self.apply([StartAttempts(at=self.at, handouts=[Handout(step_id=s, worker_id="w1", term=1)
                                                            for s in chunk])])
        return steps

    def complete_all(self, steps: list[str], result: Callable[[str], dict]) -> None:
        self.apply([CompleteAttempt(at=self.at, step_id=s, attempt=1, term=1, result=result(s))
                    for s in steps])

    def wave(self, first: int, count: int) -> None:
        sessions = [f"sess-{n:06d}" for n in range(first, first + count)]
        self.at += 1_000
        self.apply([CreateSession(at=self.at, session_id=s, agent=AGENT) for s in sessions])
        self.apply([SendMessage(at=self.at, session_id=s, text="Find the order and update it.",
                                message_id="m1") for s in sessions])
        models = self.hand_out_all("RunModel")
        self.complete_all(models, lambda s: {
            "content": "Looking it up.", "usage": {"input_tokens": 120, "output_tokens": 30},
            "tool_calls": [{"id": f"{s}-a", "name": "lookup", "arguments": {"order": 42}},
                           {"id": f"{s}-b", "name": "update", "arguments": {"order": 42, "state": "paid"}}]})
        tools = self.hand_out_all("CallTool")
        self.complete_all(tools, lambda s: {"status": "ok", "output": {"order": 42, "state": "paid"}})
        models = self.hand_out_all("RunModel")
        self.complete_all(models, lambda s: {"content": "Done: order 42 is paid.", "tool_calls": []})


def run(sessions: int, batch: bool, durable: bool, wave: int, checkpoints: tuple[int, ...]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dex-engine-bench-") as tmp:
        path = os.path.join(tmp, "engine.db")
        runner = Runner(path, batch=batch, durable=durable)
        runner.apply([RegisterAgent(at=runner.at, name=AGENT, definition={"tools": [
            {"name": "lookup", "effect": "read"}, {"name": "update", "effect": "idempotent_write"}]})])
        points = []
        done = 0
        while done < sessions:
            runner.wave(done, min(wave, sessions - done))
            done += min(wave, sessions - done)
            if done in checkpoints or done == sessions:
                points.append({"sessions": done, "commands": runner.commands,
                               "commands_per_s": round(runner.commands / runner.seconds),
                               "commands_per_cpu_s": round(runner.commands / runner.cpu_seconds),
                               "rss_mb": round(rss_mb(), 1),
                               "db_mb": round(os.path.getsize(path) / 2**20, 1)})
        runner.engine.close()
        return {
            "mode": "apply_batch" if batch else "apply",
            "durable": durable,
            "sessions": sessions,
            "commands": runner.commands,
            "seconds": round(runner.seconds, 2),
            "commands_per_s": round(runner.commands / runner.seconds),
            "cpu_seconds": round(runner.cpu_seconds, 2),
            "commands_per_cpu_s": round(runner.commands / runner.cpu_seconds),
            "by_command": {name: {"count": n, "per_s": round(n / s)} for name, (n, s) in runner.by_type.items()},
            "growth": points,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50_000, help="sessions in the growth run")
    parser.add_argument("--quick", action="store_true", help="small runs (a smoke test)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine_bench.json"))
    args = parser.parse_args()
    growth_sessions = 2_000 if args.quick else args.sessions
    single_sessions = 1_000 if args.quick else 5_000
    checkpoints = tuple(c for c in CHECKPOINTS if c <= growth_sessions)

    runs = [
        run(single_sessions, batch=False, durable=False, wave=1_000, checkpoints=()),
        run(single_sessions, batch=False, durable=True, wave=1_000, checkpoints=()),
        run(growth_sessions, batch=True, durable=True, wave=1_000, checkpoints=checkpoints),
    ]
    print(f"{'mode':<12} {'durable':<8} {'sessions':>9} {'commands':>10} {'cmd/s':>8} {'cmd/cpu-s':>10}")
    for r in runs:
        print(f"{r['mode']:<12} {str(r['durable']):<8} {r['sessions']:>9} {r['commands']:>10} "
              f"{r['commands_per_s']:>8} {r['commands_per_cpu_s']:>10}")
    print()
    print("per command type (apply_batch run):")
    for name, v in runs[-1]["by_command"].items():
        print(f"  {name:<16} {v['count']:>9} {v['per_s']:>8}/s")
    print()
    print(f"{'sessions':>9} {'commands':>10} {'cmd/s':>8} {'cmd/cpu-s':>10} {'RSS MB':>8} {'DB MB':>8}"
          "   (apply_batch, cumulative)")
    for p in runs[-1]["growth"]:
        print(f"{p['sessions']:>9} {p['commands']:>10} {p['commands_per_s']:>8} {p['commands_per_cpu_s']:>10} "
              f"{p['rss_mb']:>8} {p['db_mb']:>8}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    report = {"python": platform.python_version(), "machine": platform.machine(),
              "sqlite": __import__("sqlite3").sqlite_version, "target_commands_per_s": 10_000, "runs": runs}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
