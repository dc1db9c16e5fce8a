"""One robustness run of one seed, and its report.

1. A three-node cluster (real `dex-ha node` processes, Raft links through the fault proxy,
   harness/proxied_cluster.py; each node with a wall clock of its own that a fault can
   step, and its data directory on a small tmpfs of its own that a fault can fill) and two
   Worker processes running the `robustness` agent (tests/crash/worker_proc.py), which
   record every tool run in a ledger.
2. While a recorder asks every node's /readyz, the sessions of workload.py run through the
   SDK and faults.py injects faults, one after the other, for the run's time.
3. Healing: every fault undone; the sessions stop sending, decide what waits and wait
   until they are idle (a deadline); their final snapshots are read through the API.
4. The Workers stop; once every node has applied the active node's commit index, every
   node is stopped at once (SIGKILL) and its state.db dumped (replicas.py). If an entry
   applied in between, the nodes are started and stopped again.
5. checker.py judges the evidence; the report counts faults, operations and violations.

`random.Random(seed)` decides everything that is chosen: the faults, their targets and
times, and (through one Random per session drawn from it) what each session asks for.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.proxied_cluster import ProxiedCluster
from harness.readiness_record import ReadinessRecorder
from harness.scenario import all_caught_up
from tests.crash.columns import WorkerProcess
from tests.crash.ledger import Ledger
from tests.robustness.checker import INVARIANTS, Evidence, check_all, operations_checked
from tests.robustness.faults import (
    ADDED_WHEN_AVAILABLE,
    FAULTS,
    FaultEnv,
    Injected,
    give_clocks,
    heal,
    inject_until,
    small_disks,
)
from tests.robustness.replicas import StateDump, dump_state
from tests.robustness.workload import (
    ACK_DEADLINE_S,
    AGENT,
    Acknowledged,
    SessionClient,
    client_for,
    final_snapshots,
    session_rngs,
)

SEED_ENV = "DEX_HA_ROBUSTNESS_SEED"
SESSIONS = 4
WORKERS = 2
NODE_SETTINGS = {"heartbeat_timeout_ms": 2_000}  # a killed Worker's attempt fails in ~2 s, not 30 s
DRAIN_TIMEOUT_MS = 1_000  # a graceful stop (restart_all with SIGTERM) waits this long for attempts
RECORD_INTERVAL_S = 0.025  # one /readyz round of every node
SETTLE_DEADLINE_S = 90.0  # after healing: every session idle (or waiting for a person)
SNAPSHOT_DEADLINE_S = 30.0
CATCH_UP_DEADLINE_S = 60.0
STOP_TRIES = 3


def replay_command(seed: int) -> str:
    return f"{SEED_ENV}={seed} python -m pytest tests/robustness -k replay -s"


@dataclass
class RunResult:
    seed: int
    fault_s: float
    seconds: float
    directory: Path
    injected: list[Injected]
    skipped: dict[str, str]  # fault kind -> why this machine could not inject it
    node_exits: list[str]
    evidence: Evidence
    violations: dict[str, list[str]]

    @property
    def violation_count(self) -> int:
        return sum(len(v) for v in self.violations.values())

    def table(self) -> str:
        faults = Counter(i.kind for i in self.injected)
        ops = operations_checked(self.evidence)
        lines = [
            f"robustness seed {self.seed}: {self.fault_s:.0f} s of faults, {self.seconds:.0f} s in all, "
            f"{SESSIONS} sessions, {WORKERS} Worker processes",
            "  faults injected:",
            *(self.fault_line(kind, faults[kind]) for kind in FAULTS),
            *(f"    {kind:<40} {'-':>6}  (added when available)" for kind in ADDED_WHEN_AVAILABLE),
            "  operations checked:",
            *(f"    {kind:<40} {n:>6}" for kind, n in sorted(ops.items())),
            "  violations:",
            *(f"    {name:<40} {len(self.violations[name]):>6}" for name in INVARIANTS),
        ]
        lines += [f"  a node had exited by itself: {line}" for line in self.node_exits]
        for name in INVARIANTS:
            lines += [f"  {name}: {line}" for line in self.violations[name][:20]]
        if self.violation_count:
            lines += ["  faults, in order:", *(f"    {i.started_s:6.1f} s  {i.kind}: {i.what}" for i in self.injected)]
            lines += [f"  replay: {replay_command(self.seed)}", f"  logs: {self.directory}"]
        return "\n".join(lines)

    def fault_line(self, kind: str, count: int) -> str:
        if kind in self.skipped:
            return f"    {kind:<40} {'-':>6}  (skipped: {self.skipped[kind]})"
        return f"    {kind:<40} {count:>6}"

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "replay": replay_command(self.seed),
            "fault_seconds": self.fault_s,
            "seconds": round(self.seconds, 1),
            "faults": dict(Counter(i.kind for i in self.injected)),
            "faults_skipped": self.skipped,
            "faults_added_when_available": ADDED_WHEN_AVAILABLE,
            "fault_log": [vars(i) for i in self.injected],
            "node_exits": self.node_exits,
            "operations": dict(operations_checked(self.evidence)),
            "violations": self.violations,
            "replicas": {
                node: {"applied_index": dump.applied_index, "tables": dump.digests()}
                for node, dump in self.evidence.dumps.items()
            },
        }

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.as_json(), indent=2, default=str))


async def run_seed(seed: int, directory: Path, fault_s: float) -> RunResult:
    began = time.monotonic()
    rng = random.Random(seed)
    fault_rng = random.Random(rng.getrandbits(64))
    rngs = session_rngs(rng, SESSIONS)
    directory.mkdir(parents=True, exist_ok=True)
    cluster = ProxiedCluster(directory / "cluster", settings=NODE_SETTINGS, drain_timeout_ms=DRAIN_TIMEOUT_MS)
    ledger = Ledger(directory / "ledger.sqlite")  # makes the table before the Workers open it
    workers = start_workers(cluster, directory)
    env = FaultEnv(cluster, workers, ledger)
    give_clocks(env, directory)
    with small_disks(env):
        try:
            await cluster.start()
            for worker in workers:
                worker.start()
            async with ReadinessRecorder(cluster.probe_urls, interval_s=RECORD_INTERVAL_S) as record:
                acked, injected, snapshots = await drive(env, rngs, fault_rng, fault_s, f"s{seed}")
            for worker in workers:
                worker.stop()
            dumps = await dumps_of_stopped_nodes(cluster)
        finally:
            for worker in workers:
                worker.stop()
            await cluster.stop()
    evidence = Evidence(acked, snapshots, ledger.runs("tool"), record.rows, dumps)
    ledger.close()
    seconds = time.monotonic() - began
    return RunResult(seed, fault_s, seconds, directory, injected, env.skipped, env.exits, evidence, check_all(evidence))


def start_workers(cluster: ProxiedCluster, directory: Path) -> list[WorkerProcess]:
    return [
        WorkerProcess(
            list(cluster.urls.values()),
            cluster.tokens["worker"],
            ledger=directory / "ledger.sqlite",
            row="ROBUSTNESS",
            agent=AGENT,
            column="robustness",
            log_path=directory / f"worker-{i}.log",
        )
        for i in range(WORKERS)
    ]


async def drive(
    env: FaultEnv, rngs: list[random.Random], fault_rng: random.Random, fault_s: float, prefix: str
) -> tuple[Acknowledged, list[Injected], dict[str, Any]]:
    """The workload under faults, then healing and the final snapshots."""
    cluster = env.cluster
    acked, stop = Acknowledged(), asyncio.Event()
    async with client_for(list(cluster.urls.values()), cluster.tokens["client"]) as client:
        sessions = [SessionClient(client, f"{prefix}-{i}", r, acked, stop) for i, r in enumerate(rngs)]
        talking = [asyncio.create_task(s.run()) for s in sessions]
        faults = asyncio.create_task(inject_until(env, fault_rng, fault_s))
        try:
            await asyncio.wait([faults, *talking], return_when=asyncio.FIRST_COMPLETED)
            if not faults.done():  # a session stopped first: its error ends the run
                next(t for t in talking if t.done()).result()
            injected = faults.result()
            await heal(env)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*talking), ACK_DEADLINE_S + 30)
            await asyncio.gather(*(s.drain(SETTLE_DEADLINE_S) for s in sessions))
            snapshots = await final_snapshots(client, [s.session_id for s in sessions], SNAPSHOT_DEADLINE_S)
        finally:
            for task in (faults, *talking):
                task.cancel()
            await asyncio.gather(faults, *talking, return_exceptions=True)
    return acked, injected, snapshots


async def dumps_of_stopped_nodes(cluster: ProxiedCluster) -> dict[str, StateDump]:
    """Every node's state, all stopped at the same applied index (tried STOP_TRIES times)."""
    for _ in range(STOP_TRIES):
        await all_caught_up(cluster, cluster.node_ids, CATCH_UP_DEADLINE_S)
        for node in cluster.node_ids:  # at once: nothing applies on one node and not on another
            cluster.kill(node)
        for proc in cluster.procs.values():
            await asyncio.to_thread(proc.wait, 10)
        dumps = {node: dump_state(cluster.plan.node(node).data_dir) for node in cluster.node_ids}
        if len({dump.applied_index for dump in dumps.values()}) == 1:
            return dumps
        for node in cluster.node_ids:  # an entry applied between the check and the kills: again
            cluster.start_node(node)
    return dumps  # the checker reports the different indexes
