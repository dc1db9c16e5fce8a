"""etcd 3.4 for bench/peer/run.py: a three-member cluster on loopback, its commits through
the HTTP gateway, and its failover.

Each member runs with etcd's defaults (heartbeat 100 ms, election timeout 1000 ms, fsync of
its WAL on every commit); every URL is on 127.0.0.1. A commit is one `POST /v3/kv/put`
answered 200 (the gateway answers only after the entry is committed by a quorum). The load
sends the puts to the members in turn (a follower forwards to the leader), as an etcd client
given the three endpoints does.

Failover: find the leader (`/v3/maintenance/status`: the member whose own id is the leader
id), SIGKILL it, and time until a put through the gateway succeeds again, trying the other
members in turn, each with a short timeout.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from harness.ports import free_ports
from harness.processes import wait_or_kill

START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0
PUT_DEADLINE_S = 10.0
RETRY_TIMEOUT_S = 0.3  # per try after a fault: a member that cannot commit is left quickly
FAILOVER_DEADLINE_S = 30.0


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@dataclass
class EtcdCluster:
    client_urls: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> list[int]:
        """SIGTERM every member still running, SIGKILL after the deadline."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        return [proc.pid for proc in self.procs if wait_or_kill(proc, STOP_DEADLINE_S)]


async def start_etcd(etcd: str, root: Path, pids: list[int], members: int = 3) -> EtcdCluster:
    ports = free_ports(2 * members)
    client_ports, peer_ports = ports[:members], ports[members:]
    initial = ",".join(f"m{i + 1}=http://127.0.0.1:{peer_ports[i]}" for i in range(members))
    cluster = EtcdCluster([f"http://127.0.0.1:{p}" for p in client_ports])
    token = f"dexpeer-{uuid.uuid4().hex[:8]}"
    home = root / f"etcd-{token}"
    try:
        for i in range(members):
            member_dir = home / f"m{i + 1}"
            member_dir.mkdir(parents=True)
            client, peer = cluster.client_urls[i], f"http://127.0.0.1:{peer_ports[i]}"
            command = [
                etcd,
                "--name",
                f"m{i + 1}",
                "--data-dir",
                str(member_dir / "data"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                initial,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                token,
            ]
            with open(member_dir / "etcd.log", "ab") as log:
                proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            cluster.procs.append(proc)
            pids.append(proc.pid)
        async with aiohttp.ClientSession() as http:
            if await put_until_committed(http, cluster.client_urls, START_DEADLINE_S) is None:
                raise TimeoutError(f"etcd committed no put within {START_DEADLINE_S:.0f} s; logs in {home}")
    except BaseException:
        await asyncio.to_thread(cluster.stop)
        raise
    return cluster


async def put(http: aiohttp.ClientSession, url: str, key: str, timeout_s: float) -> bool:
    """One put through the gateway; True when it was committed."""
    try:
        async with http.post(
            url + "/v3/kv/put",
            json={"key": b64(key), "value": b64("v")},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            return resp.status == 200 and "header" in await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False


async def put_until_committed(http: aiohttp.ClientSession, urls: list[str], deadline_s: float) -> float | None:
    """Try the members in turn until a put commits; when it did (monotonic), None by the deadline."""
    deadline = time.monotonic() + deadline_s
    turn = 0
    while time.monotonic() < deadline:
        if await put(http, urls[turn % len(urls)], f"probe-{uuid.uuid4().hex[:8]}", RETRY_TIMEOUT_S):
            return time.monotonic()
        turn += 1
        await asyncio.sleep(0.01)
    return None


async def leader_index(http: aiohttp.ClientSession, urls: list[str]) -> int:
    for i, url in enumerate(urls):
        async with http.post(url + "/v3/maintenance/status", json={}, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            status = await resp.json(content_type=None)
        if status.get("leader") and status["leader"] == status.get("header", {}).get("member_id"):
            return i
    raise RuntimeError("no etcd member says it is the leader")


async def failover_once(etcd: str, root: Path, pids: list[int]) -> float | None:
    """A fresh cluster; SIGKILL its leader; seconds until a put commits again."""
    cluster = await start_etcd(etcd, root, pids)
    try:
        async with aiohttp.ClientSession() as http:
            leader = await leader_index(http, cluster.client_urls)
            others = [u for i, u in enumerate(cluster.client_urls) if i != leader]
            killed_at = time.monotonic()
            cluster.procs[leader].kill()
            committed_at = await put_until_committed(http, others, FAILOVER_DEADLINE_S)
        return None if committed_at is None else committed_at - killed_at
    finally:
        await asyncio.to_thread(cluster.stop)


@dataclass
class PutLog:
    done_at_ns: list[int] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    failed: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def put_lane(http: aiohttp.ClientSession, urls: list[str], first: int, log: PutLog) -> None:
    turn = first
    while not log.stop.is_set():
        started = time.monotonic_ns()
        ok = await put(http, urls[turn % len(urls)], f"k{first}-{turn}", PUT_DEADLINE_S)
        turn += 1
        if ok:
            now = time.monotonic_ns()
            log.done_at_ns.append(now)
            log.latencies_s.append((now - started) / 1e9)
        else:
            log.failed += 1
            await asyncio.sleep(0.01)  # a refused put answers at once: do not spin


async def drive_puts(
    cluster: EtcdCluster, concurrency: int, warmup_s: float, duration_s: float
) -> tuple[PutLog, int, int]:
    """`concurrency` lanes of puts; the log and the window's bounds (monotonic ns)."""
    log = PutLog()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        lanes = [asyncio.create_task(put_lane(http, cluster.client_urls, i, log)) for i in range(concurrency)]
        try:
            await asyncio.sleep(warmup_s)
            start_ns = time.monotonic_ns()
            await asyncio.sleep(duration_s)
            end_ns = time.monotonic_ns()
            log.stop.set()
            await asyncio.wait(lanes, timeout=PUT_DEADLINE_S + 5)
        finally:
            for lane in lanes:
                lane.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
    return log, start_ns, end_ns
