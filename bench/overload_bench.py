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

It prints a table and writes JSON (default bench/results/overload_bench.json). Processes
are started on free loopback ports and stopped by pid.

    python bench/overload_bench.py [--clients 500,2000,5000] [--duration-s 10] [--only dev|cluster]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
TARGETS = {
    "term_changes": "0 at every level",
    "follower_leader_contact_gap": f"< {GAP_TARGET_S * 1000:.0f} ms (half the minimum election timeout)",
}
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
    print("\ntarget                          measured      goal")
    for name, goal in TARGETS.items():
        measured, verdict = verdict_of(name, result["rows"])
        print(f"{name:<30} {measured:>10}      {goal}  {verdict}")


def verdict_of(target: str, rows: list[dict[str, Any]]) -> tuple[str, str]:
    """(the worst measured value, met / MISSED / not measured) of a target over all rows."""
    if target == "term_changes":
        values = [r["term_changes"] for r in rows if r["term_changes"] is not None]
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
    soft, hard = raise_fd_limit(fds_needed(max(args.clients)))
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
    }
    with tempfile.TemporaryDirectory(prefix="dex-overload-bench-") as tmp:
        root = Path(args.work_dir) if args.work_dir else Path(tmp)
        for name in names:
            for clients in args.clients:
                print(
                    f"[{name}] {clients} clients: starting a fresh server, then {args.duration_s:g} s of load ...",
                    flush=True,
                )
                row = await measure(name, clients, args, root)
                result["rows"].append(asdict(row))
                print(progress_line(row, LoadResult(**row.load)), flush=True)
    return result


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
