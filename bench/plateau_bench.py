"""Does throughput hold as concurrency rises? Two concurrencies measured at the same time.

On a small shared VM the same code runs at one speed now and 20–50% slower a few minutes
later, with no steal showing (other guests share the host's caches and clock). Rows that
bench/steps_bench.py measures one after another then differ by more than the effect sought:
whether 1024 sessions in flight cost more per step than 256.

This bench starts two deployments of the same kind (`--deployment dev`: two `dex-ha dev`
nodes; `cluster`: two three-node clusters), each with its own Worker
(bench/steps_worker.py), and runs the low concurrency on one and the high one on the other
at the same time. Each row warms up as in steps_bench (until every lane is under way); the
two windows then start together and last as long. The next round swaps the deployments.
Both rows share the cores and whatever else the machine does meanwhile, so the ratio of
their steps/s, and of their CPU per step, compares the two concurrencies and not two
moments of the machine. (Each gets about half of the machine, so absolute steps/s are about
half of steps_bench's.)

Per round: both rows (steps/s, CPU ms per step of the nodes and of the Worker). Summary: the
median over the rounds of high/low steps/s (goal ≥ 0.90: past the knee, throughput stays
within 10% of its peak) and of the CPU-per-step ratios. JSON: bench/results/plateau_bench.json.

    python bench/plateau_bench.py [--deployment dev|cluster] [--low 256] [--high 1024] [--rounds 2]
                                  [--duration-s 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench import steps_bench  # noqa: E402  (its deployments, Worker and row, reused as they are)
from bench.common import fmt, ratio  # noqa: E402

DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "plateau_bench.json"
RATIO_GOAL = 0.90  # high/low steps/s: within 10% of the peak


def compare(rows: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The ratios high/low of one round's two rows (`rows` by "low" and "high")."""
    low, high = rows["low"], rows["high"]
    return {
        key: ratio(high[key], low[key], 3)
        for key in ("steps_per_second", "server_cpu_ms_per_step", "worker_cpu_ms_per_step")
    }


def summarize(rounds: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per ratio, the median over the rounds (None where no round had it)."""
    summary: dict[str, float | None] = {}
    for key in ("steps_per_second", "server_cpu_ms_per_step", "worker_cpu_ms_per_step"):
        values = [r["ratios"][key] for r in rounds if r["ratios"][key] is not None]
        summary[f"{key}_ratio"] = round(statistics.median(values), 3) if values else None
    return summary


async def measure_round(
    nodes: list[steps_bench.Deployment],
    roots: list[Path],
    concurrencies: list[int],
    args: argparse.Namespace,
    registry: steps_bench.ProcessRegistry,
    round_index: int,
) -> dict[str, Any]:
    """Deployment i runs concurrencies[i]; both windows start together. A TaskGroup: if one row
    fails, the other is cancelled (it would wait at the barrier for ever)."""
    barrier = asyncio.Barrier(2)
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(steps_bench.measure(node, c, args, root, registry, round_index, barrier))
            for node, root, c in zip(nodes, roots, concurrencies)
        ]
    measured = [asdict(t.result()) for t in tasks]
    by_role = {
        "low": next(r for r in measured if r["concurrency"] == args.low),
        "high": next(r for r in measured if r["concurrency"] == args.high),
    }
    return {
        "round": round_index,
        "deployment_of_high": concurrencies.index(args.high),
        **by_role,
        "ratios": compare(by_role),
    }


def print_round(r: dict[str, Any]) -> None:
    for role in ("low", "high"):
        row = r[role]
        print(
            f"  round {r['round'] + 1} {role:<4} c={row['concurrency']:<5} {row['steps_per_second']:>7.0f} steps/s  "
            f"nodes {fmt(row['server_cpu_ms_per_step'], '.3f')} ms/step  "
            f"Worker {fmt(row['worker_cpu_ms_per_step'], '.3f')} ms/step  warm-up {row['warmup_s']:.1f} s",
            flush=True,
        )
    q = r["ratios"]
    print(
        f"  round {r['round'] + 1} high/low: steps/s {fmt(q['steps_per_second'], '.3f')}, nodes' CPU per step "
        f"{fmt(q['server_cpu_ms_per_step'], '.3f')}, Worker CPU per step {fmt(q['worker_cpu_ms_per_step'], '.3f')}",
        flush=True,
    )


async def main_async(args: argparse.Namespace, registry: steps_bench.ProcessRegistry) -> dict[str, Any]:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # stop like Ctrl-C
    result: dict[str, Any] = {
        "deployment": args.deployment,
        "low": args.low,
        "high": args.high,
        "rounds": [],
        "duration_s": args.duration_s,
        "warmup_s": args.warmup_s,
        "turns_per_session": args.turns_per_session,
        "cores": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "goal": f"steps_per_second_ratio >= {RATIO_GOAL}",
    }
    with tempfile.TemporaryDirectory(prefix="dex-plateau-bench-") as tmp:
        roots = [Path(tmp) / "a", Path(tmp) / "b"]
        for root in roots:
            root.mkdir()
        print(f"starting two {args.deployment} deployments ...", flush=True)
        start = steps_bench.start_dev if args.deployment == "dev" else steps_bench.start_cluster
        nodes: list[steps_bench.Deployment] = []
        try:
            for root in roots:
                nodes.append(await start(root, registry))
            for round_index in range(args.rounds):
                pair = steps_bench.round_order([args.low, args.high], round_index)
                print(
                    f"round {round_index + 1}/{args.rounds}: c={pair[0]} on deployment a, c={pair[1]} on b, "
                    f"both windows {args.duration_s:g} s after both warm-ups ...",
                    flush=True,
                )
                measured = await measure_round(nodes, roots, pair, args, registry, round_index)
                result["rounds"].append(measured)
                print_round(measured)
        finally:
            for node in nodes:
                await asyncio.to_thread(node.stop)
    result["summary"] = summarize(result["rounds"])
    return result


def print_summary(result: dict[str, Any]) -> None:
    s = result["summary"]
    value = s["steps_per_second_ratio"]
    verdict = "not measured" if value is None else ("met" if value >= RATIO_GOAL else "MISSED")
    print(
        f"\n{result['deployment']}: c={result['high']} against c={result['low']}, measured at the same time, median of "
        f"{len(result['rounds'])} rounds:\n"
        f"  steps/s ratio          {fmt(value, '.3f'):>6}   goal >= {RATIO_GOAL}  {verdict}\n"
        f"  nodes' CPU per step    {fmt(s['server_cpu_ms_per_step_ratio'], '.3f'):>6}\n"
        f"  Worker CPU per step    {fmt(s['worker_cpu_ms_per_step_ratio'], '.3f'):>6}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--deployment", choices=("dev", "cluster"), default="dev", help="one node or three each (default dev)"
    )
    parser.add_argument("--low", type=int, default=256, help="the lower concurrency (default 256)")
    parser.add_argument("--high", type=int, default=1024, help="the higher concurrency (default 1024)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the nodes swapped each round (default 2)")
    parser.add_argument("--duration-s", type=float, default=60.0, help="measured seconds per round")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="least unmeasured seconds before a window")
    parser.add_argument("--turns-per-session", type=int, default=10, help="turns queued in each session")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help=f"where to write the JSON (default {DEFAULT_JSON})")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.low < args.high:
        parser.error("--low and --high: 1 <= low < high")
    if args.rounds < 1 or args.duration_s <= 0 or args.warmup_s < 0 or args.turns_per_session < 1:
        parser.error("--rounds >= 1, --duration-s > 0, --warmup-s >= 0, --turns-per-session >= 1")
    result = steps_bench.run_stopping_every_process(lambda registry: main_async(args, registry))
    if result is None:
        return 130
    print_summary(result)
    print(f"\nwrote {steps_bench.write_json(result, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
