"""A standby whose data directory was wiped catches up, and the members table says what
happened; then, with the only other voter stuck, a write answers 503 `unavailable` within
proposal_timeout_ms instead of hanging (real processes).

Before the fix the leader never moved that standby's next index below the match index it
had acknowledged: the standby applied nothing, `members` showed it caught up, and once the
other standby stopped every write hung.

The nodes run with a 4 s election timeout: the active node's lease outlives a stuck
follower by seconds, so the write below meets a leader that stays active but cannot commit
(with the default 500 ms the leader would step down first, and answer 503 `not_active`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import aiohttp

from dex_ha.cli.members import format_members
from dex_ha.client import DexClient
from dex_ha.raft.identity import IDENTITY_FILE
from harness.cluster_process import LocalCluster, cluster_view
from harness.processes import pid_alive
from harness.waiting import eventually

PROPOSAL_TIMEOUT_MS = 500
SLOW_FAILOVER_ENV = {
    "DEX_HA_ELECTION_TIMEOUT_MIN_MS": "4000",
    "DEX_HA_ELECTION_TIMEOUT_MAX_MS": "4500",
    "DEX_HA_PROPOSAL_TIMEOUT_MS": str(PROPOSAL_TIMEOUT_MS),
}
DEADLINE_S = 45.0


async def _restart_all_with_slow_failover(cluster: LocalCluster) -> None:
    for node_id in cluster.urls:
        pid = cluster.pid(node_id)
        cluster.kill(node_id)

        def exited(pid: int = pid) -> bool:
            return not pid_alive(pid)

        await eventually(exited, f"{node_id} to exit", deadline_s=10)
    for node_id in cluster.urls:
        cluster.restart(node_id, SLOW_FAILOVER_ENV)


async def _kill(cluster: LocalCluster, node_id: str) -> None:
    pid = cluster.pid(node_id)
    cluster.kill(node_id)
    await eventually(lambda: not pid_alive(pid), f"{node_id} to exit", deadline_s=10)


async def _post_session(url: str, token: str, session_id: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        async with http.post(
            url + "/v1/sessions",
            json={"agent": "lost", "session_id": session_id},
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as resp:
            body = {**await resp.json(), "retry_after": resp.headers.get("Retry-After")}
            return resp.status, body, time.monotonic() - started


def _lose_everything_but_the_identity(data_dir: Path) -> None:
    for path in data_dir.iterdir():
        if path.name == IDENTITY_FILE:
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


async def test_a_wiped_standby_catches_up_members_say_so_and_a_stuck_quorum_answers_503(
    cluster: LocalCluster,
) -> None:
    admin, client_token = cluster.tokens["admin"], cluster.tokens["client"]
    await _restart_all_with_slow_failover(cluster)
    leader = await cluster.active_node(deadline_s=DEADLINE_S)
    wiped, stopped = sorted(n for n in cluster.urls if n != leader)
    leader_url = cluster.urls[leader]
    async with DexClient(list(cluster.urls.values()), token=client_token) as client:
        for i in range(20):
            await client.create_session("lost", session_id=f"s-before-{i}")

    async def wiped_has_acknowledged_all() -> bool:
        view = await cluster_view(leader_url, admin)
        if not view:
            return False
        member = next(m for m in view["members"] if m["id"] == wiped)
        return member["match_index"] == view["commit_index"] > 0

    await eventually(wiped_has_acknowledged_all, f"{wiped} to store every entry", deadline_s=DEADLINE_S)

    # Its log and state are lost while the leader keeps its acknowledged match index. The
    # identity file stays (a disk that lost writes, not a new data directory: a node on an
    # empty directory would refuse to start as a voter, which tests/e2e/test_identity_e2e.py
    # covers), so the node starts and it is the leader's defence that must catch it.
    await _kill(cluster, wiped)
    _lose_everything_but_the_identity(cluster.dir / wiped)
    cluster.restart(wiped, SLOW_FAILOVER_ENV)

    async def wiped_caught_up() -> dict | None:
        view = await cluster_view(leader_url, admin)
        own = await cluster_view(cluster.urls[wiped], admin)
        if view is None or own is None:
            return None
        member = next(m for m in view["members"] if m["id"] == wiped)
        commit = view["commit_index"]
        applied_everything = own["applied_index"] >= commit and member["applied_index"] >= commit
        return view if applied_everything and member["lost_acknowledged_index"] is None else None

    view = await eventually(wiped_caught_up, f"{wiped} to apply the leader's commit index", deadline_s=DEADLINE_S)
    assert view["node_id"] == leader and view["role"] == "active"
    member = next(m for m in view["members"] if m["id"] == wiped)
    assert member["lost_entries"] >= 1, member  # the leader saw it lose what it had acknowledged
    row = format_members(view["members"], view["commit_index"])
    assert f"caught up (lost entries {member['lost_entries']}x this term)" in row, row
    log = (cluster.dir / f"{leader}.log").read_text()
    assert f"member {wiped} lost entries it had acknowledged" in log
    async with aiohttp.ClientSession() as http:
        async with http.get(leader_url + "/metrics") as resp:
            metrics = await resp.text()
    assert f'dex_raft_follower_lost_entries_total{{member="{wiped}"}}' in metrics

    # The wiped standby counts again: with the other standby gone, writes still commit.
    await _kill(cluster, stopped)
    status, body, _ = await _post_session(leader_url, client_token, "s-with-the-wiped-standby")
    assert status == 201, body

    # The only other voter is stuck: the leader stays active for its lease, but cannot commit.
    os.kill(cluster.pid(wiped), signal.SIGSTOP)
    try:
        status, body, elapsed = await _post_session(leader_url, client_token, "s-stuck")
    finally:
        os.kill(cluster.pid(wiped), signal.SIGCONT)
    assert status == 503 and body["error"] == "unavailable", body
    assert body["retry_after"] == "1" and "may still commit" in body["message"]
    assert elapsed < PROPOSAL_TIMEOUT_MS / 1000 + 2.0, f"the write hung for {elapsed:.1f} s"
    # It may still commit: once the standby runs again, the same request is safe to repeat.
    async with DexClient(leader_url, token=client_token) as client:
        session = await asyncio.wait_for(client.create_session("lost", session_id="s-stuck"), DEADLINE_S)
    assert session.session_id == "s-stuck"
