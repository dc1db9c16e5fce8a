"""The leader's per-member replication gauges, which the follower-lag and member-unreachable
alerts (deploy/prometheus/alerts.yml) read: dex_raft_follower_lag_entries{member} and
dex_raft_follower_last_contact_seconds{member}. Three in-process nodes on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from dex_ha.server.node import NodeServer
from harness.waiting import eventually
from tests.server.node_fixture import HttpApi, base_url, cluster_plan, node_config, start_node, tool


def member_gauges(node: NodeServer, name: str) -> dict[str, float]:
    return {
        s.labels["member"]: s.value
        for metric in node.metrics.registry.collect()
        for s in metric.samples
        if s.name == name
    }


@pytest.fixture
async def three_nodes(tmp_path: Path) -> AsyncIterator[dict[str, NodeServer]]:
    plan = cluster_plan(tmp_path)
    started: dict[str, NodeServer] = {}
    try:
        for node_id in plan.node_ids:
            started[node_id] = await start_node(node_config(plan, node_id), wait_ready=False)
        yield started
    finally:
        for node in started.values():
            await node.stop()


async def test_the_leader_exports_lag_and_contact_per_member_and_followers_export_none(three_nodes):
    async def the_active_node():
        ready = [n for n in three_nodes.values() if n.is_ready()]
        return ready[0] if len(ready) == 1 else None

    active = await eventually(the_active_node, deadline_s=10, what="an active node")
    followers = {nid for nid, n in three_nodes.items() if n is not active}

    async def both_followers_caught_up():
        lag = member_gauges(active, "dex_raft_follower_lag_entries")
        return set(lag) == followers and all(v == 0 for v in lag.values())

    await eventually(both_followers_caught_up, deadline_s=10, what="both followers at the commit index")
    contact = member_gauges(active, "dex_raft_follower_last_contact_seconds")
    assert set(contact) == followers and all(0 <= v < 1.0 for v in contact.values()), contact
    for nid in followers:  # a follower tracks no one: the families are there, empty
        assert member_gauges(three_nodes[nid], "dex_raft_follower_lag_entries") == {}

    # One follower goes away: the leader's view of it ages, and it falls behind new entries.
    gone = sorted(followers)[0]
    await three_nodes.pop(gone).stop()
    async with aiohttp.ClientSession() as session:  # a committed entry the stopped member lacks
        await HttpApi(base_url(active), session).register_agent("lag-probe", [tool("lookup")])

    async def gone_is_silent_for_over_a_second():
        seconds = member_gauges(active, "dex_raft_follower_last_contact_seconds")
        return seconds[gone] > 1.0 and all(v < 1.0 for nid, v in seconds.items() if nid != gone)

    await eventually(gone_is_silent_for_over_a_second, deadline_s=10, what=f"{gone} silent for over 1 s")
    lag = member_gauges(active, "dex_raft_follower_lag_entries")
    assert lag[gone] >= 1 and all(v == 0 for nid, v in lag.items() if nid != gone), lag
