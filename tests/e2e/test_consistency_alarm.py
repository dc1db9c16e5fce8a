"""The replica check on real processes: one follower's state.db is changed behind the
cluster's back (a value in a replicated row, as a flipped byte in a page would do). The
consistency check finds it within a bounded time: the alarm shows in /v1/cluster and in
the metrics, and when the leader is killed the divergent node is not elected."""

from __future__ import annotations

import sqlite3

import aiohttp
import pytest

from harness.cluster_process import LocalCluster, cluster_view
from harness.waiting import eventually

CHECK_EVERY_MS = "300"
DETECTED_WITHIN_S = 30.0  # a few check intervals on a loaded machine


async def _create_session(url: str, token: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            url + "/v1/sessions",
            json={"agent": "a", "session_id": "acct", "metadata": {"account": "account-1111"}},
            headers={"Authorization": f"Bearer {token}"},
        ) as r:
            assert r.status == 201, await r.text()


def _change_a_replicated_row(state_db: str) -> None:
    conn = sqlite3.connect(state_db)
    try:
        changed = conn.execute("UPDATE sessions SET metadata = replace(metadata, '1111', '9999')").rowcount
        conn.commit()
    finally:
        conn.close()
    assert changed == 1


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/metrics") as r:
            return await r.text()


@pytest.mark.timeout(180)
async def test_a_follower_whose_state_was_changed_is_flagged_and_never_elected(cluster: LocalCluster) -> None:
    admin = cluster.tokens["admin"]
    leader = await cluster.active_node()
    await _create_session(cluster.urls[leader], cluster.tokens["client"])
    divergent = next(n for n in cluster.urls if n != leader)
    # Every node has applied the session before the processes stop.
    await eventually(
        lambda: _all_applied_the_session(cluster),
        "every node to apply the session",
        deadline_s=10,
    )
    for node in cluster.urls:
        cluster.kill(node)
    _change_a_replicated_row(str(cluster.dir / divergent / "state.db"))
    for node in cluster.urls:
        cluster.restart(node, extra_env={"DEX_HA_CONSISTENCY_CHECK_INTERVAL_MS": CHECK_EVERY_MS})

    async def alarm_seen_everywhere() -> bool:
        views = [await cluster_view(url, admin) for url in cluster.urls.values()]
        return all(v is not None and divergent in v["consistency_alarms"] for v in views)

    await eventually(alarm_seen_everywhere, "the alarm on every node", deadline_s=DETECTED_WITHIN_S)
    active = await cluster.active_node()
    view = await cluster_view(cluster.urls[active], admin)
    assert view is not None
    assert list(view["consistency_alarms"]) == [divergent]
    flags = {m["id"]: m["consistency_alarm"] for m in view["members"]}
    assert flags == {n: n == divergent for n in cluster.urls}
    assert f'dex_consistency_alarm{{member="{divergent}"}} 1.0' in await _metrics(cluster.urls[active])
    status = cluster.run_cli("status", "--url", cluster.urls[active], "--token", admin)
    assert f"CONSISTENCY ALARM: {divergent}'s state differed" in status.stdout, status.stdout + status.stderr
    log_text = (cluster.dir / f"{active}.log").read_text()
    assert f"member {divergent}'s state hash is" in log_text

    if active == divergent:  # barred: it hands the leadership over at once
        active = await cluster.active_node(not_=divergent)
    cluster.kill(active)
    survivor = next(n for n in cluster.urls if n not in (active, divergent))
    assert await cluster.active_node(not_=active) == survivor
    view = await cluster_view(cluster.urls[divergent], admin)
    assert view is not None and view["role"] != "active"


async def _all_applied_the_session(cluster: LocalCluster) -> bool:
    views = [await cluster_view(url, cluster.tokens["admin"]) for url in cluster.urls.values()]
    if any(v is None for v in views):
        return False
    return len({v["applied_index"] for v in views if v is not None}) == 1
