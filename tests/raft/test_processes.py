"""Three real node processes on loopback: SIGKILL the leader again and again.

Evidence comes from outside the nodes: the test keeps its own ledger of every write a
leader acknowledged as committed, and at the end reads every node's key-value dump.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import aiohttp
import pytest

from harness.kv_cluster import KVCluster, statuses, wait_for_leased_leader

KILLS = 10
WRITERS = 8


async def _writer(
    cluster: KVCluster,
    session: aiohttp.ClientSession,
    acked: dict[str, str],
    counter: itertools.count,
    stop: asyncio.Event,
) -> None:
    """Write unique keys to whichever node is leader; remember what was acknowledged."""
    while not stop.is_set():
        n = next(counter)
        key, value = f"k{n}", f"v{n}"
        for nid in cluster.alive():
            try:
                async with session.post(
                    cluster.nodes[nid].url + "/put",
                    json={"key": key, "value": value},
                    timeout=aiohttp.ClientTimeout(total=3),
                ) as resp:
                    if resp.status == 200:
                        acked[key] = value
                        break
            except (TimeoutError, aiohttp.ClientError):
                continue
        else:
            await asyncio.sleep(0.02)  # no leader right now: back off briefly


class _Writers:
    """WRITERS concurrent writers and the ledger of what a leader acknowledged."""

    def __init__(self, cluster: KVCluster, session: aiohttp.ClientSession) -> None:
        self.acked: dict[str, str] = {}
        self.stop = asyncio.Event()
        counter = itertools.count()
        self.tasks = [
            asyncio.create_task(_writer(cluster, session, self.acked, counter, self.stop)) for _ in range(WRITERS)
        ]

    async def wait_for_more(self, n: int, deadline_s: float = 20) -> None:
        target = len(self.acked) + n
        t0 = time.monotonic()
        while len(self.acked) < target:
            assert time.monotonic() - t0 < deadline_s, f"writes stalled at {len(self.acked)}"
            await asyncio.sleep(0.01)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks), timeout=15)


def _assert_all_present(acked: dict[str, str], dumps: dict) -> None:
    for nid, dump in dumps.items():
        missing = [k for k, v in acked.items() if dump["kv"].get(k) != v]
        assert not missing, f"{nid} lost {len(missing)} acknowledged writes, e.g. {missing[:5]}"


async def _wait_converged(cluster: KVCluster, session: aiohttp.ClientSession, deadline_s: float) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        dumps = {}
        for nid in cluster.alive():
            try:
                async with session.get(cluster.nodes[nid].url + "/dump") as resp:
                    dumps[nid] = await resp.json()
            except aiohttp.ClientError:
                pass
        applied = {d["applied"] for d in dumps.values()}
        st = await statuses(cluster, session)
        commits = {s["commit"] for s in st.values()}
        if len(dumps) == len(cluster.nodes) and len(applied) == 1 and applied == commits:
            return dumps
        await asyncio.sleep(0.05)
    raise AssertionError("nodes did not converge on one applied index")


@pytest.mark.timeout(240)
async def test_repeated_leader_sigkill_loses_no_acknowledged_write(tmp_path: Path) -> None:
    cluster = KVCluster(tmp_path, size=3, durability="strict", election_min_ms=500, election_max_ms=1000)
    cluster.start_all()
    try:
        async with aiohttp.ClientSession() as session:
            leader, _ = await wait_for_leased_leader(cluster, session, deadline_s=20)
            writers = _Writers(cluster, session)
            failover_times = []
            for _ in range(KILLS):
                await writers.wait_for_more(50)  # let writes flow through this leader
                cluster.kill(leader)
                new_leader, took = await wait_for_leased_leader(cluster, session, deadline_s=15, exclude=leader)
                failover_times.append(took)
                cluster.start(leader)  # restart the killed node on its data dir
                leader = new_leader
            await writers.finish()
            dumps = await _wait_converged(cluster, session, deadline_s=30)
    finally:
        cluster.stop_all()

    assert len(writers.acked) >= KILLS * 50
    _assert_all_present(writers.acked, dumps)
    assert len(failover_times) == KILLS


@pytest.mark.timeout(120)
async def test_acknowledged_writes_survive_full_cluster_restart(tmp_path: Path) -> None:
    """Every node SIGKILLed at once, then restarted: the acknowledged writes are all there."""
    cluster = KVCluster(tmp_path, size=3, durability="strict", election_min_ms=500, election_max_ms=1000)
    cluster.start_all()
    try:
        async with aiohttp.ClientSession() as session:
            await wait_for_leased_leader(cluster, session, deadline_s=20)
            writers = _Writers(cluster, session)
            await writers.wait_for_more(300)
            for nid in list(cluster.nodes):
                cluster.kill(nid)
            await writers.finish()
            cluster.start_all()
            await wait_for_leased_leader(cluster, session, deadline_s=20)
            dumps = await _wait_converged(cluster, session, deadline_s=30)
    finally:
        cluster.stop_all()
    assert len(writers.acked) >= 300
    _assert_all_present(writers.acked, dumps)


async def _raw_connect_and_send(port: int, payload: bytes) -> bytes:
    """Open a raw TCP connection to a raft port, send bytes, return what came back."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout=5)
    try:
        writer.write(payload)
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(1024), timeout=6)
        except (TimeoutError, ConnectionError):
            return b""
    finally:
        writer.close()


@pytest.mark.timeout(120)
async def test_bad_peers_are_dropped_and_the_cluster_keeps_serving(tmp_path: Path) -> None:
    cluster = KVCluster(
        tmp_path,
        size=3,
        durability="relaxed",
        election_min_ms=500,
        election_max_ms=1000,
        extra_args=["--secret", "s3cret-for-the-bad-peer-test"],
    )
    cluster.start_all()
    try:
        async with aiohttp.ClientSession() as session:
            leader, _ = await wait_for_leased_leader(cluster, session, deadline_s=20)
            target = cluster.nodes[leader]
            # 1. garbage; 2. an oversized length prefix; 3. a frame that is msgpack but no hello.
            await _raw_connect_and_send(target.raft_port, b"\x00\x00\x00\x05hello garbage \xff\xfe" * 50)
            await _raw_connect_and_send(target.raft_port, (2**31).to_bytes(4, "big") + b"x" * 64)
            await _raw_connect_and_send(target.raft_port, b"\x00\x00\x00\x03\x93\x01\x02")
            # The leader still leads and commits writes.
            for i in range(20):
                async with session.post(
                    target.url + "/put",
                    json={"key": f"after{i}", "value": "ok"},
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as resp:
                    assert resp.status == 200, await resp.text()
            still, _ = await wait_for_leased_leader(cluster, session, deadline_s=5)
            assert still == leader
    finally:
        cluster.stop_all()
    rejected = [
        line
        for line in target.log_path.read_text(errors="replace").splitlines()
        if "connection from 127.0.0.1" in line and "rejected" in line
    ]
    assert len(rejected) >= 3, "the node should log each bad connection it dropped"
