"""Engine benchmark: commands applied per second on one core, and resident memory as the
number of sessions grows.

Workload, in waves of sessions (what a leader proposes for simple agent turns): create the
session, a user message, the model step's hand-out (hand-outs batched 32 per StartQueuedAttempts
as the leader does), the model's answer with two tool calls (a read and an idempotent
write), the two tool hand-outs, their results, the second model hand-out and the final
answer. Commands are encoded before the clock starts (the leader encodes them); the
measured time is `Engine.apply` / `Engine.apply_batch` only (decode + SQLite).

It also counts the SQL statements the engine runs for the same workload (a separate, small
run with SQLite's trace callback; no timing): per command type, per durable step (a step is
handed out to a Worker and its result committed: the StartQueuedAttempts and CompleteAttempt
statements, the follow-ups that queue the next step included, over the number of steps),
and grouped by statement text with its values replaced by `?`. The count is deterministic;
tests/engine/test_statement_count.py holds it to STATEMENTS_PER_STEP_LIMIT.

    python bench/engine_bench.py [--sessions 50000] [--quick]

Prints a table and writes bench/results/engine_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dex_ha.engine import (
    CompleteAttempt,
    CreateSession,
    Engine,
    RegisterAgent,
    SendMessage,
    StartQueuedAttempts,
    encode_command,
)

AGENT = "bench"
HANDOUTS_PER_COMMAND = 32
BATCH_ENTRIES = 64  # committed entries applied per transaction in the batch mode
CHECKPOINTS = (1_000, 5_000, 10_000, 25_000, 50_000)
STEP_COMMANDS = ("StartQueuedAttempts", "CompleteAttempt")  # a step's hand-out and its result
# What the workload runs today is 11.62 per step, and that includes building each Worker's
# task: the apply of a hand-out builds it from the engine's history cache, with no statement
# (it cost 5 to 7 reads on the server's reader connection before). 19 before the engine's hot
# path was cut, 11.87 before the agent's definition came from the cache; a poll's hand-out
# reads the head of the queue once per entry of 32 hand-outs, 0.03 a step, and looks up the
# namespace of its agent once per entry, 0.03 more. A query added to the hot path fails
# tests/engine/test_statement_count.py. The goal is 8; most of what is
# left are writes of state (the attempt, the step, the history item, the next step, the
# tool-call rows), so lowering it means storing less per step.
STATEMENTS_PER_STEP_LIMIT = 11.63
COUNTED_SESSIONS = 200


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# A literal in traced SQL (the trace shows statements with their values filled in): a quoted
# string, a number that is not part of a name, or NULL.
_LITERAL = re.compile(r"'(?:[^']|'')*'|(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])|\bNULL\b")


def normalise_sql(sql: str) -> str:
    """The statement's text with its values replaced by `?` and its spaces collapsed, so the
    executions of one statement group together."""
    return " ".join(_LITERAL.sub("?", sql).split())


class StatementCounter:
    """Counts the statements an engine runs while a command type is applied, by
    (command type, normalised statement). Statements outside `command` (the leader's
    reads between applies) are not counted."""

    def __init__(self, engine: Engine) -> None:
        self.command: str | None = None
        self.counts: Counter[tuple[str, str]] = Counter()
        engine.trace_statements(self._traced)

    def _traced(self, sql: str) -> None:
        if self.command is not None:
            self.counts[(self.command, normalise_sql(sql))] += 1


class Runner:
    """Proposes the workload to one engine and times the applies."""

    def __init__(self, path: str, batch: bool, durable: bool, count_statements: bool = False) -> None:
        self.engine = Engine(path, durable=durable)
        self.statements = StatementCounter(self.engine) if count_statements else None
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
        if self.statements is not None:
            self.statements.command = name
        cpu_start = time.process_time()
        start = time.perf_counter()
        if self.batch:
            for i in range(0, len(entries), BATCH_ENTRIES):
                results += self.engine.apply_batch(entries[i : i + BATCH_ENTRIES])
        else:
            results = [self.engine.apply(i, d) for i, d in entries]
        elapsed = time.perf_counter() - start
        self.cpu_seconds += time.process_time() - cpu_start
        if self.statements is not None:
            self.statements.command = None
        self.seconds += elapsed
        self.commands += len(entries)
        self.by_type[name][0] += len(entries)
        self.by_type[name][1] += elapsed
        bad = [r for r in results if not r.ok]
        assert not bad, bad[:3]
        return results

    def hand_out_all(self, kind: str) -> list[str]:
        """Hand out every queued step (all of `kind` at this point of a wave), as the leader
        answers polls: entries of HANDOUTS_PER_COMMAND from the head of the queue."""
        queued = self.engine.queued_steps(AGENT, 1_000_000)
        assert {s.kind for s in queued} <= {kind}, "the wave queues one kind at a time"
        steps: list[str] = []
        for i in range(0, len(queued), HANDOUTS_PER_COMMAND):
            n = min(HANDOUTS_PER_COMMAND, len(queued) - i)
            secrets = [f"{i + k:032x}" for k in range(n)]
            cmd = StartQueuedAttempts(at=self.at, worker_id="w1", term=1, agents=[AGENT], token_secrets=secrets)
            steps += [s.step_id for s in self.apply([cmd])[0].accepted_value().started]
        assert len(steps) == len(queued)
        return steps

    def complete_all(self, steps: list[str], result: Callable[[str], dict]) -> None:
        self.apply([CompleteAttempt(at=self.at, step_id=s, attempt=1, term=1, result=result(s)) for s in steps])

    def wave(self, first: int, count: int) -> None:
        sessions = [f"sess-{n:06d}" for n in range(first, first + count)]
        self.at += 1_000
        self.apply([CreateSession(at=self.at, session_id=s, agent=AGENT) for s in sessions])
        self.apply(
            [
                SendMessage(at=self.at, session_id=s, text="Find the order and update it.", message_id="m1")
                for s in sessions
            ]
        )
        models = self.hand_out_all("RunModel")
        self.complete_all(
            models,
            lambda s: {
                "content": "Looking it up.",
                "usage": {"input_tokens": 120, "output_tokens": 30},
                "tool_calls": [
                    {"id": f"{s}-a", "name": "lookup", "arguments": {"order": 42}},
                    {"id": f"{s}-b", "name": "update", "arguments": {"order": 42, "state": "paid"}},
                ],
            },
        )
        tools = self.hand_out_all("CallTool")
        self.complete_all(tools, lambda s: {"status": "ok", "output": {"order": 42, "state": "paid"}})
        models = self.hand_out_all("RunModel")
        self.complete_all(models, lambda s: {"content": "Done: order 42 is paid.", "tool_calls": []})


def register_agent(runner: Runner) -> None:
    runner.apply(
        [
            RegisterAgent(
                at=runner.at,
                name=AGENT,
                definition={
                    "tools": [{"name": "lookup", "effect": "read"}, {"name": "update", "effect": "idempotent_write"}]
                },
            )
        ]
    )


def count_statements(sessions: int = COUNTED_SESSIONS) -> dict[str, Any]:
    """The SQL statements the workload runs (apply_batch, as the Raft node applies): per
    command type, per step, and the statements themselves, most run first."""
    with tempfile.TemporaryDirectory(prefix="dex-engine-count-") as tmp:
        runner = Runner(os.path.join(tmp, "engine.db"), batch=True, durable=False, count_statements=True)
        register_agent(runner)
        runner.wave(0, sessions)
        runner.engine.close()
    assert runner.statements is not None
    counts = runner.statements.counts
    by_command: dict[str, int] = defaultdict(int)
    for (command, _), n in counts.items():
        by_command[command] += n
    steps = runner.by_type["CompleteAttempt"][0]
    step_statements = sum(by_command[c] for c in STEP_COMMANDS)
    return {
        "sessions": sessions,
        "steps": steps,
        "statements_per_step": round(step_statements / steps, 2),
        "by_command": {
            name: {
                "commands": runner.by_type[name][0],
                "statements": n,
                "per_command": round(n / runner.by_type[name][0], 2),
            }
            for name, n in by_command.items()
        },
        "top": [
            {"command": command, "sql": sql, "count": n, "per_step": round(n / steps, 2)}
            for (command, sql), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    }


def format_statements(report: dict[str, Any], top: int = 25) -> str:
    """The statement counts as a table for people."""
    lines = [
        f"SQL statements: {report['statements_per_step']} per step "
        f"({report['steps']} steps of {report['sessions']} sessions; {'+'.join(STEP_COMMANDS)} over steps)"
    ]
    for name, v in report["by_command"].items():
        lines.append(
            f"  {name:<16} {v['commands']:>6} commands {v['statements']:>7} statements "
            f"{v['per_command']:>7} per command"
        )
    lines.append(f"top {top} statements (count, per step, command, statement):")
    for t in report["top"][:top]:
        lines.append(f"  {t['count']:>6} {t['per_step']:>6}  {t['command']:<15} {t['sql'][:150]}")
    return "\n".join(lines)


def run(sessions: int, batch: bool, durable: bool, wave: int, checkpoints: tuple[int, ...]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dex-engine-bench-") as tmp:
        path = os.path.join(tmp, "engine.db")
        runner = Runner(path, batch=batch, durable=durable)
        register_agent(runner)
        points = []
        done = 0
        while done < sessions:
            runner.wave(done, min(wave, sessions - done))
            done += min(wave, sessions - done)
            if done in checkpoints or done == sessions:
                points.append(
                    {
                        "sessions": done,
                        "commands": runner.commands,
                        "commands_per_s": round(runner.commands / runner.seconds),
                        "commands_per_cpu_s": round(runner.commands / runner.cpu_seconds),
                        "rss_mb": round(rss_mb(), 1),
                        "db_mb": round(os.path.getsize(path) / 2**20, 1),
                    }
                )
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

    statements = count_statements()
    print(format_statements(statements))
    print()
    runs = [
        run(single_sessions, batch=False, durable=False, wave=1_000, checkpoints=()),
        run(single_sessions, batch=False, durable=True, wave=1_000, checkpoints=()),
        run(growth_sessions, batch=True, durable=True, wave=1_000, checkpoints=checkpoints),
    ]
    print(f"{'mode':<12} {'durable':<8} {'sessions':>9} {'commands':>10} {'cmd/s':>8} {'cmd/cpu-s':>10}")
    for r in runs:
        print(
            f"{r['mode']:<12} {str(r['durable']):<8} {r['sessions']:>9} {r['commands']:>10} "
            f"{r['commands_per_s']:>8} {r['commands_per_cpu_s']:>10}"
        )
    print()
    print("per command type (apply_batch run):")
    for name, v in runs[-1]["by_command"].items():
        print(f"  {name:<16} {v['count']:>9} {v['per_s']:>8}/s")
    print()
    print(
        f"{'sessions':>9} {'commands':>10} {'cmd/s':>8} {'cmd/cpu-s':>10} {'RSS MB':>8} {'DB MB':>8}"
        "   (apply_batch, cumulative)"
    )
    for p in runs[-1]["growth"]:
        print(
            f"{p['sessions']:>9} {p['commands']:>10} {p['commands_per_s']:>8} {p['commands_per_cpu_s']:>10} "
            f"{p['rss_mb']:>8} {p['db_mb']:>8}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    report = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "sqlite": __import__("sqlite3").sqlite_version,
        "target_commands_per_s": 10_000,
        "runs": runs,
        "statements": statements,
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
