"""Partitions, not only kills: the Raft links of three real nodes run through the fault
proxy, and the active node is cut off, both ways or one way, while a writer keeps writing
through the SDK and a recorder asks every node's /readyz every 10 ms.

What the design promises (the lease and readiness of docs/architecture.md), checked from outside:
- a cut-off active node stops answering /readyz 200 before any other node answers 200
  (its lease runs out before the others may elect: never two active nodes);
- it takes no write: a write sent to it straight after the cut is never acknowledged and
  never committed;
- after healing, every acknowledged write is in every node's state, and the cluster goes on.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from dex_ha.server.config import ServerConfig
from harness.proxied_cluster import ProxiedCluster
from harness.readiness_record import ReadinessRecorder
from harness.scenario import AckedWriter, all_caught_up, sessions_on_disk
from tests.e2e.conftest import running

ELECTION_TIMEOUT_MIN_S = ServerConfig.election_timeout_min_ms / 1000
MINORITY_WRITE_WAIT_S = 5.0
FAILOVER_DEADLINE_S = 20.0


async def write_straight_to(url: str, token: str, session_id: str) -> int | None:
    """POST a session to one node only (no SDK, no retry); its status, None if no answer in time."""
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                url + "/v1/sessions",
                json={"agent": "ha-writes", "session_id": session_id},
                headers={"Authorization": f"Bearer {token}"},
                timeout=aiohttp.ClientTimeout(total=MINORITY_WRITE_WAIT_S),
            ) as resp:
                return resp.status
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


def assert_handed_over_without_overlap(record: ReadinessRecorder, old: str, cut_at: float) -> None:
    others = set(record.urls) - {old}
    first_new = record.first_ready(cut_at, others)
    assert first_new is not None, "no other node became ready"
    last_old = record.last_ready(old)
    assert last_old is not None, f"{old} was never seen ready"
    context = record.describe_around(first_new.at, window_s=0.1)
    assert last_old.round < first_new.round and last_old.at < first_new.at, (
        f"{old} was still ready when {first_new.node} became ready:\n{context}"
    )
    assert record.overlapping_rounds() == []


async def test_an_isolated_active_node_stops_being_ready_first_takes_no_write_and_loses_nothing(
    proxied: ProxiedCluster,
) -> None:
    old = await proxied.active_node()
    token = proxied.tokens["client"]
    async with (
        ReadinessRecorder(proxied.probe_urls) as record,
        running(AckedWriter(list(proxied.urls.values()), token)) as writer,
    ):
        await writer.acked_after(5)
        cut_at = time.monotonic()
        await proxied.mesh.isolate(old)
        # Straight after the cut its lease may still run: the write must not commit anyway.
        minority_write = asyncio.create_task(write_straight_to(proxied.urls[old], token, "minority-write"))
        new = await proxied.active_node(FAILOVER_DEADLINE_S, not_=old)
        await writer.acked_after(5)  # the majority side takes writes
        status = await minority_write
        assert status is None or status >= 400, f"the isolated node acknowledged a write ({status})"
        await proxied.mesh.heal()
        await writer.acked_after(5)
        await record.next_round()

    assert new != old
    assert_handed_over_without_overlap(record, old, cut_at)
    last_old = record.last_ready(old)
    assert last_old is not None and last_old.at - cut_at < ELECTION_TIMEOUT_MIN_S + 1.0, (
        "the isolated node stayed ready long past its lease"
    )
    await all_caught_up(proxied, proxied.node_ids)
    for node in proxied.plan.nodes:
        on_disk = sessions_on_disk(node.data_dir)
        assert set(writer.acked) <= on_disk, f"{node.node_id} lacks acknowledged writes"
        assert "minority-write" not in on_disk, f"the write to the isolated node committed ({node.node_id})"


async def one_way_partition(proxied: ProxiedCluster, direction: str) -> None:
    """Cut the active node's inbound or outbound links; another node takes over with at most
    one ready node in every probe round, and after healing the cluster takes writes."""
    old = await proxied.active_node()
    links = proxied.mesh.inbound(old) if direction == "inbound" else proxied.mesh.outbound(old)
    async with (
        ReadinessRecorder(proxied.probe_urls) as record,
        running(AckedWriter(list(proxied.urls.values()), proxied.tokens["client"])) as writer,
    ):
        await writer.acked_after(3)
        cut_at = time.monotonic()
        await proxied.mesh.cut(links)
        new = await proxied.active_node(FAILOVER_DEADLINE_S, not_=old)
        await proxied.mesh.heal()
        await writer.acked_after(5)
        await record.next_round()

    assert new != old
    assert_handed_over_without_overlap(record, old, cut_at)
    await all_caught_up(proxied, proxied.node_ids)
    for node in proxied.plan.nodes:
        assert set(writer.acked) <= sessions_on_disk(node.data_dir), f"{node.node_id} lacks acknowledged writes"


async def test_an_active_node_that_sends_but_cannot_receive_gives_way(proxied: ProxiedCluster) -> None:
    # Its followers still hear its heartbeats, but it hears no acknowledgement: its lease
    # lapses and CheckQuorum steps it down; only then may the followers elect.
    await one_way_partition(proxied, "inbound")


async def test_an_active_node_that_receives_but_cannot_send_gives_way(proxied: ProxiedCluster) -> None:
    # Its followers hear nothing and elect; the new leader's heartbeats reach it and it steps down.
    await one_way_partition(proxied, "outbound")
