"""A local cluster whose Raft links run through a fault proxy (harness/fault_proxy.py):
real `dex-ha node` processes, configured by `dex-ha cluster up`'s own plan and TOML writer
(dex_ha/local_cluster.py), except that in each node's config every peer's Raft address is
the proxy of the directed link from this node to that peer. A test can then cut any link
one way, isolate a node, kill it by pid and start it again on its data directory.

It is a LocalCluster (harness/cluster_process.py), so `urls`, `tokens`, `probe_ports`,
`pid`, `kill`, `active_node` and `run_cli` work the same.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from dex_ha.local_cluster import (
    ClusterError,
    ClusterPlan,
    NodePlan,
    node_log_tails,
    node_toml,
    plan_cluster,
    start_node,
    stop_processes,
    wait_for_one_active,
    write_cluster_files,
    write_pids,
)
from harness.cluster_process import LocalCluster
from harness.fault_proxy import ProxyMesh

START_DEADLINE_S = 60.0


class ProxiedCluster(LocalCluster):
    def __init__(
        self,
        directory: Path,
        nodes: int = 3,
        settings: Mapping[str, int] | None = None,
        drain_timeout_ms: int | None = None,
        durability: str = "relaxed",
    ) -> None:
        super().__init__(directory, nodes, relaxed=durability == "relaxed")
        # The port ranges LocalCluster chose, one port per node in each.
        http, raft, probe = (
            [base + i for i in range(nodes)] for base in (self.http_base, self.raft_base, self.probe_base)
        )
        self.plan: ClusterPlan = plan_cluster(
            directory, http, raft, probe, durability=durability, drain_timeout_ms=drain_timeout_ms
        )
        self.settings = dict(settings or {})  # extra top-level config keys, e.g. snapshot_every_entries
        self.mesh = ProxyMesh({n.node_id: n.raft_port for n in self.plan.nodes})
        self.layout = {"layout": self.plan.layout(), "tokens": dict(self.plan.tokens)}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started_pids: list[int] = []  # every node process ever started, restarts included
        self.node_env: dict[str, dict[str, str]] = {}  # extra environment of a node's process, e.g. its clock

    @property
    def node_ids(self) -> list[str]:
        return self.plan.node_ids

    @property
    def probe_urls(self) -> dict[str, str]:
        return {node_id: f"http://127.0.0.1:{port}" for node_id, port in self.probe_ports.items()}

    def proxied_toml(self, node: NodePlan) -> str:
        """`cluster up`'s TOML for `node`, with its peers reached through the proxies."""
        text = node_toml(self.plan, node)
        for peer in self.plan.nodes:
            if peer.node_id != node.node_id:
                text = text.replace(
                    f'raft_addr = "{peer.raft_addr}"', f'raft_addr = "{self.mesh.address(node.node_id, peer.node_id)}"'
                )
        extra = "".join(f"{key} = {value}\n" for key, value in self.settings.items())
        return text.replace("\n[tokens]", f"{extra}\n[tokens]", 1)  # top-level keys come before the tables

    async def start(self) -> str:
        """Start the proxies and every node; the id of the first active node."""
        write_cluster_files(self.plan)
        for node in self.plan.nodes:
            node.config_path.write_text(self.proxied_toml(node))
            os.chmod(node.config_path, 0o600)  # it holds the secret and the tokens
        await self.mesh.start()
        for node_id in self.node_ids:
            self.start_node(node_id)
        try:
            return await wait_for_one_active(self.plan.nodes, START_DEADLINE_S, self._first_exited)
        except ClusterError as exc:  # say why: a node that exited wrote the reason to its log
            raise ClusterError(f"{exc}\n{node_log_tails(self.plan)}") from None

    def start_node(self, node_id: str, join: bool = False) -> None:
        """Start (or restart, on its data directory) one node; its pid goes to the pids file.
        `join`: with `--join`, as a new incarnation on an empty data directory (`dex-ha
        members replace`); it keeps its config, so its links run through the same proxies."""
        old = self.procs.get(node_id)
        if old is not None:
            old.wait(timeout=10)  # reaped (TimeoutExpired if it still runs): one process per data directory
        args = ("--join",) if join else ()
        self.procs[node_id] = start_node(self.plan.node(node_id), self.node_env.get(node_id), args)
        self.started_pids.append(self.procs[node_id].pid)
        write_pids(self.dir, {nid: p.pid for nid, p in self.procs.items()})

    def _first_exited(self) -> str | None:
        return next((nid for nid, p in self.procs.items() if p.poll() is not None), None)

    async def stop(self) -> None:
        """Stop every node by pid (SIGTERM, then SIGKILL), then the proxies."""
        try:
            await asyncio.to_thread(stop_processes, self.procs, 15.0)
        finally:
            await self.mesh.stop()

    def down(self) -> None:  # LocalCluster's `dex-ha cluster down` does not know these processes
        stop_processes(self.procs, 15.0)
