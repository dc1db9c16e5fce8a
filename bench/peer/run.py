"""dex-ha against Restate, Temporal (and etcd) side by side, in one run on one machine.

    python bench/peer/install.py          # once: Restate 1.7.12, Temporal's CLI, the SDKs, etcd 3.4
    python bench/peer/run.py [--concurrency 1,16,64,256,1024] [--duration-s 15] [--quick]
                             [--deployments one,three] [--peers restate,temporal]
                             [--failover-runs 3] [--no-etcd]

Durable steps, for each deployment (one node, three nodes) and each concurrency c, dex-ha and
Restate one after the other (the order alternates from one c to the next, so machine noise
hits both):
- dex-ha: bench/steps_bench.py's own measurement (`dex-ha dev`, `dex-ha cluster up --nodes 3`;
  strict durability; a step is a Worker task handed out, run and its result committed);
- Restate: restate-server (one node with replication 1, or three nodes with replication 2)
  and a Python service on hypercorn whose handler runs N `ctx.run` steps (each journaled
  before it returns); c invocations kept in flight;
- Temporal (one node only: `temporal server start-dev` on its SQLite file): a workflow of N
  activities, each run by a Worker in its own process; c workflows kept in flight, the
  activities completed inside the window counted (bench/peer/temporal_service.py).
Per row: steps/s over the window, per-step p50 (gaps between consecutive steps of one
session or invocation), peak RSS of the server processes and of the SDK process (dex-ha's
Worker, Restate's hypercorn), the CPU that other processes used meanwhile, and the
machine's speed just before and after the row (bench.common.cpu_probe_ms).

etcd 3.4 (three members on loopback): commits/s through the HTTP gateway at the same
concurrencies; and failover, `--failover-runs` times each on fresh clusters: SIGKILL etcd's
leader and time until a put through the gateway commits again, and SIGKILL dex-ha's active
node and time until a session create succeeds again (each node tried in turn).

The table's headline is the ratio dex-ha / peer. JSON: bench/results/peer_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bench import steps_bench  # noqa: E402  (dex-ha's measurement, reused as it is)
from bench.common import cpu_probe_ms, fmt, positive_ints, ratio, rss_bytes  # noqa: E402
from bench.peer import etcd_side, restate_side, temporal_side  # noqa: E402
from bench.peer.install import default_dir, load_manifest  # noqa: E402
from bench.steps_worker import bench_agent, register  # noqa: E402
from dex_ha import __version__ as dex_ha_version  # noqa: E402
from harness.processes import pid_alive  # noqa: E402

DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "peer_bench.json"
DEPLOYMENTS = {"one": "one node", "three": "three nodes"}
# "dex-ha" is its Worker on the Worker channel (the SDK's default), "dex-ha/http" the same
# Worker on the HTTP routes (polls and POSTs), measured in the same run.
SYSTEMS = ("dex-ha", "dex-ha/http", "restate", "temporal")
PEERS = ("restate", "temporal")
CANONICAL_CONCURRENCY = [1, 16, 64, 256, 1024]
CANONICAL_DURATION_S = 15.0
QUICK = {"concurrency": [1, 16], "duration_s": 3.0, "warmup_s": 1.0, "failover_runs": 0}
RSS_SAMPLE_INTERVAL_S = 0.5
FAILOVER_DEADLINE_S = 30.0
RETRY_TIMEOUT_S = 0.3


# ---------------------------------------------------------------- machine and memory


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


class PeakRss:
    """Samples the summed RSS of two groups of processes (server, SDK) while a row runs and
    keeps the peak of each. The groups are functions: the pids may change during the row."""

    def __init__(self, server_pids: Callable[[], list[int]], sdk_pids: Callable[[], list[int]]) -> None:
        self.server_pids, self.sdk_pids = server_pids, sdk_pids
        self.server_bytes = self.sdk_bytes = 0
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        self.server_bytes = max(self.server_bytes, sum(rss_bytes(p) for p in self.server_pids()))
        self.sdk_bytes = max(self.sdk_bytes, sum(rss_bytes(p) for p in self.sdk_pids()))

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(RSS_SAMPLE_INTERVAL_S)

    async def __aenter__(self) -> PeakRss:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def as_mb(self) -> dict[str, float]:
        return {"server_rss_mb": round(self.server_bytes / 2**20, 1), "sdk_rss_mb": round(self.sdk_bytes / 2**20, 1)}


# ---------------------------------------------------------------- one row per system


async def dex_row(
    deployment: steps_bench.Deployment,
    concurrency: int,
    args: argparse.Namespace,
    root: Path,
    registry: steps_bench.ProcessRegistry,
    transport: str = "channel",
    system: str = "dex-ha",
) -> dict[str, Any]:
    """bench/steps_bench.py's measurement of one concurrency, plus peak RSS, with the Worker
    on `transport`. The SDK process is the Worker that measure() starts: the pid it registers."""
    registered_before = len(registry.pids)

    def worker_pids() -> list[int]:  # started by this row (Restate's pids are in the registry too)
        return [p for p in registry.pids[registered_before:] if pid_alive(p)]

    async with PeakRss(lambda: deployment.node_pids, worker_pids) as rss:
        row = await steps_bench.measure(deployment, concurrency, args, root, registry, transport=transport)
    result = asdict(row)
    return {
        "system": system,
        "concurrency": concurrency,
        "steps": row.steps,
        "steps_per_second": row.steps_per_second,
        "p50_ms": row.p50_ms,
        "p99_ms": row.p99_ms,
        "other_load_cores": row.other_load_cores,
        "steal_cores": row.steal_cores,
        "cpu_wait_fraction": row.cpu_wait_fraction,
        "server_cpu_ms_per_step": row.server_cpu_ms_per_step,
        "sdk_cpu_ms_per_step": row.worker_cpu_ms_per_step,
        "failed": row.failed_results + row.sessions_abandoned,
        "cpu_probe_ms": row.cpu_probe_ms,
        **rss.as_mb(),
        "steps_bench_row": result,
    }


async def restate_row(
    deployment: restate_side.RestateDeployment, concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Restate at one concurrency: steps inside the window, per-step gaps (steps_bench's own
    arithmetic), CPU per step, the load of other processes, and peak RSS."""
    probes = [cpu_probe_ms()]
    async with PeakRss(deployment.server_pids, deployment.sdk_pids) as rss:
        log, first, last = await restate_side.drive(
            deployment, concurrency, args.steps_per_session, args.warmup_s, args.duration_s
        )
    probes.append(cpu_probe_ms())
    completions = [
        steps_bench.Completion(str(i), "ctx.run", at_ns, True)
        for i, steps in enumerate(log.steps_by_invocation)
        for at_ns in steps
    ]
    row = peer_row("restate", concurrency, completions, first, last, probes, rss, log.failed)
    return {**row, "invocations": len(log.steps_by_invocation)}


async def temporal_row(
    manifest: dict[str, Any],
    deployment: temporal_side.TemporalDeployment,
    concurrency: int,
    args: argparse.Namespace,
    pids: list[int],
) -> dict[str, Any]:
    """Temporal at one concurrency: activities completed inside the window (also of the
    workflows still running), measured as Restate's row is."""
    probes = [cpu_probe_ms()]
    async with PeakRss(deployment.server_pids, deployment.sdk_pids) as rss:
        load, first, last = await temporal_side.drive(
            manifest, deployment, concurrency, args.steps_per_session, args.warmup_s, args.duration_s, pids
        )
    probes.append(cpu_probe_ms())
    row = peer_row("temporal", concurrency, load.completions, first, last, probes, rss, load.failed)
    return {**row, "workflows_terminated_after_window": load.terminated}


def peer_row(
    system: str,
    concurrency: int,
    completions: list[steps_bench.Completion],
    first: restate_side.CpuSample,
    last: restate_side.CpuSample,
    probes: list[float],
    rss: PeakRss,
    failed: int,
) -> dict[str, Any]:
    """A peer's row: steps inside the window, per-step gaps (steps_bench's own arithmetic),
    CPU per step, the load of other processes, and peak RSS."""
    window_s = (last.at_ns - first.at_ns) / 1e9
    steps = sum(1 for c in completions if first.at_ns <= c.at_ns < last.at_ns)
    gaps = sorted(
        g for by_kind in steps_bench.completion_gaps(completions, first.at_ns, last.at_ns).values() for g in by_kind
    )
    server_cpu, sdk_cpu = last.server_cpu_s - first.server_cpu_s, last.sdk_cpu_s - first.sdk_cpu_s
    bench_cpu = last.bench_cpu_s - first.bench_cpu_s
    other = max(0.0, last.machine_busy_s - first.machine_busy_s - server_cpu - sdk_cpu - bench_cpu)
    cpu_wait = None
    if first.cpu_pressure_us is not None and last.cpu_pressure_us is not None:
        cpu_wait = round((last.cpu_pressure_us - first.cpu_pressure_us) / 1e6 / window_s, 3)
    return {
        "system": system,
        "concurrency": concurrency,
        "steps": steps,
        "steps_per_second": round(steps / window_s, 1),
        "p50_ms": steps_bench.percentile_ms(gaps, 50),
        "p99_ms": steps_bench.percentile_ms(gaps, 99),
        "other_load_cores": round(other / window_s, 2),
        "steal_cores": round((last.steal_s - first.steal_s) / window_s, 2),
        "cpu_wait_fraction": cpu_wait,
        "server_cpu_ms_per_step": round(server_cpu / steps * 1000, 3) if steps else None,
        "sdk_cpu_ms_per_step": round(sdk_cpu / steps * 1000, 3) if steps else None,
        "failed": failed,
        "cpu_probe_ms": probes,
        **rss.as_mb(),
    }


# ---------------------------------------------------------------- durable steps, both systems


async def steps_phase(
    key: str, manifest: dict[str, Any], args: argparse.Namespace, root: Path, registry: steps_bench.ProcessRegistry
) -> dict[str, Any]:
    """Both systems of one deployment up at once; for each c one row of each, the order
    alternating. (The idle one of the two costs little CPU: its heartbeats and gossip.)"""
    name = DEPLOYMENTS[key]
    with_temporal = "temporal" in args.peers and key == "one"  # the dev server is one node
    systems = [
        "dex-ha",
        *([] if args.no_http else ["dex-ha/http"]),
        *(["restate"] if "restate" in args.peers else []),
        *(["temporal"] if with_temporal else []),
    ]
    print(f"[{name}] starting {', '.join(systems)} ...", flush=True)
    dex = await (steps_bench.start_dev if key == "one" else steps_bench.start_cluster)(root, registry)
    rows: list[dict[str, Any]] = []
    restate: restate_side.RestateDeployment | None = None
    temporal: temporal_side.TemporalDeployment | None = None
    try:
        if "restate" in systems:
            restate = await restate_side.start_restate(manifest, name, 1 if key == "one" else 3, root, registry.pids)
        if with_temporal:
            temporal = await temporal_side.start_temporal(manifest, root, registry.pids)
        for index, concurrency in enumerate(args.concurrency):
            shift = index % len(systems)  # each system goes first in turn
            for system in systems[shift:] + systems[:shift]:
                print(
                    f"[{name}] c={concurrency} {system}: {args.warmup_s:g} s warm-up + {args.duration_s:g} s ...",
                    flush=True,
                )
                if system.startswith("dex-ha"):
                    transport = "http" if system == "dex-ha/http" else "channel"
                    row = await dex_row(dex, concurrency, args, root, registry, transport, system)
                elif system == "restate":
                    assert restate is not None
                    row = await restate_row(restate, concurrency, args)
                else:
                    assert temporal is not None
                    row = await temporal_row(manifest, temporal, concurrency, args, registry.pids)
                rows.append(row)
                print(
                    f"[{name}] c={concurrency} {system}: {row['steps_per_second']:.0f} steps/s, "
                    f"p50 {fmt(row['p50_ms'], '.2f')} ms, other load {fmt(row['other_load_cores'], '.2f')} cores, "
                    f"steal {fmt(row['steal_cores'], '.2f')} cores",
                    flush=True,
                )
    finally:
        killed = await asyncio.to_thread(dex.stop)
        if restate is not None:
            killed += await asyncio.to_thread(restate.stop)
        if temporal is not None:
            killed += await asyncio.to_thread(temporal.stop)
    return {
        "deployment": name,
        "dex_ha_command": dex.command,
        "restate_commands": restate.commands if restate else [],
        "restate_replication": restate.replication if restate else None,
        "temporal_commands": temporal.commands if temporal else [],
        "temporal_note": None if with_temporal else "n/a: the Temporal dev server is one node",
        "killed_after_deadline": killed,
        "rows": rows,
    }


# ---------------------------------------------------------------- etcd and failover


async def etcd_phase(manifest: dict[str, Any], args: argparse.Namespace, root: Path, pids: list[int]) -> dict[str, Any]:
    print("[etcd] three members: commits through the HTTP gateway ...", flush=True)
    cluster = await etcd_side.start_etcd(manifest["etcd"], root, pids)
    rows = []
    try:
        for concurrency in args.concurrency:
            log, start_ns, end_ns = await etcd_side.drive_puts(cluster, concurrency, args.warmup_s, args.duration_s)
            window_s = (end_ns - start_ns) / 1e9
            inside = [lat for at, lat in zip(log.done_at_ns, log.latencies_s) if start_ns <= at < end_ns]
            rows.append(
                {
                    "concurrency": concurrency,
                    "commits": len(inside),
                    "commits_per_second": round(len(inside) / window_s, 1),
                    "p50_ms": steps_bench.percentile_ms(sorted(inside), 50),
                    "failed": log.failed,
                }
            )
            print(f"[etcd] c={concurrency}: {rows[-1]['commits_per_second']:.0f} commits/s", flush=True)
    finally:
        await asyncio.to_thread(cluster.stop)
    return {"rows": rows}


async def dex_failover_once(root: Path, registry: steps_bench.ProcessRegistry) -> float | None:
    """A fresh `dex-ha cluster up`; SIGKILL its active node; seconds until a session create
    succeeds again, trying the other nodes in turn (what the SDK's readiness-following does)."""
    cluster = await steps_bench.start_cluster(root, registry)
    try:
        agent = bench_agent(f"failover-{uuid.uuid4().hex[:6]}")
        await register(cluster.urls, cluster.worker_token, agent)
        active = cluster.urls.index(await steps_bench.wait_ready(cluster.urls, steps_bench.START_DEADLINE_S))
        others = [u for i, u in enumerate(cluster.urls) if i != active]
        headers = {"Authorization": f"Bearer {cluster.client_token}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            killed_at = time.monotonic()
            os.kill(cluster.node_pids[active], signal.SIGKILL)
            deadline, turn = killed_at + FAILOVER_DEADLINE_S, 0
            while time.monotonic() < deadline:
                url = others[turn % len(others)]
                turn += 1
                if await create_session(http, url, agent.name):
                    return time.monotonic() - killed_at
                await asyncio.sleep(0.01)
        return None
    finally:
        await asyncio.to_thread(cluster.stop)


async def create_session(http: aiohttp.ClientSession, url: str, agent: str) -> bool:
    try:
        async with http.post(
            url + "/v1/sessions",
            json={"agent": agent, "session_id": f"fo-{uuid.uuid4().hex[:12]}"},
            timeout=aiohttp.ClientTimeout(total=RETRY_TIMEOUT_S),
        ) as resp:
            return resp.status in (200, 201)
    except (aiohttp.ClientError, TimeoutError):
        return False


async def failover_phase(
    manifest: dict[str, Any], args: argparse.Namespace, root: Path, registry: steps_bench.ProcessRegistry
) -> dict[str, Any]:
    """Runs alternate between the systems, each on a fresh cluster."""
    runs: dict[str, list[float | None]] = {"dex-ha": [], "etcd": []}
    for run in range(args.failover_runs):
        run_root = root / f"failover-{run}"  # `cluster up` refuses a directory that holds another cluster
        run_root.mkdir()
        runs["dex-ha"].append(await dex_failover_once(run_root, registry))
        if manifest.get("etcd") and not args.no_etcd:
            runs["etcd"].append(await etcd_side.failover_once(manifest["etcd"], run_root, registry.pids))
        print(
            f"[failover {run + 1}/{args.failover_runs}] "
            + ", ".join(
                f"{system} {fmt(None if not v or v[-1] is None else v[-1] * 1000, '.0f')} ms"
                for system, v in runs.items()
                if v
            ),
            flush=True,
        )
    return {system: {"runs_s": values, **median_max_ms(values)} for system, values in runs.items() if values}


def median_max_ms(values: list[float | None]) -> dict[str, float | None]:
    seen = [v * 1000 for v in values if v is not None]
    return {
        "median_ms": round(statistics.median(seen), 1) if seen else None,
        "max_ms": round(max(seen), 1) if seen else None,
        "missing": len(values) - len(seen),
    }


# ---------------------------------------------------------------- summary and table


def summarize(phase: dict[str, Any]) -> dict[str, Any]:
    """Per system: best steps/s and its c, p50 at c=1, peak RSS; and dex-ha / each peer
    (`ratio`: / Restate, `ratio_temporal`: / Temporal)."""
    out: dict[str, Any] = {}
    for system in SYSTEMS:
        rows = [r for r in phase["rows"] if r["system"] == system]
        if not rows:
            continue
        best = max(rows, key=lambda r: r["steps_per_second"], default=None)
        c1 = next((r["p50_ms"] for r in rows if r["concurrency"] == 1), None)
        out[system] = {
            "best_steps_per_second": best and best["steps_per_second"],
            "best_at_concurrency": best and best["concurrency"],
            "p50_ms_c1": c1,
            "server_rss_mb": max((r["server_rss_mb"] for r in rows), default=None),
            "sdk_rss_mb": max((r["sdk_rss_mb"] for r in rows), default=None),
        }
    keys = ("best_steps_per_second", "p50_ms_c1", "server_rss_mb", "sdk_rss_mb")
    for peer, ratio_key in RATIOS:
        if "dex-ha" in out and peer in out:
            out[ratio_key] = {key: ratio(out["dex-ha"][key], out[peer][key], 2) for key in keys}
    return out


# The summary's ratios: dex-ha (on the channel) / each other system of the run.
RATIOS = (("dex-ha/http", "ratio_http"), ("restate", "ratio"), ("temporal", "ratio_temporal"))


def mean_probe_ms(row: dict[str, Any]) -> float | None:
    """The mean of a row's machine-speed probes (before and after it; see bench.common)."""
    probes = row.get("cpu_probe_ms") or []
    return statistics.mean(probes) if probes else None


PEER_LABELS = {"dex-ha/http": "dex-ha on HTTP", "restate": "Restate", "temporal": "Temporal"}


def print_phase(phase: dict[str, Any]) -> None:
    """One line per system and concurrency, the systems interleaved; ratio = dex-ha / that
    system, from this run. Then per system its best steps/s, p50 at c=1 and RSS."""
    replication = phase["restate_replication"]
    print(f"\n{phase['deployment']}" + (f" (Restate replication {replication})" if replication else ""))
    if phase.get("temporal_note"):
        print(f"Temporal: {phase['temporal_note']}")
    print(
        f"{'conc':>5} {'system':<11} {'steps/s':>8} {'ratio':>6} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'srv CPU ms/st':>13} {'other':>6} {'probe ms':>8}"
    )
    by_c: dict[int, dict[str, dict[str, Any]]] = {}
    for row in phase["rows"]:
        by_c.setdefault(row["concurrency"], {})[row["system"]] = row
    for c, by_system in by_c.items():
        dex = by_system.get("dex-ha", {})
        for system in SYSTEMS:
            if system not in by_system:
                continue
            x = by_system[system]
            share = None if system == "dex-ha" else ratio(dex.get("steps_per_second"), x["steps_per_second"], 2)
            print(
                f"{c:>5} {system:<11} {fmt(x['steps_per_second'], '.0f'):>8} {fmt(share, '.2f'):>6} "
                f"{fmt(x['p50_ms'], '.2f'):>8} {fmt(x['p99_ms'], '.2f'):>8} "
                f"{fmt(x.get('server_cpu_ms_per_step'), '.3f'):>13} {fmt(x['other_load_cores'], '.2f'):>6} "
                f"{fmt(mean_probe_ms(x), '.0f'):>8}"
            )
    s = phase["summary"]
    print(
        f"{'':>5} {'system':<11} {'best st/s (at c)':>17} {'p50 ms c=1':>11} {'server RSS MB':>14} {'SDK RSS MB':>11}"
    )
    for system in SYSTEMS:
        if system not in s:
            continue
        x = s[system]
        best = f"{fmt(x['best_steps_per_second'], '.0f')} ({fmt(x['best_at_concurrency'], 'd')})"
        print(
            f"{'':>5} {system:<11} {best:>17} {fmt(x['p50_ms_c1'], '.2f'):>11} {fmt(x['server_rss_mb'], '.0f'):>14} "
            f"{fmt(x['sdk_rss_mb'], '.0f'):>11}"
        )
    for peer, ratio_key in RATIOS:
        if ratio_key in s:
            q = s[ratio_key]
            print(
                f"{'':>5} {'ratio':<11} {fmt(q['best_steps_per_second'], '.2f'):>17} {fmt(q['p50_ms_c1'], '.2f'):>11} "
                f"{fmt(q['server_rss_mb'], '.2f'):>14} {fmt(q['sdk_rss_mb'], '.2f'):>11}   (dex-ha / {PEER_LABELS[peer]})"
            )


def print_table(result: dict[str, Any]) -> None:
    m = result["machine"]
    v = result["versions"]
    print(
        "\ndex-ha beside its peers in one run (durable steps; a dex-ha step = a Worker task handed out, run and "
        "its result committed, the Worker on the channel (dex-ha) or on HTTP (dex-ha/http), "
        "a Restate step = a journaled ctx.run, a Temporal step = an activity run by a Worker process)"
    )
    print(
        f"machine: {m['cores']} cores, {m['cpu']}, {m['memory_gb']} GB; other processes used "
        f"{fmt(m['other_load_cores_mean'], '.2f')} cores on average during the rows (max "
        f"{fmt(m['other_load_cores_max'], '.2f')}), the hypervisor gave {fmt(m.get('steal_cores_mean'), '.2f')} "
        f"cores to other guests (steal; max {fmt(m.get('steal_cores_max'), '.2f')}), load average "
        f"{m['load_average_start']} -> {m['load_average_end']} (shared machine)"
    )
    print(
        f"versions: dex-ha {v['dex_ha']}, restate-server {v['restate_server']}, restate-sdk {v['restate_sdk']} "
        f"on hypercorn {v['hypercorn']}, temporal CLI {v.get('temporal_cli')} with temporalio "
        f"{v.get('temporalio')}, etcd {v['etcd']}, Python {v['python']}"
    )
    print(
        f"configuration: {result['steps_per_session']} steps per session/invocation/workflow "
        f"({result['turns_per_session']} turns), c = {', '.join(map(str, result['concurrency']))}, "
        f"{result['duration_s']:g} s windows after {result['warmup_s']:g} s warm-up"
        + (" (quick mode)" if result.get("quick") else "")
    )
    for phase in result["steps"]:
        print_phase(phase)
    if result.get("etcd"):
        print("\netcd 3.4, three members: commits through the HTTP gateway (/v3/kv/put)")
        for row in result["etcd"]["rows"]:
            print(
                f"{row['concurrency']:>5} {row['commits_per_second']:>8.0f} commits/s  p50 {fmt(row['p50_ms'], '.2f')} ms"
                f"{'  failed ' + str(row['failed']) if row['failed'] else ''}"
            )
    elif result.get("etcd_skipped"):
        print(f"\netcd: skipped ({result['etcd_skipped']})")
    fo = result.get("failover")
    if fo:
        print("\nfailover: SIGKILL the leader/active node, until a write succeeds again (median / max ms)")
        for system, what in (
            ("dex-ha", "session create, nodes tried in turn"),
            ("etcd", "put via gateway, members in turn"),
        ):
            if system in fo:
                x = fo[system]
                print(
                    f"  {system:<7} {fmt(x['median_ms'], '.0f'):>6} / {fmt(x['max_ms'], '.0f'):<6} over "
                    f"{len(x['runs_s'])} runs ({what}){'; missing ' + str(x['missing']) if x['missing'] else ''}"
                )
        if "dex-ha" in fo and "etcd" in fo:
            print(
                f"  ratio dex-ha / etcd (median): {fmt(ratio(fo['dex-ha']['median_ms'], fo['etcd']['median_ms'], 2), '.2f')}"
            )


# ---------------------------------------------------------------- the run


def machine_summary(result: dict[str, Any], load_start: list[float]) -> dict[str, Any]:
    others = [r["other_load_cores"] for p in result["steps"] for r in p["rows"] if r["other_load_cores"] is not None]
    steals = [r["steal_cores"] for p in result["steps"] for r in p["rows"] if r.get("steal_cores") is not None]
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_average_start": load_start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "other_load_cores_mean": round(statistics.mean(others), 2) if others else None,
        "other_load_cores_max": max(others, default=None),
        "steal_cores_mean": round(statistics.mean(steals), 2) if steals else None,
        "steal_cores_max": max(steals, default=None),
    }


async def main_async(
    args: argparse.Namespace, manifest: dict[str, Any], registry: steps_bench.ProcessRegistry
) -> dict[str, Any]:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # stop like Ctrl-C
    load_start = [round(x, 2) for x in os.getloadavg()]
    result: dict[str, Any] = {
        "concurrency": args.concurrency,
        "duration_s": args.duration_s,
        "warmup_s": args.warmup_s,
        "steps_per_session": args.steps_per_session,
        "turns_per_session": args.turns_per_session,
        "peers": args.peers,
        "quick": args.quick,
        "versions": {
            "dex_ha": dex_ha_version,
            "restate_server": manifest.get("restate_version"),
            "restate_sdk": manifest.get("restate_sdk_version"),
            "hypercorn": manifest.get("hypercorn_version"),
            "temporal_cli": manifest.get("temporal_version"),
            "temporalio": manifest.get("temporalio_version"),
            "etcd": manifest.get("etcd_version"),
            "python": platform.python_version(),
        },
        "steps": [],
        "etcd": None,
        "etcd_skipped": manifest.get("etcd_skipped"),
        "failover": None,
    }
    if args.no_etcd:
        result["etcd_skipped"] = "--no-etcd"
    with tempfile.TemporaryDirectory(prefix="dex-peer-bench-") as tmp:
        root = Path(tmp)
        for key in args.deployments:
            phase = await steps_phase(key, manifest, args, root, registry)
            phase["summary"] = summarize(phase)
            result["steps"].append(phase)
            write_json(result, args.json, complete=False)
        if manifest.get("etcd") and not args.no_etcd:
            result["etcd"] = await etcd_phase(manifest, args, root, registry.pids)
            write_json(result, args.json, complete=False)
        if args.failover_runs:
            result["failover"] = await failover_phase(manifest, args, root, registry)
    result["machine"] = machine_summary(result, load_start)
    return result


def write_json(result: dict[str, Any], path: str, complete: bool) -> Path:
    """Write what has been measured so far: after each phase with complete=False, so that a
    later phase that fails (a run takes many minutes) does not lose the rows before it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "complete": complete}, indent=2) + "\n")
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=default_dir(), help="where install.py put the peers")
    parser.add_argument("--concurrency", type=positive_ints("--concurrency"), default=CANONICAL_CONCURRENCY)
    parser.add_argument("--duration-s", type=float, default=CANONICAL_DURATION_S, help="measured seconds per row")
    parser.add_argument(
        "--peers",
        type=lambda t: [k for k in t.split(",") if k],
        default=list(PEERS),
        help="comma-separated peers measured beside dex-ha: restate, temporal (default both)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run to check the setup: c = 1,16, 3 s windows after 1 s warm-up, no failover "
        "(overrides those flags)",
    )
    parser.add_argument("--warmup-s", type=float, default=2.0, help="unmeasured seconds before each window")
    parser.add_argument(
        "--deployments",
        type=lambda t: [k for k in t.split(",") if k],
        default=["one", "three"],
        help="comma-separated: one (dex-ha dev / one Restate node), three (3 nodes each)",
    )
    parser.add_argument(
        "--turns-per-session",
        type=int,
        default=10,
        help="dex-ha turns per session (3 steps each); Restate runs as many steps per invocation",
    )
    parser.add_argument("--failover-runs", type=int, default=3, help="failovers per system (0: none)")
    parser.add_argument("--no-etcd", action="store_true", help="leave etcd out")
    parser.add_argument(
        "--no-http", action="store_true", help="leave out dex-ha's rows with its Worker on HTTP (dex-ha/http)"
    )
    parser.add_argument("--json", default=str(DEFAULT_JSON), help=f"where to write the JSON (default {DEFAULT_JSON})")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    if any(k not in DEPLOYMENTS for k in args.deployments):
        parser.error(f"--deployments: one or more of {', '.join(DEPLOYMENTS)}")
    if any(k not in PEERS for k in args.peers):
        parser.error(f"--peers: zero or more of {', '.join(PEERS)}")
    if args.duration_s <= 0 or args.warmup_s < 0 or args.turns_per_session < 1 or args.failover_runs < 0:
        parser.error("--duration-s > 0, --warmup-s >= 0, --turns-per-session >= 1, --failover-runs >= 0")
    args.steps_per_session = args.turns_per_session * steps_bench.STEPS_PER_TURN
    manifest = load_manifest(args.dir)
    if manifest is None:
        print(f"no peer install in {args.dir}: run `python bench/peer/install.py` first", file=sys.stderr)
        return 2
    registry = steps_bench.ProcessRegistry()
    try:
        result = asyncio.run(main_async(args, manifest, registry))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(
            f"\ninterrupted: stopped every process this bench started; the phases done are in {args.json}",
            file=sys.stderr,
        )
        return 130
    finally:
        killed = registry.kill_leftovers()
        if killed:
            print(f"killed leftover processes: {killed}", file=sys.stderr)
    result["pids"] = registry.pids
    print_table(result)
    out = write_json(result, args.json, complete=True)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
