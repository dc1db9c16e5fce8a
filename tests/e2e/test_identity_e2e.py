"""Cluster and member identity on real processes (`dex-ha cluster up`, SIGKILL):

- a standby whose data directory was deleted comes back: it refuses to vote (exits 78 with
  one line saying to replace it), and the session acknowledged before is never lost;
- a member's data dir restored from ANOTHER cluster's backup: its peers refuse it, it
  exits 78, and the cluster keeps every session;
- `dex-ha members replace`: the member comes back as a new incarnation (empty data dir,
  --join), catches up, is promoted, and counts: the cluster survives a SIGKILL of another
  node afterwards with every session.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

from dex_ha.client import DexClient
from dex_ha.local_cluster import read_pids, write_pids
from dex_ha.server.process import REFUSED_EXIT_CODE
from harness.cluster_process import LocalCluster, cluster_view
from harness.processes import pid_alive
from harness.waiting import eventually

DEADLINE_S = 45.0


async def _create_sessions(cluster: LocalCluster, n: int, urls: list[str] | None = None) -> list[str]:
    async with DexClient(urls or list(cluster.urls.values()), token=cluster.tokens["client"]) as client:
        return [(await client.create_session("kept")).session_id for _ in range(n)]


async def _all_readable(cluster: LocalCluster, sessions: list[str]) -> None:
    async with DexClient(list(cluster.urls.values()), token=cluster.tokens["client"]) as client:
        for session_id in sessions:
            assert (await client.get_session(session_id)).session_id == session_id


async def _kill_and_wait(cluster: LocalCluster, *node_ids: str) -> None:
    for node_id in node_ids:
        pid = cluster.pid(node_id)
        cluster.kill(node_id)

        def exited(pid: int = pid) -> bool:
            return not pid_alive(pid)

        await eventually(exited, f"{node_id} (pid {pid}) gone", deadline_s=10)


async def _refused(cluster: LocalCluster, proc: subprocess.Popen[bytes], node_id: str, line: str) -> str:
    """The node exits 78 with `line` in its log; the log's last lines."""
    await eventually(lambda: proc.poll() is not None, f"{node_id} to exit", deadline_s=DEADLINE_S)
    log = (cluster.dir / f"{node_id}.log").read_text(errors="replace")
    assert proc.returncode == REFUSED_EXIT_CODE, f"{node_id} exited {proc.returncode}:\n{log[-3000:]}"
    assert line in log, log[-3000:]
    return log


async def test_a_standby_whose_data_dir_was_deleted_does_not_vote_and_the_session_stays(
    cluster: LocalCluster,
) -> None:
    leader = await cluster.active_node(DEADLINE_S)
    a, b = sorted(n for n in cluster.urls if n != leader)
    await _kill_and_wait(cluster, b)
    [session] = await _create_sessions(cluster, 1, [cluster.urls[leader]])  # acknowledged by leader and a
    await _all_readable(cluster, [session])
    await _kill_and_wait(cluster, leader, a)
    shutil.rmtree(cluster.dir / a)
    wiped = cluster.restart(a)
    cluster.restart(b)  # b lacks the session; before the fix a and b elected b without it
    log = await _refused(cluster, wiped, a, f"node {a} has an empty data directory")
    assert f"dex-ha members replace {a}" in log
    cluster.restart(leader)
    await cluster.active_node(DEADLINE_S)
    await _all_readable(cluster, [session])


async def test_a_member_restored_from_another_clusters_backup_is_refused(tmp_path: Path, cluster: LocalCluster) -> None:
    other = LocalCluster(tmp_path / "other")
    backup = tmp_path / "other.backup"
    try:
        other.up()
        foreign = await _create_sessions(other, 3)
        done = await asyncio.to_thread(
            other.run_cli, "backup", "--out", str(backup), f"--token={other.tokens['admin']}",
            *(f"--url={u}" for u in other.urls.values()),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        other.down()
    sessions = await _create_sessions(cluster, 150)
    leader = await cluster.active_node(DEADLINE_S)
    victim = min(n for n in cluster.urls if n != leader)
    await _kill_and_wait(cluster, victim)
    shutil.rmtree(cluster.dir / victim)
    restored = await asyncio.to_thread(
        cluster.run_cli, "restore", str(backup), "--data-dir", str(cluster.dir / victim),
        "--node-id", victim, "--members", ",".join(sorted(cluster.urls)), "--relaxed",
    )  # fmt: skip
    assert restored.returncode == 0, restored.stdout + restored.stderr
    proc = cluster.restart(victim)
    await _refused(cluster, proc, victim, "belong to another cluster")
    peer_logs = "".join((cluster.dir / f"{n}.log").read_text() for n in cluster.urls if n != victim)
    assert f"refuses peer {victim} of cluster" in peer_logs
    await cluster.active_node(DEADLINE_S)
    await _all_readable(cluster, sessions)
    async with DexClient(list(cluster.urls.values()), token=cluster.tokens["client"]) as client:
        listed = {s.session_id for s in (await client.list_sessions(limit=500)).sessions}
    assert set(sessions) <= listed and not set(foreign) & listed


def _start_new_incarnation(cluster: LocalCluster, node_id: str) -> None:
    """`dex-ha node --config … --join` on the node's (empty) data directory, as the replace says."""
    with open(cluster.dir / f"{node_id}.log", "ab") as out:
        new = subprocess.Popen(
            [sys.executable, "-m", "dex_ha.cli", "node", "--config", str(cluster.dir / f"{node_id}.toml"), "--join"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    write_pids(cluster.dir, {**read_pids(cluster.dir), node_id: new.pid})


async def test_a_replace_that_stopped_after_the_removal_is_resumed(cluster: LocalCluster) -> None:
    """A replace whose add-back never happened (e.g. an election right after the removal
    outlasted the command): running it again with the addresses finishes it."""
    sessions = await _create_sessions(cluster, 5)
    leader = await cluster.active_node(DEADLINE_S)
    victim = min(n for n in cluster.urls if n != leader)
    view = await cluster_view(cluster.urls[leader], cluster.tokens["admin"])
    assert view is not None
    old = next(m for m in view["members"] if m["id"] == victim)
    await _kill_and_wait(cluster, victim)
    shutil.rmtree(cluster.dir / victim)
    live = [u for n, u in cluster.urls.items() if n != victim]
    urls = [f"--url={u}" for u in live]
    token = f"--token={cluster.tokens['admin']}"
    removed = await asyncio.to_thread(cluster.run_cli, "members", "remove", victim, token, *urls)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    again = await asyncio.to_thread(cluster.run_cli, "members", "replace", victim, token, *urls)
    assert again.returncode == 2 and "again with --raft-addr and --node-url" in again.stderr, again.stderr
    resume = ["members", "replace", victim, "--raft-addr", old["raft_addr"], "--node-url", old["url"], "--wait", "90"]
    replace = asyncio.create_task(asyncio.to_thread(cluster.run_cli, *resume, token, *urls, timeout_s=150))
    await eventually(lambda: _is_learner(cluster, live, victim), f"{victim} added back as a learner", DEADLINE_S)
    _start_new_incarnation(cluster, victim)
    done = await replace
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{victim} caught up and is a voter again" in done.stdout and "removed" not in done.stdout
    await _all_readable(cluster, sessions)


async def test_members_replace_brings_back_a_member_that_lost_its_data(cluster: LocalCluster) -> None:
    sessions = await _create_sessions(cluster, 20)
    leader = await cluster.active_node(DEADLINE_S)
    victim = min(n for n in cluster.urls if n != leader)
    await _kill_and_wait(cluster, victim)
    shutil.rmtree(cluster.dir / victim)
    live = [u for n, u in cluster.urls.items() if n != victim]
    replace_args = ["members", "replace", victim, "--wait", "90", f"--token={cluster.tokens['admin']}"]
    replace = asyncio.create_task(
        asyncio.to_thread(cluster.run_cli, *replace_args, *(f"--url={u}" for u in live), timeout_s=150)
    )
    await eventually(lambda: _is_learner(cluster, live, victim), f"{victim} added back as a learner", DEADLINE_S)
    _start_new_incarnation(cluster, victim)
    done = await replace
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{victim} caught up and is a voter again" in done.stdout
    assert "--join" in done.stdout
    # The new incarnation counts: with the active node killed, it is one of the two voters left.
    active = await cluster.active_node(DEADLINE_S)
    other = next(n for n in cluster.urls if n not in (active, victim))
    await _kill_and_wait(cluster, other if active == victim else active)
    await cluster.active_node(DEADLINE_S)
    await _all_readable(cluster, sessions)


async def _is_learner(cluster: LocalCluster, urls: list[str], node_id: str) -> bool:
    for url in urls:
        view = await cluster_view(url, cluster.tokens["admin"])
        if view and view.get("role") == "active":
            return any(m["id"] == node_id and not m["voter"] for m in view["members"])
    return False


async def test_cluster_up_founds_one_cluster_id_and_keeps_it_when_started_again(cluster: LocalCluster) -> None:
    async def ids() -> set:
        views = [await cluster_view(url, cluster.tokens["admin"]) for url in cluster.urls.values()]
        return {view["cluster_id"] for view in views if view} if all(views) else set()

    [founded] = await eventually(ids, "every node answering", DEADLINE_S)
    assert founded
    sessions = await _create_sessions(cluster, 3)
    cluster.down()
    cluster.up()  # on the same directories: the same cluster, as before ids
    await cluster.active_node(DEADLINE_S)
    assert await eventually(ids, "every node answering", DEADLINE_S) == {founded}
    await _all_readable(cluster, sessions)
