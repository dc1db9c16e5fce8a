"""A cold standby joins a running three-node cluster (real processes): it starts with
`join = true`, is added as a learner, catches up, is promoted, and then counts: after a
SIGKILL of the active node the four-voter cluster elects a new active node and keeps every
session."""

from __future__ import annotations

import asyncio

from dex_ha.client import DexClient
from dex_ha.local_cluster import start_node
from harness.cluster_process import LocalCluster, add_member_args, cluster_view, plan_joiner
from harness.processes import stop
from harness.waiting import eventually

DEADLINE_S = 30.0


async def test_a_cold_standby_joins_catches_up_is_promoted_and_counts(cluster: LocalCluster) -> None:
    admin, client_token = cluster.tokens["admin"], cluster.tokens["client"]
    urls = list(cluster.urls.values())
    async with DexClient(urls, token=client_token) as client:
        sessions = [(await client.create_session("joined")).session_id for _ in range(5)]

    joiner = plan_joiner(cluster)
    n4_url = joiner.url
    n4 = start_node(joiner)
    try:
        added = await asyncio.to_thread(
            cluster.run_cli, "members", *add_member_args(joiner), "--url", urls[0], f"--token={admin}"
        )
        assert added.returncode == 0, added.stdout + added.stderr

        async def caught_up_learner() -> dict | None:
            view = await cluster_view(n4_url, client_token)
            return (
                view
                if view and view["role"] == "learner" and view["applied_index"] >= view["commit_index"] > 0
                else None
            )

        await eventually(caught_up_learner, "n4 to catch up as a learner")

        async def promoted() -> bool:  # 409 until the leader has seen n4 caught up
            done = await asyncio.to_thread(
                cluster.run_cli, "members", "promote", "n4", "--url", urls[0], f"--token={admin}"
            )
            return done.returncode == 0

        await eventually(promoted, "the promotion of n4")
        view = await eventually(lambda: cluster_view(urls[0], admin), "the cluster view")
        assert sorted(m["id"] for m in view["members"] if m["voter"]) == ["n1", "n2", "n3", "n4"]

        old = await cluster.active_node()
        cluster.kill(old)
        all_urls = [*cluster.urls.values(), n4_url]
        # Listing needs an active node: one of the three survivors (n4 included) took over.
        async with DexClient(
            [u for u in all_urls if u != cluster.urls[old]], token=client_token, give_up_after_s=DEADLINE_S
        ) as client:
            listed = {s.session_id async for s in client.iter_sessions(agent="joined")}
        assert set(sessions) <= listed
    finally:
        stop(n4)
