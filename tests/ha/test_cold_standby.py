"""Cold standby replaces a dead node (docs/operations.md "Replacing a node"): one node of
three is SIGKILLed and stays dead; an empty node starts with `join = true`, is added as a
learner, catches up from a snapshot (the cluster snapshots every 50 entries, so the log it
would need is compacted away), is promoted, and the dead node is removed. The cluster is then
three voters again and survives another SIGKILL of its active node: a session completes a
turn after it, with every session written before the first kill still there."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dex_ha.client import Connection, DexClient
from dex_ha.local_cluster import close_all, ready_nodes, start_node
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, Worker
from harness.cluster_process import add_member_args, cluster_view, plan_joiner
from harness.processes import stop
from harness.proxied_cluster import ProxiedCluster
from harness.scenario import sessions_on_disk
from harness.waiting import eventually
from tests.e2e.conftest import running

SNAPSHOT_EVERY = 50
SESSIONS_BEFORE = 120  # > 2 snapshots' worth of entries
DEADLINE_S = 45.0


@pytest.fixture
async def snapshotting(tmp_path: Path) -> AsyncIterator[ProxiedCluster]:
    cluster = ProxiedCluster(tmp_path / "cluster", settings={"snapshot_every_entries": SNAPSHOT_EVERY})
    try:
        await cluster.start()
        yield cluster
    finally:
        await cluster.stop()


def answer_at_once(request: ModelRequest) -> dict:
    return {"content": f"echo {request.history[-1].get('text')}", "tool_calls": []}


def members_cli(cluster: ProxiedCluster, urls: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.run_cli("members", *args, *(f"--url={u}" for u in urls), f"--token={cluster.tokens['admin']}")


async def test_a_cold_standby_replaces_a_dead_node_and_the_cluster_survives_another_kill(
    snapshotting: ProxiedCluster,
) -> None:
    cluster = snapshotting
    urls = dict(cluster.urls)
    async with DexClient(list(urls.values()), token=cluster.tokens["client"]) as client:
        written = {(await client.create_session("standby")).session_id for _ in range(SESSIONS_BEFORE)}

    dead = await cluster.active_node()
    cluster.kill(dead)
    live = [u for n, u in urls.items() if n != dead]
    await cluster.active_node(DEADLINE_S, not_=dead)

    joiner = plan_joiner(cluster)
    n4_url = joiner.url
    n4 = start_node(joiner)
    try:
        added = await asyncio.to_thread(members_cli, cluster, live, *add_member_args(joiner))
        assert added.returncode == 0, added.stdout + added.stderr
        await eventually(lambda: caught_up_learner(n4_url, cluster.tokens["admin"]), "n4 to catch up", DEADLINE_S)
        installed = re.findall(r"n4: installed snapshot at index (\d+)", joiner.log_path.read_text())
        assert installed and int(installed[0]) >= SNAPSHOT_EVERY, "n4 did not catch up from a snapshot"
        assert written <= sessions_on_disk(cluster.dir / "n4")

        async def promoted() -> bool:  # refused until the leader has seen n4 caught up
            return (await asyncio.to_thread(members_cli, cluster, live, "promote", "n4")).returncode == 0

        await eventually(promoted, "the promotion of n4", DEADLINE_S)
        removed = await asyncio.to_thread(members_cli, cluster, live, "remove", dead)
        assert removed.returncode == 0, removed.stdout + removed.stderr
        view = await eventually(lambda: cluster_view(live[0], cluster.tokens["admin"]), "the cluster view")
        assert sorted(m["id"] for m in view["members"] if m["voter"]) == sorted(
            [n for n in cluster.node_ids if n != dead] + ["n4"]
        )

        survivors = [n for n in cluster.node_ids if n != dead]
        await survives_another_kill(
            cluster,
            {**{n: cluster.pid(n) for n in survivors}, "n4": n4.pid},
            {**{n: urls[n] for n in survivors}, "n4": n4_url},
            written,
        )
    finally:
        stop(n4)


async def caught_up_learner(url: str, token: str) -> bool:
    view = await cluster_view(url, token)
    return bool(view and view["role"] == "learner" and view["applied_index"] >= view["commit_index"] > 0)


async def one_ready(urls: dict[str, str]) -> str:
    """The id of the one node of `urls` whose /readyz answers 200 (waits for exactly one)."""
    probes = {node_id: Connection(url, give_up_after_s=0, request_timeout_s=1.0) for node_id, url in urls.items()}
    try:
        ready = await eventually(lambda: exactly_one(probes), "exactly one ready node", DEADLINE_S)
        return ready[0]
    finally:
        await close_all(probes.values())


async def exactly_one(probes: dict[str, Connection]) -> list[str] | None:
    ready = await ready_nodes(probes)
    assert len(ready) <= 1, f"two nodes ready at once: {ready}"
    return ready or None


async def survives_another_kill(
    cluster: ProxiedCluster, pids: dict[str, int], urls: dict[str, str], written: set[str]
) -> None:
    """SIGKILL the active node (n4 may be it); the two voters left elect, and a turn completes."""
    leader = await one_ready(urls)
    os.kill(pids[leader], signal.SIGKILL)
    left = [u for n, u in urls.items() if n != leader]
    worker = Worker(
        left,
        token=cluster.tokens["worker"],
        agents=[Agent("standby", model=ScriptedModel(answer_at_once))],
        poll_wait_ms=2_000,
    )
    async with running(worker), DexClient(left, token=cluster.tokens["client"]) as client:
        sid = (await client.create_session("standby")).session_id
        await client.send_message(sid, "after the second kill")
        final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
        listed = {s.session_id async for s in client.iter_sessions(agent="standby")}
    assert final.turns[-1].status == "completed"
    assert final.history[-1]["content"] == "echo after the second kill"
    assert written <= listed
