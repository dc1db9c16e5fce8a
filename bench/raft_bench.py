"""Raft benchmark: three kv_node processes on loopback with `strict` durability.

Measures, and prints as a table (and writes bench/results/raft_bench.json):
- proposals per second and commit latency p50/p99 for 256-byte proposals at
  concurrency 1, 16 and 128 (the load runs inside the leader process, so this is Raft
  and fsync, not HTTP);
- fsyncs per second on the leader during each load;
- SIGKILL of the leader → a new leader with a valid lease: median and max over N kills;
- leader changes during a saturating run with no faults.

    python bench/raft_bench.py [--kills 10] [--soak-seconds 60] [--count 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from harness.kv_cluster import KVCluster, statuses, wait_for_leased_leader  # noqa: E402

TARGETS = {
    "proposals_per_second_c128": ">= 10000",
    "p50_ms_c1": "<= 1.0",
    "failover_median_s": "<= 1.0",
    "failover_max_s": "<= 2.0",
    "leader_changes_soak": "== 0",
}


async def post_json(session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout: float) -> Any:
    async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        resp.raise_for_status()
        return await resp.json()


async def measure_load(cluster: KVCluster, session: aiohttp.ClientSession, count: int) -> list[dict[str, Any]]:
    rows = []
    for concurrency in (1, 16, 128):
        leader, _ = await wait_for_leased_leader(cluster, session, deadline_s=20)
        n = count if concurrency > 1 else max(2000, count // 10)
        # Warm-up so that connection setup and first fsyncs do not count.
        await post_json(
            session,
            cluster.nodes[leader].url + "/bench",
            {"concurrency": concurrency, "count": 500, "size": 256},
            timeout=120,
        )
        res = await post_json(
            session,
            cluster.nodes[leader].url + "/bench",
            {"concurrency": concurrency, "count": n, "size": 256},
            timeout=600,
        )
        rows.append(res)
    return rows


async def measure_failover(cluster: KVCluster, session: aiohttp.ClientSession, kills: int) -> list[float]:
    """Kill the leader under a light load; time until another node is leader with a lease."""
    times = []
    for _ in range(kills):
        leader, _ = await wait_for_leased_leader(cluster, session, deadline_s=20)
        load = asyncio.create_task(
            post_json(
                session,
                cluster.nodes[leader].url + "/bench",
                {"concurrency": 4, "count": 10**9, "size": 256},
                timeout=600,
            )
        )
        await asyncio.sleep(0.5)
        cluster.kill(leader)
        _, took = await wait_for_leased_leader(cluster, session, deadline_s=30, exclude=leader)
        times.append(took)
        load.cancel()
        try:
            await load
        except (asyncio.CancelledError, aiohttp.ClientError):
            pass
        cluster.start(leader)
        await asyncio.sleep(1.0)  # let the restarted node catch up before the next kill
    return times


async def measure_soak(cluster: KVCluster, session: aiohttp.ClientSession, seconds: float) -> dict[str, Any]:
    leader, _ = await wait_for_leased_leader(cluster, session, deadline_s=20)
    before = await statuses(cluster, session)
    res = await post_json(
        session,
        cluster.nodes[leader].url + "/bench",
        {"concurrency": 128, "count": 10**9, "size": 256, "duration_s": seconds},
        timeout=seconds + 120,
    )
    after = await statuses(cluster, session)
    changes = sum(after[n]["leader_changes"] - before[n]["leader_changes"] for n in after if n in before)
    terms = {n: (before[n]["term"], after[n]["term"]) for n in after if n in before}
    return {
        "seconds": seconds,
        "committed": res["committed"],
        "per_second": res["per_second"],
        "leader_changes": changes,
        "terms_before_after": terms,
    }


def print_table(result: dict[str, Any]) -> None:
    print("\nRaft benchmark (3 processes, loopback, strict durability, 256-byte proposals)")
    print(f"{'concurrency':>11} {'committed':>10} {'per second':>11} {'p50 ms':>8} {'p99 ms':>8} {'fsyncs/s':>9}")
    for r in result["load"]:
        print(
            f"{r['concurrency']:>11} {r['committed']:>10} {r['per_second']:>11.0f} "
            f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['fsyncs_per_second']:>9.0f}"
        )
    f = result["failover"]
    print(
        f"\nleader SIGKILL -> new leader with a valid lease over {len(f['seconds'])} kills: "
        f"median {f['median_s']:.3f} s, max {f['max_s']:.3f} s"
    )
    s = result["soak"]
    print(
        f"saturating run, no faults: {s['seconds']:.0f} s, {s['committed']} committed "
        f"({s['per_second']:.0f}/s), leader changes: {s['leader_changes']}"
    )
    print("\ntarget                         measured      goal")
    for name, goal in TARGETS.items():
        print(f"{name:<30} {result['summary'][name]:>10.3f}    {goal}")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dex-raft-bench-") as tmp:
        cluster = KVCluster(Path(tmp), size=3, durability="strict")
        cluster.start_all()
        try:
            async with aiohttp.ClientSession() as session:
                load = await measure_load(cluster, session, args.count)
                soak = await measure_soak(cluster, session, args.soak_seconds)
                failover = await measure_failover(cluster, session, args.kills)
        finally:
            cluster.stop_all()
    result: dict[str, Any] = {
        "load": load,
        "failover": {"seconds": failover, "median_s": statistics.median(failover), "max_s": max(failover)},
        "soak": soak,
    }
    result["summary"] = {
        "proposals_per_second_c128": load[2]["per_second"],
        "p50_ms_c1": load[0]["p50_ms"],
        "failover_median_s": result["failover"]["median_s"],
        "failover_max_s": result["failover"]["max_s"],
        "leader_changes_soak": float(soak["leader_changes"]),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--soak-seconds", type=float, default=60.0)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "raft_bench.json"))
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print_table(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
