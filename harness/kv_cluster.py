"""Start and stop kv_node processes on free loopback ports (tests and bench).

Every process is started here and stopped by its pid; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from dex_ha.raft.node import NodeConfig
from harness.ports import free_ports
from harness.processes import REPO_ROOT, env_with_checkout


@dataclass
class KVProc:
    id: str
    raft_port: int
    http_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@dataclass
class KVCluster:
    root: Path
    size: int = 3
    durability: str = "strict"
    election_min_ms: int = NodeConfig.election_timeout_min_ms
    election_max_ms: int = NodeConfig.election_timeout_max_ms
    extra_args: list[str] = field(default_factory=list)
    nodes: dict[str, KVProc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ports = free_ports(2 * self.size)
        for i in range(self.size):
            nid = f"n{i + 1}"
            self.nodes[nid] = KVProc(nid, ports[2 * i], ports[2 * i + 1], self.root / nid, self.root / f"{nid}.log")

    def start(self, nid: str) -> None:
        node = self.nodes[nid]
        members = [f"--member={m.id}=127.0.0.1:{m.raft_port}" for m in self.nodes.values()]
        cmd = [
            sys.executable,
            "-m",
            "harness.kv_node",
            "--id",
            nid,
            "--dir",
            str(node.data_dir),
            "--raft",
            f"127.0.0.1:{node.raft_port}",
            "--http",
            f"127.0.0.1:{node.http_port}",
            "--durability",
            self.durability,
            "--election-min-ms",
            str(self.election_min_ms),
            "--election-max-ms",
            str(self.election_max_ms),
            *members,
            *self.extra_args,
        ]
        log = open(node.log_path, "ab")
        node.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env_with_checkout())
        log.close()

    def start_all(self) -> None:
        for nid in self.nodes:
            self.start(nid)

    def kill(self, nid: str) -> None:
        """SIGKILL by pid and reap it."""
        node = self.nodes[nid]
        if node.proc is not None and node.proc.poll() is None:
            os.kill(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=10)
        node.proc = None

    def stop_all(self) -> None:
        for nid in self.nodes:
            self.kill(nid)

    def alive(self) -> list[str]:
        return [nid for nid, n in self.nodes.items() if n.proc is not None and n.proc.poll() is None]

    def log_tail(self, nid: str, lines: int = 40) -> str:
        path = self.nodes[nid].log_path
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


async def get_json(session: aiohttp.ClientSession, url: str, timeout: float = 2.0) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        return await resp.json()


async def statuses(cluster: KVCluster, session: aiohttp.ClientSession) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for nid in cluster.alive():
        try:
            out[nid] = await get_json(session, cluster.nodes[nid].url + "/status", timeout=1.0)
        except (TimeoutError, aiohttp.ClientError):
            continue
    return out


async def wait_for_leased_leader(
    cluster: KVCluster, session: aiohttp.ClientSession, deadline_s: float, exclude: str | None = None
) -> tuple[str, float]:
    """Poll until exactly one live node reports leader + valid lease; returns (id, seconds)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        st = await statuses(cluster, session)
        leased = [nid for nid, s in st.items() if s.get("is_leader") and s.get("lease_valid") and nid != exclude]
        if len(leased) == 1:
            return leased[0], time.monotonic() - t0
        await asyncio.sleep(0.01)
    raise AssertionError(
        f"no leader with a valid lease within {deadline_s}s; statuses: {await statuses(cluster, session)}"
    )
