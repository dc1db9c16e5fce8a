"""Failover benchmark: how long the cluster is without an active node, under steady load.

Three real nodes (`dex-ha node`, strict durability unless `--relaxed`) whose Raft links run
through the fault proxy of harness/fault_proxy.py, HAProxy with the shipped
deploy/haproxy.cfg in front of them (when `haproxy` is installed), and a steady step load
all along: two lanes, each a Worker and `--sessions` clients that run turns back to back
(RunModel, CallTool, RunModel per turn: bench/steps_worker.py's agent), one lane given the
three node URLs (the SDK follows the active node), one given only HAProxy's address.

A recorder asks every node's /readyz (probe port) every 10 ms (harness/readiness_record.py).
For each fault, `--runs` times:
- kill:      SIGKILL the active node (then restart it and let it rejoin before the next run);
- partition: cut the active node off from both peers (then heal).
Measured per run, from the instant of the fault:
- ready:       until another node's /readyz answers 200 (the record);
- step (urls): until the first step handed out and completed after that (a Worker result
               the server accepted), in the lane that knows the node URLs;
- step (haproxy): the same in the lane that knows only HAProxy;
- failed:      attempts that failed in the failover (state database, before and after);
- overlap:     probe rounds in which two nodes answered 200.
And `--runs` planned step downs (POST /v1/cluster/step-down under the same load): the
readiness gap, from the old node's first 503 to the new node's first 200.

It prints a table (median and max over the runs), the targets next to the measured values,
and writes JSON (default bench/results/failover_bench.json). Processes are started on free
loopback ports and stopped by pid.

    python bench/failover_bench.py [--runs 10] [--sessions 4] [--relaxed] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.common import fmt  # noqa: E402
from bench.steps_worker import bench_agent  # noqa: E402
from dex_ha.client import DexClient, DexError  # noqa: E402
from dex_ha.server.config import ServerConfig  # noqa: E402
from dex_ha.worker import Worker, WorkerTask  # noqa: E402
from harness.haproxy_process import haproxy_binary, haproxy_in_front_of  # noqa: E402
from harness.proxied_cluster import ProxiedCluster  # noqa: E402
from harness.readiness_record import ReadinessRecorder  # noqa: E402
from harness.scenario import failed_attempts, rejoined  # noqa: E402

DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "failover_bench.json"
ELECTION_TIMEOUT_MAX_S = ServerConfig.election_timeout_max_ms / 1000
FAULTS = ("kill", "partition")
# Goals, printed next to what was measured (never in place of it).
TARGETS: dict[str, tuple[str, float]] = {  # name -> (what, limit in seconds; 0 for a count)
    "kill_ready_p50": ("kill -> another node ready, median", 0.8),
    "kill_ready_max": ("kill -> another node ready, max", 1.2),
    "partition_ready_max": (
        f"partition -> ready, max (election timeout {ELECTION_TIMEOUT_MAX_S * 1000:.0f} ms + 300 ms)",
        ELECTION_TIMEOUT_MAX_S + 0.3,
    ),
    "haproxy_first_step_max": ("fault -> first step done through HAProxy, max", 1.5),
    "step_down_gap_max": ("planned step down readiness gap, max", 0.1),
    "overlap_rounds": ("probe rounds with two ready nodes", 0),
}
FAULT_DEADLINE_S = 30.0
STEADY_DEADLINE_S = 30.0


@dataclass
class FailoverRun:
    fault: str
    run: int
    old: str
    new: str
    ready_s: float
    first_step_s: dict[str, float | None]  # lane -> seconds
    failed_attempts: int | None
    overlap_rounds: int


@dataclass
class StepDownRun:
    run: int
    old: str
    new: str
    gap_s: float | None  # old node's first non-200 -> new node's first 200
    overlap_rounds: int


# ---------------------------------------------------------------- the steady load


@dataclass
class StepClock:
    """When each lane's steps completed: a result the server accepted (it answers only
    after the commit), as the Worker's on_result reports it."""

    done: dict[str, list[float]] = field(default_factory=dict)  # lane -> time.monotonic() of each
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def on_result(self, lane: str) -> Callable[[WorkerTask, Any], None]:
        def record(task: WorkerTask, outcome: Any) -> None:
            if not outcome.failed:
                self.done.setdefault(lane, []).append(time.monotonic())
                self.changed.set()

        return record

    async def first_after(self, lane: str, since: float, deadline_s: float) -> float | None:
        """When the first step of `lane` completed after `since` (None: none by the deadline)."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            found = [at for at in self.done.get(lane, []) if at > since]
            if found:
                return min(found)
            self.changed.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self.changed.wait()
            except TimeoutError:
                break
        return None


async def run_turns(client: DexClient, agent: str, stop: asyncio.Event) -> None:
    """One client: a session, then turn after turn until `stop` (errors retried: failovers)."""
    sid = f"fo-{uuid.uuid4().hex[:12]}"
    n = 0
    while not stop.is_set():
        try:
            await client.create_session(agent, sid)
            await client.send_message(sid, f"turn {n}", message_id=f"{sid}-{n}")
            await client.wait_until_idle(sid, timeout_s=FAULT_DEADLINE_S)
            n += 1
        except (TimeoutError, DexError):
            await asyncio.sleep(0.05)


async def start_lane(
    stack: AsyncExitStack,
    lane: str,
    urls: list[str],
    tokens: dict[str, str],
    sessions: int,
    clock: StepClock,
    stop: asyncio.Event,
) -> None:
    agent = bench_agent(f"failover-{lane}")
    worker = Worker(
        urls,
        token=tokens["worker"],
        agents=[agent],
        poll_wait_ms=2_000,
        heartbeat_interval_s=0.5,
        drain_timeout_s=1.0,
        on_result=clock.on_result(lane),
    )
    client = await stack.enter_async_context(DexClient(urls, token=tokens["client"]))
    tasks = [asyncio.create_task(worker.run())]
    tasks += [asyncio.create_task(run_turns(client, agent.name, stop)) for _ in range(sessions)]

    async def stop_lane() -> None:
        stop.set()
        await worker.stop(drain_timeout_s=1.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    stack.push_async_callback(stop_lane)


# ---------------------------------------------------------------- one run


class Bench:
    def __init__(self, cluster: ProxiedCluster, record: ReadinessRecorder, clock: StepClock, lanes: list[str]) -> None:
        self.cluster = cluster
        self.record = record
        self.clock = clock
        self.lanes = lanes

    async def steady(self) -> None:
        """Every lane completes steps now (so a fault hits a loaded cluster)."""
        now = time.monotonic()
        for lane in self.lanes:
            if await self.clock.first_after(lane, now, STEADY_DEADLINE_S) is None:
                raise RuntimeError(f"lane {lane}: no step completed in {STEADY_DEADLINE_S:.0f} s")

    def overlaps_since(self, since: float) -> int:
        return sum(1 for _, nodes in self.record.ready_by_round(since).items() if len(nodes) > 1)

    async def failover(self, fault: str, run: int) -> FailoverRun:
        cluster = self.cluster
        await self.steady()
        old = await cluster.active_node()
        failed_before = failed_attempts(cluster.plan.node(old).data_dir)
        fault_at = time.monotonic()
        if fault == "kill":
            cluster.kill(old)
        else:
            await cluster.mesh.isolate(old)
        first = await self.record.wait_ready(fault_at, set(cluster.node_ids) - {old}, FAULT_DEADLINE_S)
        new = first.node
        # A step completed after another node became ready was committed by that node: the old
        # one is dead or cut off from the quorum. (Results answered between the fault and then
        # were committed before the fault.)
        steps = {lane: await self.clock.first_after(lane, first.at, FAULT_DEADLINE_S) for lane in self.lanes}
        await self.record.next_round()
        overlaps = self.overlaps_since(fault_at)
        if fault == "kill":
            cluster.start_node(old)
        else:
            await cluster.mesh.heal()
        await rejoined(cluster, old, new)
        failed = failed_attempts(cluster.plan.node(new).data_dir) - failed_before
        return FailoverRun(
            fault,
            run,
            old,
            new,
            first.at - fault_at,
            {lane: None if at is None else at - fault_at for lane, at in steps.items()},
            failed,
            overlaps,
        )

    async def step_down(self, run: int) -> StepDownRun:
        cluster = self.cluster
        await self.steady()
        old = await cluster.active_node()
        asked_at = time.monotonic()
        async with aiohttp.ClientSession() as http:
            async with http.post(
                cluster.urls[old] + "/v1/cluster/step-down",
                json={"drain_timeout_ms": 10_000},
                headers={"Authorization": f"Bearer {cluster.tokens['admin']}"},
                timeout=aiohttp.ClientTimeout(total=FAULT_DEADLINE_S),
            ) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"step down refused: {resp.status} {await resp.text()}")
        ready = await self.record.wait_ready(asked_at, set(cluster.node_ids) - {old}, FAULT_DEADLINE_S)
        new = ready.node
        not_ready = next(
            (row for row in self.record.rows if row.at >= asked_at and row.node == old and row.status != 200), None
        )
        gap = None if not_ready is None else ready.at - not_ready.at
        await rejoined(cluster, old, new)
        return StepDownRun(run, old, new, gap, self.overlaps_since(asked_at))


# ---------------------------------------------------------------- summary and table


def median_max(values: list[float | None]) -> tuple[float | None, float | None]:
    seen = [v for v in values if v is not None]
    return (statistics.median(seen), max(seen)) if seen else (None, None)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for fault in FAULTS:
        runs = [r for r in result["failovers"] if r["fault"] == fault]
        summary[fault] = {
            "runs": len(runs),
            "ready_s": median_max([r["ready_s"] for r in runs]),
            "first_step_s": {lane: median_max([r["first_step_s"].get(lane) for r in runs]) for lane in result["lanes"]},
            "failed_attempts": median_max([r["failed_attempts"] for r in runs]),
            "overlap_rounds": sum(r["overlap_rounds"] for r in runs),
            "missing": sum(
                1 for r in runs if r["ready_s"] is None or any(v is None for v in r["first_step_s"].values())
            ),
        }
    summary["step_down"] = {
        "runs": len(result["step_downs"]),
        "gap_s": median_max([r["gap_s"] for r in result["step_downs"]]),
        "overlap_rounds": sum(r["overlap_rounds"] for r in result["step_downs"]),
    }
    return summary


def measured_for_targets(summary: dict[str, Any]) -> dict[str, float | None]:
    haproxy = [summary[f]["first_step_s"].get("haproxy", (None, None))[1] for f in FAULTS]
    return {
        "kill_ready_p50": summary["kill"]["ready_s"][0],
        "kill_ready_max": summary["kill"]["ready_s"][1],
        "partition_ready_max": summary["partition"]["ready_s"][1],
        "haproxy_first_step_max": max((v for v in haproxy if v is not None), default=None),
        "step_down_gap_max": summary["step_down"]["gap_s"][1],
        "overlap_rounds": sum(summary[f]["overlap_rounds"] for f in FAULTS) + summary["step_down"]["overlap_rounds"],
    }


def ms(pair: tuple[float | None, float | None]) -> str:
    return f"{fmt(None if pair[0] is None else pair[0] * 1000, '.0f')} / {fmt(None if pair[1] is None else pair[1] * 1000, '.0f')}"


def print_table(result: dict[str, Any]) -> None:
    summary = result["summary"]
    lanes = result["lanes"]
    print(
        f"\nFailover benchmark ({result['durability']} durability; {result['runs']} runs per fault; steady load: "
        f"{result['sessions']} sessions per lane, lanes {', '.join(lanes)}; readiness asked every 10 ms)"
    )
    print(
        f"machine: {result['cores']} cores, load average at start {result['load_average_at_start']} "
        f"(shared: other work on it counts in every number)"
    )
    print("times are median / max in ms, from the instant of the fault")
    head = f"{'fault':<10} {'runs':>4} {'ready':>13}" + "".join(f" {'step (' + lane + ')':>17}" for lane in lanes)
    print(head + f" {'failed attempts':>15} {'overlap':>7}")
    for fault in FAULTS:
        s = summary[fault]
        failed = s["failed_attempts"]
        line = f"{fault:<10} {s['runs']:>4} {ms(s['ready_s']):>13}"
        line += "".join(f" {ms(s['first_step_s'][lane]):>17}" for lane in lanes)
        print(line + f" {fmt(failed[0], '.0f') + ' / ' + fmt(failed[1], '.0f'):>15} {s['overlap_rounds']:>7}")
    sd = summary["step_down"]
    print(
        f"planned step down: {sd['runs']} runs, readiness gap (old 503 -> new 200) {ms(sd['gap_s'])} ms, "
        f"overlap {sd['overlap_rounds']}"
    )
    print(f"\n{'target':<62} {'measured':>10}   goal")
    for name, (what, limit) in TARGETS.items():
        value = result["measured"][name]
        if name == "overlap_rounds":
            shown, goal, met = fmt(value, ".0f"), "0", value == 0
        else:
            shown, goal = fmt(None if value is None else value * 1000, ".0f") + " ms", f"<= {limit * 1000:.0f} ms"
            met = value is not None and value <= limit
        verdict = "not measured" if value is None else ("met" if met else "MISSED")
        print(f"{what:<62} {shown:>10}   {goal:<10} {verdict}")


# ---------------------------------------------------------------- the run


async def measure(args: argparse.Namespace, root: Path, result: dict[str, Any]) -> None:
    cluster = ProxiedCluster(root / "cluster", durability="relaxed" if args.relaxed else "strict")
    clock = StepClock()
    stop = asyncio.Event()
    async with AsyncExitStack() as stack:
        stack.push_async_callback(cluster.stop)
        await cluster.start()
        lanes = {"urls": list(cluster.urls.values())}
        if haproxy_binary() is not None:
            proxy = stack.enter_context(haproxy_in_front_of(cluster.urls, cluster.probe_ports, root))
            lanes["haproxy"] = [proxy.url]
            assert proxy.proc is not None
            result["pids"].append(proxy.proc.pid)
        else:
            print("haproxy is not installed: the HAProxy lane is left out", flush=True)
        result["lanes"] = list(lanes)
        record = await stack.enter_async_context(ReadinessRecorder(cluster.probe_urls))
        for lane, urls in lanes.items():
            await start_lane(stack, lane, urls, cluster.tokens, args.sessions, clock, stop)
        bench = Bench(cluster, record, clock, list(lanes))
        for fault in FAULTS:
            for run in range(args.runs):
                row = await bench.failover(fault, run)
                result["failovers"].append(asdict(row))
                print(
                    f"[{fault} {run + 1}/{args.runs}] {row.old} -> {row.new}: ready "
                    f"{fmt(row.ready_s and row.ready_s * 1000, '.0f')} ms, first step "
                    + ", ".join(f"{lane} {fmt(v and v * 1000, '.0f')} ms" for lane, v in row.first_step_s.items())
                    + f", failed attempts {row.failed_attempts}, overlap {row.overlap_rounds}",
                    flush=True,
                )
        for run in range(args.runs):
            down = await bench.step_down(run)
            result["step_downs"].append(asdict(down))
            print(
                f"[step down {run + 1}/{args.runs}] {down.old} -> {down.new}: gap "
                f"{fmt(down.gap_s and down.gap_s * 1000, '.0f')} ms, overlap {down.overlap_rounds}",
                flush=True,
            )
        result["probe_rounds"] = record.rounds
        result["pids"] += cluster.started_pids


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    main_task = asyncio.current_task()
    assert main_task is not None
    # SIGTERM stops the bench like Ctrl-C: the exit stack stops every process by pid.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    result: dict[str, Any] = {
        "runs": args.runs,
        "sessions": args.sessions,
        "durability": "relaxed" if args.relaxed else "strict",
        "cores": os.cpu_count(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "election_timeout_max_s": ELECTION_TIMEOUT_MAX_S,
        "targets": {name: {"what": what, "limit": limit} for name, (what, limit) in TARGETS.items()},
        "failovers": [],
        "step_downs": [],
        "pids": [],
    }
    with tempfile.TemporaryDirectory(prefix="dex-failover-bench-") as tmp:
        await measure(args, Path(args.work_dir) if args.work_dir else Path(tmp), result)
    result["summary"] = summarize(result)
    result["measured"] = measured_for_targets(result["summary"])
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="runs per fault, and step downs (default 10)")
    parser.add_argument("--sessions", type=int, default=4, help="concurrent sessions per lane (default 4)")
    parser.add_argument("--relaxed", action="store_true", help="durability relaxed (no fsync) instead of strict")
    parser.add_argument("--work-dir", help="keep data and node logs here (default: a temporary directory)")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help=f"where to write the JSON (default {DEFAULT_JSON})")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.runs < 1 or args.sessions < 1:
        parser.error("--runs and --sessions must be >= 1")
    result = asyncio.run(main_async(args))
    print_table(result)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nJSON written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
