"""`dex-ha cluster up`, `status`, `step-down` and `cluster down` against one real three-node
cluster on loopback (free ports, stopped by pid, deadlines on every wait).

The tests share one cluster (starting one takes seconds) and run in file order; the last one
stops it. The fixture stops whatever is left by pid, also when a test fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cluster_process import port_args
from tests.cli import (
    clean_env,
    free_port_range,
    http_status,
    pid_gone,
    run_cli,
    wait_until,
)


@dataclass
class LocalCluster:
    dir: Path
    urls: dict[str, str]  # node id -> URL
    up_output: str

    @property
    def admin_token(self) -> str:
        export = re.search(r"^export DEX_HA_TOKEN=(\S+)$", (self.dir / "tokens.env").read_text(), re.MULTILINE)
        assert export is not None, "tokens.env exports no DEX_HA_TOKEN"
        return export.group(1)

    def pids(self) -> dict[str, int]:
        path = self.dir / "pids"
        if not path.exists():
            return {}
        return {line.split()[0]: int(line.split()[1]) for line in path.read_text().splitlines()}

    def ready_nodes(self) -> list[str]:
        return [node_id for node_id, url in self.urls.items() if http_status(url + "/readyz") == 200]

    def cli(self, *args: str, token: bool = True, timeout: float = 60.0):
        env = clean_env(DEX_HA_TOKEN=self.admin_token) if token else clean_env()
        return run_cli(*args, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster_dir = tmp_path_factory.mktemp("cluster")
    base = free_port_range(9)
    result = run_cli(
        "cluster",
        "up",
        "--nodes",
        "3",
        "--dir",
        str(cluster_dir),
        *port_args(base),
        "--relaxed",
        timeout=90,
    )
    recorded = cluster_dir / "pids"
    pids = [int(line.split()[1]) for line in recorded.read_text().splitlines()] if recorded.exists() else []
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        yield LocalCluster(cluster_dir, {f"n{i + 1}": f"http://127.0.0.1:{base + i}" for i in range(3)}, result.stdout)
    finally:
        for pid in pids:  # whatever a failed test left running: these nodes are ours
            if not pid_gone(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_up_starts_three_nodes_with_exactly_one_active(cluster: LocalCluster) -> None:
    pids = cluster.pids()
    assert sorted(pids) == ["n1", "n2", "n3"]
    assert all(not pid_gone(pid) for pid in pids.values())
    # Exactly one node is ready; polled, since a busy machine may delay a lease renewal for a moment.
    wait_until(lambda: len(cluster.ready_nodes()) == 1, 30, "exactly one /readyz 200")
    # The printed table: every node with its URL, raft address, pid and log; how to stop them.
    for node_id, url in cluster.urls.items():
        assert re.search(
            rf"^{node_id}\s+{re.escape(url)}\s+127\.0\.0\.1:\d+\s+{pids[node_id]}\s+\S+{node_id}\.log",
            cluster.up_output,
            re.MULTILINE,
        )
    assert f"dex-ha cluster down --dir {cluster.dir}" in cluster.up_output
    # The web console it names is served there (the newcomer's first stop).
    assert f"Web console: {cluster.urls['n1']}/ui" in cluster.up_output
    assert http_status(cluster.urls["n1"] + "/ui") == 200
    assert "kill " + " ".join(str(pids[n]) for n in ("n1", "n2", "n3")) in cluster.up_output
    for private in ["tokens.env", "n1.toml", "cluster.json"]:
        assert stat.S_IMODE((cluster.dir / private).stat().st_mode) == 0o600


def test_a_second_up_on_a_running_dir_is_refused(cluster: LocalCluster) -> None:
    ports = [int(url.rsplit(":", 1)[1]) for url in cluster.urls.values()]
    result = run_cli(
        "cluster",
        "up",
        "--dir",
        str(cluster.dir),
        *port_args(ports[0]),
        "--relaxed",
        timeout=30,
    )
    assert result.returncode == 1
    assert "already has running nodes" in result.stderr
    assert cluster.pids() and all(not pid_gone(pid) for pid in cluster.pids().values())


def _status_rows(cluster: LocalCluster, url: str) -> list[list[str]] | None:
    """The table rows of `dex-ha status`, once it shows exactly one active node."""
    result = cluster.cli("status", "--url", url)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if re.match(r"^n\d\s", line)]
    active = [row[0] for row in rows if row[2] == "active"]
    return rows if len(active) == 1 and f"active node: {active[0]}" in result.stdout else None


def test_status_prints_every_node_and_one_active_from_a_single_url(cluster: LocalCluster) -> None:
    rows = wait_until(lambda: _status_rows(cluster, cluster.urls["n1"]), 30, "a status with one active node")
    assert sorted(row[0] for row in rows) == ["n1", "n2", "n3"]  # the members were found from one URL
    roles = [row[2] for row in rows]
    assert roles.count("standby") == 2
    active = rows[roles.index("active")][0]
    wait_until(lambda: cluster.ready_nodes() == [active], 30, f"{active} answering /readyz 200 alone")

    raw = json.loads(cluster.cli("status", "--url", cluster.urls["n2"], "--json").stdout)
    assert sorted(node["answer"]["node_id"] for node in raw["nodes"]) == ["n1", "n2", "n3"]


@pytest.mark.parametrize("command", [["status"], ["step-down"]])
def test_without_a_token_the_server_refuses_with_exit_1(cluster: LocalCluster, command: list[str]) -> None:
    active = wait_until(lambda: cluster.ready_nodes(), 30, "an active node")
    result = cluster.cli(*command, "--url", cluster.urls["n1"], token=False, timeout=30)
    assert result.returncode == 1
    assert "401 unauthorized: set DEX_HA_TOKEN or pass --token" in result.stderr
    wait_until(lambda: cluster.ready_nodes() == active, 10, "the same node still active")  # nothing moved


def test_step_down_moves_the_active_node(cluster: LocalCluster) -> None:
    before = wait_until(
        lambda: cluster.ready_nodes() if len(cluster.ready_nodes()) == 1 else None, 30, "one active node"
    )[0]
    result = cluster.cli("step-down", "--url", cluster.urls["n1"], "--url", cluster.urls["n2"])
    assert result.returncode == 0, result.stderr
    moved = re.search(
        r"^active node moved from (n\d) to (n\d) \(0 attempts were still running\)$", result.stdout, re.MULTILINE
    )
    assert moved, result.stdout
    assert moved.group(1) == before and moved.group(2) != before
    after = wait_until(
        lambda: [n for n in cluster.ready_nodes() if n != before] or None, 30, "another node answering /readyz 200"
    )
    assert after == [moved.group(2)]
    assert http_status(cluster.urls[before] + "/readyz") == 503


def test_step_down_to_an_unknown_node_exits_1_with_the_servers_message(cluster: LocalCluster) -> None:
    active = wait_until(lambda: cluster.ready_nodes(), 30, "an active node")
    result = cluster.cli("step-down", "--url", cluster.urls["n3"], "--to", "n9")
    assert result.returncode == 1
    assert re.search(r"refused \(4\d\d ", result.stderr) and "'n9'" in result.stderr  # the server's answer
    wait_until(lambda: cluster.ready_nodes() == active, 10, "the same node still active")  # nothing moved


def test_down_stops_every_pid(cluster: LocalCluster) -> None:
    pids = cluster.pids()
    assert len(pids) == 3
    result = run_cli("cluster", "down", "--dir", str(cluster.dir), timeout=90)
    assert result.returncode == 0, result.stderr
    for node_id, pid in pids.items():
        assert f"{node_id} (pid {pid}): stopped" in result.stdout
    # Orphaned nodes are reaped by init; os.kill(pid, 0) fails once they are gone for good.
    wait_until(lambda: all(pid_gone(pid) for pid in pids.values()), 30, "every node pid gone")
    assert not (cluster.dir / "pids").exists()
    assert all(http_status(url + "/livez") is None for url in cluster.urls.values())
