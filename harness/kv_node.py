"""A Raft node process with a small key-value state machine, used only by tests and bench.

    python -m harness.kv_node --id n1 --dir D --raft 127.0.0.1:7001 --http 127.0.0.1:8001 \
        --member n1=127.0.0.1:7001 --member n2=... [--durability strict] [--secret S]

HTTP (loopback only): POST /put {"key","value"} → {"index"} once committed and applied
(503 {"error": "not_leader", "leader"} elsewhere); GET /status; GET /dump; POST /transfer
{"to"}; POST /bench {"concurrency","count","size"} runs proposals inside this process, so
the benchmark measures Raft rather than HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
from aiohttp import web

from dex_ha.raft.errors import NotLeader, ProposalDropped
from dex_ha.raft.node import Member, NodeConfig, RaftNode


class KVStateMachine:
    """In memory: after a restart the node replays the log from its snapshot."""

    def __init__(self) -> None:
        self.kv: dict[str, str] = {}
        self._applied = 0

    def apply_batch(self, entries: list[tuple[int, bytes]]) -> list[Any]:
        results: list[Any] = []
        for index, data in entries:
            self._applied = index
            if data:
                key, value = msgpack.unpackb(data, raw=False)
                self.kv[key] = value
            results.append(index if data else None)
        return results

    def applied_index(self) -> int:
        return self._applied

    def snapshot_copier(self) -> Callable[[Path], int]:
        applied, kv = self._applied, dict(self.kv)  # the copy the worker thread encodes

        def copy(path: Path) -> int:
            path.write_bytes(msgpack.packb([applied, kv], use_bin_type=True))
            return applied

        return copy

    def restore(self, data: bytes | memoryview, index: int) -> None:
        applied, kv = msgpack.unpackb(data, raw=False)
        self.kv, self._applied = kv, index


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--id", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--raft", required=True)
    p.add_argument("--http", required=True)
    p.add_argument("--member", action="append", default=[], help="id=host:port")
    p.add_argument("--durability", default="strict")
    p.add_argument("--secret", default=None)
    p.add_argument("--election-min-ms", type=int, default=NodeConfig.election_timeout_min_ms)
    p.add_argument("--election-max-ms", type=int, default=NodeConfig.election_timeout_max_ms)
    p.add_argument("--heartbeat-ms", type=int, default=NodeConfig.heartbeat_interval_ms)
    p.add_argument("--snapshot-every", type=int, default=20_000)
    return p.parse_args(argv)


class KVServer:
    def __init__(self, node: RaftNode, sm: KVStateMachine) -> None:
        self.node, self.sm = node, sm

    async def put(self, request: web.Request) -> web.Response:
        body = await request.json()
        data = msgpack.packb([body["key"], body["value"]], use_bin_type=True)
        try:
            index = await self.node.propose(data)
        except NotLeader:
            return web.json_response({"error": "not_leader", "leader": self.node.leader_id}, status=503)
        except ProposalDropped as exc:
            return web.json_response({"error": "dropped", "message": str(exc)}, status=503)
        return web.json_response({"index": index})

    async def status(self, request: web.Request) -> web.Response:
        st = self.node.status().to_json()
        st["lease_valid"] = self.node.lease_valid()
        st["is_leader"] = self.node.is_leader
        st["fsyncs"] = self.node.metrics.fsyncs
        st["leader_changes"] = self.node.metrics.leader_changes
        st["pid"] = os.getpid()
        return web.json_response(st, dumps=_dumps)

    async def dump(self, request: web.Request) -> web.Response:
        return web.json_response({"applied": self.sm.applied_index(), "kv": self.sm.kv})

    async def transfer(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.node.transfer_leadership(body["to"])
        return web.json_response({"ok": True})

    async def bench(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(
            await run_load(
                self.node,
                int(body["concurrency"]),
                int(body["count"]),
                int(body.get("size", 256)),
                body.get("duration_s"),
            )
        )


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, default=str)


async def run_load(
    node: RaftNode, concurrency: int, count: int, size: int, duration_s: float | None = None
) -> dict[str, Any]:
    """Propose `count` entries of `size` bytes from `concurrency` tasks (or until
    `duration_s` passes); latency per commit."""
    latencies: list[float] = []
    errors = 0
    next_id = 0
    payload = os.urandom(size // 2).hex()[: size - 20]

    async def worker() -> None:
        nonlocal next_id, errors
        while next_id < count and (deadline is None or time.perf_counter() < deadline):
            i = next_id
            next_id += 1
            data = msgpack.packb([f"b{i % 1000}", payload], use_bin_type=True)
            t0 = time.perf_counter()
            try:
                await node.propose(data)
            except (NotLeader, ProposalDropped):
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)

    fsyncs0 = node.metrics.fsyncs
    t0 = time.perf_counter()
    deadline = t0 + duration_s if duration_s else None
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0

    return {
        "concurrency": concurrency,
        "committed": len(latencies),
        "errors": errors,
        "seconds": elapsed,
        "per_second": len(latencies) / elapsed if elapsed else 0.0,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else 0.0,
        "fsyncs_per_second": (node.metrics.fsyncs - fsyncs0) / elapsed if elapsed else 0.0,
    }


async def serve(args: argparse.Namespace) -> None:
    members = {}
    for spec in args.member:
        nid, addr = spec.split("=", 1)
        members[nid] = Member(_addr(addr))
    config = NodeConfig(
        id=args.id,
        data_dir=Path(args.dir),
        raft_listen=_addr(args.raft),
        members=members,
        durability=args.durability,
        secret=args.secret.encode() if args.secret else None,
        election_timeout_min_ms=args.election_min_ms,
        election_timeout_max_ms=args.election_max_ms,
        heartbeat_interval_ms=args.heartbeat_ms,
        snapshot_every_entries=args.snapshot_every,
    )
    sm = KVStateMachine()
    node = RaftNode(config, sm)
    await node.start()
    server = KVServer(node, sm)
    app = web.Application()
    app.add_routes(
        [
            web.post("/put", server.put),
            web.get("/status", server.status),
            web.get("/dump", server.dump),
            web.post("/transfer", server.transfer),
            web.post("/bench", server.bench),
        ]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = _addr(args.http)
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"kv_node {args.id} serving on {args.http}", flush=True)
    await stop.wait()
    await runner.cleanup()
    await node.stop()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))


if __name__ == "__main__":
    main()
