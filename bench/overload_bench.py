"""Overload benchmark: does load cost the active node its lease?

For each level of concurrent clients (default 500, 2000, 5000) and each deployment, a
fresh server is started and takes the load of harness/http_load.py for
`--duration-s` seconds: every client a closed loop on its own keep-alive connection, a
mix of session GETs, session lists, session creates and unauthenticated /metrics scrapes,
and a few of the biggest requests a client can send: a list with limit=1000 over sessions
that hold 4.8 MB of metadata together (the answer stops at the node's page budget), and
bodies of 4 MiB minus 100 bytes (read, decoded and answered 413 for a text over the cap,
or shed with 503 overloaded past the node's bytes in flight); optionally SSE opens. All
against one URL:
- dev:     `dex-ha dev` (one node, client token auth on), its URL;
- cluster: `dex-ha cluster up --nodes 3`, the URL of the active node.

Durability is `strict` (fsync) in both, the product default and what steps_bench measures;
`--relaxed` runs both without fsync (as the e2e tests do).

Reported per level: answers per second, p50/p99 latency of the accepted (2xx) answers,
how many answered 503 `overloaded` (shedding: the node stays active), 503 `not_active`
(the node lost its lease or leadership), other non-2xx, transport errors (no HTTP answer),
term changes (from `/v1/cluster` of every node before and after: each one is an election)
and whether the active node moved, and the largest gap between two messages from the
leader that a follower saw (`dex_raft_leader_contact_gap_max_seconds`, read from the
followers every 0.25 s during the load and once after it: the gauge restarts with each
term, so a gap that ended in an election shows only in the samples; "n/a" where the nodes
do not export it, and for dev, which has no follower). And the CPU the busiest node
and the load generator (this process) used, in cores, and the CPU pressure of the machine
(PSI): on a small machine they share the cores with each other and with whatever else
runs, and a node that waits for a CPU answers late.

Targets: 0 term changes at every level; the largest follower gap below half the minimum
election timeout (a follower starts an election after a full one).

Idle streams (`--idle-streams`, default 1000; 0 skips it): per deployment, a fresh server
gets that many SSE event streams, one on each of as many sessions, that stay idle (no event
is written to those sessions), and the median latency of writes (`--write-clients` closed
loops creating sessions) is measured without them and with them, `--stream-rounds` times
(after each round the streams are closed and the node is seen to have let them go). Target:
the idle streams make the write p50 slower by under 10 %, with 0 term changes. The node's
CPU per write, without and with, is printed too: on a shared machine the latency of two
runs differs by more than 10 % by itself, the CPU per write much less.

It prints a table and writes JSON (default bench/results/overload_bench.json). Processes
are started on free loopback ports and stopped by pid.

    python bench/overload_bench.py [--clients 500,2000,5000] [--duration-s 10] [--only dev|cluster]
                                   [--idle-streams 1000] [--parts levels,streams]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.common import cpu_pressure_us, cpu_seconds, fmt, fmt_pct, positive_ints  # noqa: E402
from dex_ha.server.config import ServerConfig  # noqa: E402  (the default election timeout)
from harness.cluster_process import LocalCluster  # noqa: E402
from harness.cluster_state import FollowerGapSampler, observe_settled, term_changes  # noqa: E402
from harness.dev_process import DevProcess  # noqa: E402
from harness.http_load import (  # noqa: E402
    DEFAULT_MIX,
    KINDS,
    LoadConfig,
    LoadResult,
    fds_needed,
    raise_fd_limit,
    run_load,
)

DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "overload_bench.json"
# The bench's mix: http_load's, with the big requests added.
BENCH_MIX = {**DEFAULT_MIX, "big_list": 0.02, "big_body": 0.02}
ELECTION_TIMEOUT_MIN_S = ServerConfig.election_timeout_min_ms / 1000  # neither deployment changes it
GAP_TARGET_S = ELECTION_TIMEOUT_MIN_S / 2
IDLE_STREAMS_P50_CHANGE_TARGET = 0.10
TARGETS = {
    "term_changes": "0 at every level",
    "follower_leader_contact_gap": f"< {GAP_TARGET_S * 1000:.0f} ms (half the minimum election timeout)",
    "idle_streams_write_p50": f"slower by < {IDLE_STREAMS_P50_CHANGE_TARGET:.0%} with the idle streams",
}
PARTS = ("levels", "streams")
STREAMS_RELEASED_DEADLINE_S = 60.0  # a node notices a closed idle stream at its next keep-alive (15 s)
SETTLE_DEADLINE_S = 20.0  # after the load: until one node is active again, if any


@dataclass
class Row:
    deployment: str
    clients: int
    load: dict[str, Any]  # LoadResult as a dict
    before: list[dict[str, Any]]  # NodeState of every node
    after: list[dict[str, Any]]
    term_changes: int | None
    active_before: list[str]
    active_after: list[str]
    follower_gap_max_s: float | None  # during the load (sampled) and after it
    follower_gap_samples: int
    node_pids: list[int]
    busiest_node_cores: float  # CPU seconds per second of load of the busiest node (1.0 = one core)
    generator_cores: float  # the same for this process (the load generator)
    cpu_wait: float | None  # PSI: share of the load window in which some task waited for a CPU


# ---------------------------------------------------------------- deployments


@dataclass
class Target:
    """A running deployment: every node's URL, the URL that takes the load, a client token."""

    urls: dict[str, str]  # node id -> URL
    load_url: str
    token: str
    pids: list[int]


@asynccontextmanager
async def dev_deployment(root: Path, relaxed: bool) -> AsyncIterator[Target]:
    """`dex-ha dev` with a client token (auth on, as in the cluster), stopped by pid."""
    token = secrets.token_hex(24)
    dev = DevProcess(root / "data", root / "dev.log", extra_env={"DEX_HA_TOKENS_CLIENT": token}, relaxed=relaxed)
    dev.start()
    try:
        await dev.wait_ready(deadline_s=60)
        assert dev.proc is not None
        yield Target({"dev": dev.url}, dev.url, token, [dev.proc.pid])
    finally:
        dev.stop()


@asynccontextmanager
async def cluster_deployment(root: Path, relaxed: bool) -> AsyncIterator[Target]:
    """`dex-ha cluster up --nodes 3`; the load goes to the active node. Stopped by pid."""
    cluster = LocalCluster(root / "cluster", relaxed=relaxed)
    try:
        await asyncio.to_thread(cluster.up)
        active = await cluster.active_node(deadline_s=60)
        yield Target(
            cluster.urls,
            cluster.urls[active],
            cluster.tokens["client"],
            [cluster.pid(node_id) for node_id in cluster.urls],
        )
    finally:
        await asyncio.to_thread(cluster.down)


DEPLOYMENTS: dict[str, Callable[[Path, bool], AbstractAsyncContextManager[Target]]] = {
    "dev": dev_deployment,
    "cluster": cluster_deployment,
}


# ---------------------------------------------------------------- one level


async def measure(name: str, clients: int, args: argparse.Namespace, root: Path) -> Row:
    level_dir = root / f"{name}-{clients}"
    level_dir.mkdir(parents=True)
    async with DEPLOYMENTS[name](level_dir, args.relaxed) as target:
        before = await observe_settled(target.urls, target.token, SETTLE_DEADLINE_S)
        followers = {node_id: url for node_id, url in target.urls.items() if url != target.load_url}
        cpu = CpuMeter(target.pids)
        async with FollowerGapSampler(followers) as sampler:
            result = await run_load(
                LoadConfig(
                    target.load_url,
                    target.token,
                    clients=clients,
                    duration_s=args.duration_s,
                    mix=args.mix,
                    request_timeout_s=args.request_timeout_s,
                )
            )
        cpu_use = cpu.use()
        after = await observe_settled(target.urls, target.token, SETTLE_DEADLINE_S)
    return Row(
        deployment=name,
        clients=clients,
        load=asdict(result),
        before=[asdict(n) for n in before.nodes],
        after=[asdict(n) for n in after.nodes],
        term_changes=term_changes(before, after),
        active_before=before.active,
        active_after=after.active,
        follower_gap_max_s=largest(sampler.max_gap_s, after.largest_follower_gap_s()),
        follower_gap_samples=sampler.samples,
        node_pids=target.pids,
        busiest_node_cores=max(cpu_use.node_cores),
        generator_cores=cpu_use.generator_cores,
        cpu_wait=cpu_use.cpu_wait,
    )


def largest(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


@dataclass(frozen=True)
class CpuUse:
    node_cores: list[float]  # CPU seconds per second of each node (1.0 = one core busy)
    generator_cores: float  # the same for this process, the load generator
    cpu_wait: float | None  # share of the time some runnable task waited for a CPU (PSI); None: no PSI


class CpuMeter:
    """CPU used by the node processes and by this one since the meter was made, and how
    contended the machine was meanwhile (other people's work counts there too)."""

    def __init__(self, node_pids: list[int]) -> None:
        self.node_pids = node_pids
        self.nodes_start = [cpu_seconds(pid) for pid in node_pids]
        self.own_start = own_cpu_seconds()
        self.pressure_start = cpu_pressure_us()
        self.started = time.monotonic()

    def use(self) -> CpuUse:
        """What was used since the meter was made (the load, and the seeding before it)."""
        seconds = time.monotonic() - self.started
        nodes = [round((cpu_seconds(pid) - start) / seconds, 2) for pid, start in zip(self.node_pids, self.nodes_start)]
        pressure = cpu_pressure_us()
        wait = None
        if pressure is not None and self.pressure_start is not None:
            wait = round((pressure - self.pressure_start) / 1e6 / seconds, 2)
        return CpuUse(nodes, round((own_cpu_seconds() - self.own_start) / seconds, 2), wait)


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def progress_line(row: Row, result: LoadResult) -> str:
    return (
        f"[{row.deployment}] {row.clients} clients: {result.answers_per_s:.0f} answers/s, "
        f"overloaded {result.count('overloaded')}, not_active {result.count('not_active')}, "
        f"transport errors {result.transport_error_count}, term changes {fmt(row.term_changes, 'd')}"
    )


# ---------------------------------------------------------------- idle streams


@dataclass
class StreamsRow:
    deployment: str
    idle_streams: int
    write_clients: int
    # {"without": LoadResult dict, "with": LoadResult dict, "node_cores_without": busiest node's CPU, ...}
    rounds: list[dict[str, Any]]
    p50_without_ms: float | None  # the median over the rounds
    p50_with_ms: float | None
    p50_change: float | None  # with / without - 1
    term_changes: int | None
    active_before: list[str]
    active_after: list[str]


@contextmanager
def stream_caps_at_least(streams: int) -> Iterator[None]:
    """The nodes started meanwhile (they read DEX_HA_* from the environment they inherit)
    allow `streams` event streams, all with the bench's one token."""
    names = ("DEX_HA_MAX_STREAMS", "DEX_HA_MAX_STREAMS_PER_TOKEN")
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ[name] = str(max(streams, ServerConfig.max_streams))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def measure_idle_streams(name: str, args: argparse.Namespace, root: Path) -> StreamsRow:
    level_dir = root / f"{name}-idle-streams"
    level_dir.mkdir(parents=True)
    async with AsyncExitStack() as stack:
        with stream_caps_at_least(args.idle_streams):  # while the nodes start
            target = await stack.enter_async_context(DEPLOYMENTS[name](level_dir, args.relaxed))
        http = await stack.enter_async_context(_api_session(target.token))
        before = await observe_settled(target.urls, target.token, SETTLE_DEADLINE_S)
        sessions = await create_idle_sessions(http, target.load_url, args.idle_streams)
        rounds = []
        for round_number in range(args.stream_rounds):
            if round_number:  # the next "without" has none left
                await streams_released(http, target.load_url)
            without, cores_without = await write_load(target, args)
            async with idle_streams_open(target, sessions):
                with_streams, cores_with = await write_load(target, args)
            rounds.append(
                {
                    "without": asdict(without),
                    "with": asdict(with_streams),
                    "node_cores_without": cores_without,
                    "node_cores_with": cores_with,
                }
            )
        after = await observe_settled(target.urls, target.token, SETTLE_DEADLINE_S)
    without_p50 = _median_p50(r["without"] for r in rounds)
    with_p50 = _median_p50(r["with"] for r in rounds)
    return StreamsRow(
        deployment=name,
        idle_streams=args.idle_streams,
        write_clients=args.write_clients,
        rounds=rounds,
        p50_without_ms=without_p50,
        p50_with_ms=with_p50,
        p50_change=round(with_p50 / without_p50 - 1, 4) if with_p50 and without_p50 else None,
        term_changes=term_changes(before, after),
        active_before=before.active,
        active_after=after.active,
    )


def _median_p50(loads: Any) -> float | None:
    values = [load["p50_ms"] for load in loads if load["p50_ms"] is not None]
    return round(statistics.median(values), 3) if values else None


@asynccontextmanager
async def _api_session(token: str) -> AsyncIterator[aiohttp.ClientSession]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:
        yield http


async def write_load(target: Target, args: argparse.Namespace) -> tuple[LoadResult, float]:
    """`--write-clients` closed loops creating sessions (a commit each) for --duration-s;
    and the CPU the busiest node used meanwhile, in cores."""
    cpu = CpuMeter(target.pids)
    result = await run_load(
        LoadConfig(
            target.load_url,
            target.token,
            clients=args.write_clients,
            duration_s=args.duration_s,
            mix={"create_session": 1.0},
            seed_sessions=1,
            request_timeout_s=args.request_timeout_s,
        )
    )
    return result, max(cpu.use().node_cores)


async def create_idle_sessions(http: aiohttp.ClientSession, url: str, count: int) -> list[str]:
    """`count` sessions for the streams, created 32 at a time (an overloaded answer is retried)."""
    ids = [f"idle-{i:05d}" for i in range(count)]
    gate = asyncio.Semaphore(32)

    async def create(session_id: str) -> None:
        async with gate:
            deadline = time.monotonic() + SETTLE_DEADLINE_S
            while True:
                async with http.post(url + "/v1/sessions", json={"agent": "load", "session_id": session_id}) as resp:
                    if resp.status in (200, 201):
                        return
                    problem = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not create session {session_id}: {problem}")
                await asyncio.sleep(0.1)

    await asyncio.gather(*(create(session_id) for session_id in ids))
    return ids


@asynccontextmanager
async def idle_streams_open(target: Target, sessions: list[str]) -> AsyncIterator[None]:
    """An open SSE stream on each session (its first chunk read), closed on the way out."""
    no_read_timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=10)
    async with _api_session(target.token) as http:
        gate = asyncio.Semaphore(100)
        opened: list[aiohttp.ClientResponse] = []

        async def open_one(session_id: str) -> None:
            async with gate:
                resp = await http.get(f"{target.load_url}/v1/sessions/{session_id}/events", timeout=no_read_timeout)
                opened.append(resp)
                if resp.status != 200:
                    raise RuntimeError(f"stream of {session_id}: HTTP {resp.status}: {(await resp.text())[:200]}")
                await resp.content.readany()

        try:
            await asyncio.gather(*(open_one(session_id) for session_id in sessions))
            yield
        finally:
            for resp in opened:
                resp.close()


async def streams_released(http: aiohttp.ClientSession, url: str) -> None:
    """Wait until the node has let every closed stream go (`dex_sse_streams` 0)."""
    deadline = time.monotonic() + STREAMS_RELEASED_DEADLINE_S
    while True:
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
        if "\ndex_sse_streams 0.0\n" in text:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the node still holds closed streams after {STREAMS_RELEASED_DEADLINE_S:.0f} s")
        await asyncio.sleep(1.0)


# ---------------------------------------------------------------- the table


def fmt_gap(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f}"


def print_table(result: dict[str, Any]) -> None:
    mix = ", ".join(f"{k} {w:g}" for k, w in result["mix"].items() if w > 0)
    print(
        f"\nOverload benchmark ({result['durability']} durability; {result['duration_s']:g} s of load per level, "
        f"a fresh server per level; closed-loop clients, one connection each, Retry-After not honoured)"
    )
    print(f"mix: {mix}. machine: {result['cores']} cores, load average at start {result['load_average_at_start']}")
    print(
        "other: non-2xx answers besides those two (the big bodies' 413 too_large among them); "
        "srv cores / gen cores: CPU of the busiest node / of the load generator (1.00 = one core); cpu wait: "
        "share of the window in which some runnable task waited for a CPU (PSI; other people's work counts)"
    )
    print(
        f"targets: term changes {TARGETS['term_changes']}; largest leader-contact gap seen by a follower "
        f"{TARGETS['follower_leader_contact_gap']}"
    )
    print(
        f"{'deployment':<10} {'clients':>7} {'answers':>8} {'ans/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'overloaded':>10} {'not_active':>10} {'other':>6} {'transport':>9} {'terms Δ':>7} "
        f"{'active':>9} {'gap ms':>6} {'srv cores':>9} {'gen cores':>9} {'cpu wait':>8}"
    )
    for row in result["rows"]:
        load = row["load"]
        other = (
            load["answers"]
            - load["accepted"]
            - load["by_code"].get("overloaded", 0)
            - load["by_code"].get("not_active", 0)
        )
        moved = (
            "same"
            if row["active_after"] == row["active_before"]
            else f"{','.join(row['active_before']) or '-'}>{','.join(row['active_after']) or '-'}"
        )
        print(
            f"{row['deployment']:<10} {row['clients']:>7} {load['answers']:>8} {load['answers_per_s']:>7.0f} "
            f"{fmt(load['p50_ms'], '.1f'):>8} {fmt(load['p99_ms'], '.1f'):>8} {load['by_code'].get('overloaded', 0):>10} "
            f"{load['by_code'].get('not_active', 0):>10} {other:>6} {sum(load['transport_errors'].values()):>9} "
            f"{fmt(row['term_changes'], 'd'):>7} {moved:>9} {fmt_gap(row['follower_gap_max_s']):>6} "
            f"{row['busiest_node_cores']:>9.2f} {row['generator_cores']:>9.2f} {fmt_pct(row['cpu_wait']):>8}"
        )
        if load["transport_errors"]:
            print(f"{'':<10} transport errors: {load['transport_errors']}")
        big = {kind: load["by_kind"][kind] for kind in ("big_list", "big_body") if kind in load["by_kind"]}
        if big:
            print(f"{'':<10} big requests' answers: {big}")
    print_streams_table(result)
    print("\ntarget                          measured      goal")
    for name, goal in TARGETS.items():
        measured, verdict = verdict_of(name, result["rows"], result["idle_streams"])
        print(f"{name:<30} {measured:>10}      {goal}  {verdict}")


def print_streams_table(result: dict[str, Any]) -> None:
    if not result["idle_streams"]:
        return
    print(
        f"\nIdle streams: write p50 without and with idle SSE streams (median of {result['stream_rounds']} "
        f"rounds of {result['duration_s']:g} s; writes: session creates; cpu: ms of the node's CPU per write)"
    )
    print(
        f"{'deployment':<10} {'streams':>7} {'writers':>7} {'p50 without':>11} {'p50 with':>9} {'change':>7} "
        f"{'p99 without':>11} {'p99 with':>9} {'cpu without':>11} {'cpu with':>8} {'terms Δ':>7} {'active':>9}"
    )
    for row in result["idle_streams"]:
        p99_without = _median_of(r["without"]["p99_ms"] for r in row["rounds"])
        p99_with = _median_of(r["with"]["p99_ms"] for r in row["rounds"])
        cpu_without = _median_of(_cpu_ms_per_write(r["node_cores_without"], r["without"]) for r in row["rounds"])
        cpu_with = _median_of(_cpu_ms_per_write(r["node_cores_with"], r["with"]) for r in row["rounds"])
        change = "-" if row["p50_change"] is None else f"{row['p50_change']:+.1%}"
        moved = "same" if row["active_after"] == row["active_before"] else "moved"
        print(
            f"{row['deployment']:<10} {row['idle_streams']:>7} {row['write_clients']:>7} "
            f"{fmt(row['p50_without_ms'], '.2f'):>11} {fmt(row['p50_with_ms'], '.2f'):>9} {change:>7} "
            f"{fmt(p99_without, '.2f'):>11} {fmt(p99_with, '.2f'):>9} {fmt(cpu_without, '.3f'):>11} "
            f"{fmt(cpu_with, '.3f'):>8} {fmt(row['term_changes'], 'd'):>7} {moved:>9}"
        )


def _cpu_ms_per_write(node_cores: float, load: dict[str, Any]) -> float | None:
    """The node's CPU per accepted write, in ms: less noisy than latency on a shared machine."""
    return round(node_cores / load["answers_per_s"] * 1000, 4) if load["answers_per_s"] else None


def _median_of(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def verdict_of(target: str, rows: list[dict[str, Any]], streams: list[dict[str, Any]]) -> tuple[str, str]:
    """(the worst measured value, met / MISSED / not measured) of a target over all rows."""
    if target == "idle_streams_write_p50":
        # A p50 lower with the streams than without is the machine's noise, not a cost.
        changes = [r["p50_change"] for r in streams if r["p50_change"] is not None]
        if not changes:
            return "-", "not measured"
        worst = max(changes)
        return f"{worst:+.1%}", "met" if worst < IDLE_STREAMS_P50_CHANGE_TARGET else "MISSED"
    if target == "term_changes":
        values = [r["term_changes"] for r in rows + streams if r["term_changes"] is not None]
        if not values:
            return "-", "not measured"
        worst = max(values)
        return str(worst), "met" if worst == 0 else "MISSED"
    gaps = [r["follower_gap_max_s"] for r in rows if r["follower_gap_max_s"] is not None]
    if not gaps:
        return "n/a", "not measured (no node exports dex_raft_leader_contact_gap_max_seconds)"
    worst = max(gaps)
    return f"{worst * 1000:.0f} ms", "met" if worst < GAP_TARGET_S else "MISSED"


# ---------------------------------------------------------------- the run


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    # SIGTERM stops the bench like Ctrl-C: the finally blocks stop every process by pid.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    # Before any server starts: the nodes inherit the limit, and need a socket per client too.
    soft, hard = raise_fd_limit(fds_needed(max([*args.clients, args.idle_streams + args.write_clients])))
    names = [args.only] if args.only else ["dev", "cluster"]
    result: dict[str, Any] = {
        "duration_s": args.duration_s,
        "clients": args.clients,
        "mix": args.mix,
        "durability": "relaxed" if args.relaxed else "strict",
        "cores": os.cpu_count(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "rlimit_nofile": [soft, hard],
        "election_timeout_min_s": ELECTION_TIMEOUT_MIN_S,
        "targets": TARGETS,
        "rows": [],
        "stream_rounds": args.stream_rounds,
        "idle_streams": [],
    }
    with tempfile.TemporaryDirectory(prefix="dex-overload-bench-") as tmp:
        root = Path(args.work_dir) if args.work_dir else Path(tmp)
        for name in names:
            for clients in args.clients if "levels" in args.parts else []:
                print(
                    f"[{name}] {clients} clients: starting a fresh server, then {args.duration_s:g} s of load ...",
                    flush=True,
                )
                row = await measure(name, clients, args, root)
                result["rows"].append(asdict(row))
                print(progress_line(row, LoadResult(**row.load)), flush=True)
            if "streams" in args.parts and args.idle_streams > 0:
                print(f"[{name}] {args.idle_streams} idle streams: a fresh server, write p50 without and with ...")
                streams_row = await measure_idle_streams(name, args, root)
                result["idle_streams"].append(asdict(streams_row))
                print(
                    f"[{name}] idle streams: write p50 {fmt(streams_row.p50_without_ms, '.2f')} ms without, "
                    f"{fmt(streams_row.p50_with_ms, '.2f')} ms with; term changes {fmt(streams_row.term_changes, 'd')}",
                    flush=True,
                )
    return result


def parse_parts(text: str) -> tuple[str, ...]:
    parts = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = set(parts) - set(PARTS)
    if not parts or unknown:
        raise argparse.ArgumentTypeError(f"--parts: a comma-separated list of {', '.join(PARTS)}")
    return parts


def parse_mix(text: str) -> dict[str, float]:
    """`get_session=0.4,metrics=0.2,...`: the kinds not named get weight 0."""
    mix = dict.fromkeys(KINDS, 0.0)
    for part in text.split(","):
        kind, sep, weight = part.partition("=")
        if not sep or kind.strip() not in mix:
            raise argparse.ArgumentTypeError(f"--mix: expected kind=weight with kinds {list(KINDS)}, got {part!r}")
        try:
            mix[kind.strip()] = float(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--mix: {weight!r} is not a number") from None
    if any(w < 0 for w in mix.values()) or not any(w > 0 for w in mix.values()):
        raise argparse.ArgumentTypeError("--mix: weights must be >= 0, at least one > 0")
    return mix


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--clients",
        type=positive_ints("--clients"),
        default=[500, 2000, 5000],
        help="comma-separated numbers of concurrent clients (default 500,2000,5000)",
    )
    parser.add_argument("--duration-s", type=float, default=10.0, help="seconds of load per level (default 10)")
    parser.add_argument("--only", choices=tuple(DEPLOYMENTS), help="measure one deployment only")
    parser.add_argument(
        "--parts",
        type=parse_parts,
        default=PARTS,
        help="what to measure: levels (the client levels), streams (idle streams); default both",
    )
    parser.add_argument(
        "--idle-streams", type=int, default=1000, help="idle SSE streams of the streams part (default 1000; 0: skip)"
    )
    parser.add_argument(
        "--write-clients", type=int, default=4, help="closed-loop writers of the streams part (default 4)"
    )
    parser.add_argument("--stream-rounds", type=int, default=2, help="rounds without and with the streams (default 2)")
    parser.add_argument("--relaxed", action="store_true", help="durability relaxed (no fsync) instead of strict")
    default_mix = ",".join(f"{k}={w:g}" for k, w in BENCH_MIX.items() if w > 0)
    parser.add_argument(
        "--mix",
        type=parse_mix,
        default=dict(BENCH_MIX),
        help=f"request weights, e.g. {default_mix},sse=0.05 (default: {default_mix})",
    )
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=20.0,
        help="a request without an answer by then is a transport error (default 20)",
    )
    parser.add_argument(
        "--work-dir", help="keep the data and node logs here (default: a temporary directory, removed at the end)"
    )
    parser.add_argument("--json", default=str(DEFAULT_JSON), help=f"where to write the JSON (default {DEFAULT_JSON})")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.duration_s <= 0 or args.request_timeout_s <= 0:
        parser.error("--duration-s and --request-timeout-s must be > 0")
    if args.idle_streams < 0 or args.write_clients < 1 or args.stream_rounds < 1:
        parser.error("--idle-streams must be >= 0, --write-clients and --stream-rounds >= 1")
    try:
        import uvloop  # the load generator shares the cores with the server: the cheaper loop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    try:
        result = asyncio.run(main_async(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: stopped every process this bench started", file=sys.stderr)
        return 130
    print_table(result)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
