"""No overlap: over 20 consecutive failovers of three real nodes, alternating a SIGKILL of
the active node (then restarting it on its data directory) and cutting the active node off
from both peers (then healing; its open Raft connections held, or reset), the readiness record, every node asked every 10 ms, never
has two nodes answering 200 in the same round. A writer writes through the SDK throughout;
every acknowledged write is on every node at the end."""

from __future__ import annotations

import time

from harness.proxied_cluster import ProxiedCluster
from harness.readiness_record import ReadinessRecorder
from harness.scenario import AckedWriter, all_caught_up, rejoined, sessions_on_disk
from tests.e2e.conftest import running

FAILOVERS = 20
FAILOVER_DEADLINE_S = 20.0
MAX_MEAN_ROUND_S = 0.1  # the record must be dense to mean anything (10 ms asked; a busy machine is slower)


async def kill_and_restart(cluster: ProxiedCluster, old: str) -> str:
    cluster.kill(old)
    new = await cluster.active_node(FAILOVER_DEADLINE_S, not_=old)
    cluster.start_node(old)
    await rejoined(cluster, old, new)
    return new


async def isolate_and_heal(cluster: ProxiedCluster, old: str, close: bool) -> str:
    await cluster.mesh.isolate(old, close)
    new = await cluster.active_node(FAILOVER_DEADLINE_S, not_=old)
    await cluster.mesh.heal()
    await rejoined(cluster, old, new)
    return new


async def test_twenty_failovers_never_show_two_ready_nodes(proxied: ProxiedCluster) -> None:
    active = await proxied.active_node()
    started = time.monotonic()
    async with (
        ReadinessRecorder(proxied.probe_urls) as record,
        running(AckedWriter(list(proxied.urls.values()), proxied.tokens["client"])) as writer,
    ):
        for i in range(FAILOVERS):
            if i % 2 == 0:
                new = await kill_and_restart(proxied, active)
            else:  # every other partition resets the open connections instead of holding them
                new = await isolate_and_heal(proxied, active, close=i % 4 == 3)
            assert new != active, f"failover {i} left {active} active"
            active = new
        await writer.acked_after(3)
        await record.next_round()

    assert record.overlapping_rounds() == [], record.describe_around(
        next(row.at for row in record.rows if row.round == record.overlapping_rounds()[0][0])
    )
    took = time.monotonic() - started
    assert took / record.rounds < MAX_MEAN_ROUND_S, f"only {record.rounds} probe rounds in {took:.0f} s"
    await all_caught_up(proxied, proxied.node_ids)
    for node in proxied.plan.nodes:
        assert set(writer.acked) <= sessions_on_disk(node.data_dir), f"{node.node_id} lacks acknowledged writes"
