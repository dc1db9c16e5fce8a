"""A three-node cluster started with `dex-ha cluster up` (real processes) for end-to-end
tests: the layout and tokens come from the files the command writes; nodes are killed and
stopped by pid."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

from dex_ha.local_cluster import LAYOUT_FILE, NodePlan, free_port_range, read_pids, start_node, write_pids
from harness.ports import free_ports
from harness.readiness import answers_ready
from harness.waiting import eventually


def port_args(http_base: int, nodes: int = 3) -> list[str]:
    """The `cluster up` options for one range of 3 × `nodes` ports from `http_base`: the
    nodes' HTTP ports first, then their Raft ports, then their probe ports."""
    raft_base = http_base + nodes
    return [
        "--base-port",
        str(http_base),
        "--raft-base-port",
        str(raft_base),
        "--probe-base-port",
        str(raft_base + nodes),
    ]


class LocalCluster:
    def __init__(self, directory: Path, nodes: int = 3, relaxed: bool = True) -> None:
        self.dir = directory
        self.nodes = nodes
        self.relaxed = relaxed  # durability relaxed (no fsync) unless a caller asks for strict
        # One range of free ports: HTTP ports first, then Raft, then probes.
        self.http_base = free_port_range(3 * nodes)
        self.raft_base = self.http_base + nodes
        self.probe_base = self.raft_base + nodes
        self.layout: dict = {}

    def run_cli(self, *args: str, timeout_s: float = 90.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dex_ha.cli", *args], capture_output=True, text=True, timeout=timeout_s
        )

    def up(self) -> None:
        done = self.run_cli(
            "cluster",
            "up",
            "--nodes",
            str(self.nodes),
            "--dir",
            str(self.dir),
            *port_args(self.http_base, self.nodes),
            *(["--relaxed"] if self.relaxed else []),
        )
        assert done.returncode == 0, f"cluster up failed:\n{done.stdout}\n{done.stderr}"
        self.layout = json.loads((self.dir / LAYOUT_FILE).read_text())

    def down(self) -> None:
        self.run_cli("cluster", "down", "--dir", str(self.dir))
        for pid in read_pids(self.dir).values():  # belt and braces: nothing may outlive the test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    @property
    def tokens(self) -> dict[str, str]:
        return self.layout["tokens"]

    @property
    def urls(self) -> dict[str, str]:
        return {node_id: f"http://127.0.0.1:{http_port}" for node_id, http_port, *_ in self.layout["layout"]["nodes"]}

    @property
    def probe_ports(self) -> dict[str, int]:
        return {node_id: probe_port for node_id, _, _, probe_port in self.layout["layout"]["nodes"]}

    def pid(self, node_id: str) -> int:
        return read_pids(self.dir)[node_id]

    def kill(self, node_id: str) -> None:
        os.kill(self.pid(node_id), signal.SIGKILL)

    def restart(self, node_id: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a (killed) node again on its config and data dir; the pids file names the new
        process, so `down` stops it."""
        _, http_port, raft_port, probe_port = next(n for n in self.layout["layout"]["nodes"] if n[0] == node_id)
        proc = start_node(NodePlan(node_id, http_port, raft_port, self.dir, probe_port), extra_env)
        write_pids(self.dir, {**read_pids(self.dir), node_id: proc.pid})
        return proc

    async def active_node(self, deadline_s: float = 20.0, not_: str | None = None) -> str:
        """The one node whose /readyz answers 200 (other than `not_`), within the deadline."""
        async with aiohttp.ClientSession() as http:

            async def the_active_node() -> str | None:
                candidates = {node_id: url for node_id, url in self.urls.items() if node_id != not_}
                ready = [node_id for node_id, url in candidates.items() if await answers_ready(http, url, 0.5)]
                assert len(ready) <= 1, f"two nodes ready at once: {ready}"
                return ready[0] if ready else None

            active: str = await eventually(the_active_node, what="an active node", deadline_s=deadline_s)
            return active


@contextmanager
def cluster_up(directory: Path, nodes: int = 3, relaxed: bool = True) -> Iterator[LocalCluster]:
    """A LocalCluster up in `directory` for the body of the block, and down (by pid) after
    it, also when `up` fails half-way."""
    local = LocalCluster(directory, nodes, relaxed)
    try:
        local.up()
        yield local
    finally:
        local.down()


def plan_joiner(cluster: LocalCluster) -> NodePlan:
    """n4, a node to add to the running cluster, on free ports, its TOML written: n1's file
    (secret, tokens, the peers it can reach) with n4's own keys and `join = true`.
    `start_node` starts it; `add_member_args` adds it."""
    http_port, raft_port, probe_port = free_ports(3)
    n4 = NodePlan("n4", http_port, raft_port, cluster.dir, probe_port)
    text = (cluster.dir / "n1.toml").read_text()
    own = {
        "node_id": f'"{n4.node_id}"',
        "data_dir": f'"{n4.data_dir}"',
        "http_listen": f'"127.0.0.1:{http_port}"',
        "url": f'"{n4.url}"',
        "raft_listen": f'"{n4.raft_addr}"',
        "probe_listen": f'"127.0.0.1:{probe_port}"',
    }
    for key, value in own.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)  # top-level key
        assert n == 1, key
    text = text.replace("\n[tokens]", "join = true\n\n[tokens]", 1)
    n4.config_path.write_text(text)
    return n4


def add_member_args(node: NodePlan) -> list[str]:
    """`dex-ha members` arguments that add `node` (as a learner)."""
    return ["add", "--id", node.node_id, "--raft-addr", node.raft_addr, "--node-url", node.url]


async def cluster_view(url: str, token: str) -> dict | None:
    """A node's GET /v1/cluster (any node answers it), or None when it does not answer 200."""
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(
                url + "/v1/cluster",
                headers={"Authorization": f"Bearer {token}"},
                timeout=aiohttp.ClientTimeout(total=2),
            ) as resp:
                return await resp.json() if resp.status == 200 else None
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
