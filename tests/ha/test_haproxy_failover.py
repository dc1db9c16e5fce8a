"""HAProxy with the shipped deploy/haproxy.cfg in front of three real nodes: the Worker and
the clients know only HAProxy's address. The active node is SIGKILLed while a tool runs
and while a writer writes; the turn completes (the killed attempt fails NOT_COMPLETED and
the tool runs again with the same idempotency key), no acknowledged write is lost, and the
readiness record (every node every 10 ms, as HAProxy's checks ask it) never shows two
ready nodes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dex_ha.client import DexClient
from dex_ha.worker import Worker
from harness.haproxy_process import HAProxyProcess, haproxy_binary, haproxy_in_front_of
from harness.proxied_cluster import ProxiedCluster
from harness.readiness_record import ReadinessRecorder
from harness.scenario import AckedWriter, all_caught_up, sessions_on_disk
from tests.e2e.conftest import running
from tests.support.failover_agent import AGENT, Ledger, attempts_of, make_agent

DEADLINE_S = 45.0
TURN_AFTER_KILL_S = 15.0  # generous: ~1 s election + HAProxy's checks + retries, on a busy machine


@pytest.fixture
async def haproxy(proxied: ProxiedCluster, tmp_path: Path) -> AsyncIterator[HAProxyProcess]:
    if haproxy_binary() is None:
        pytest.skip("haproxy is not installed (.ci/run installs it with apt-get)")
    with haproxy_in_front_of(proxied.urls, proxied.probe_ports, tmp_path) as proxy:
        yield proxy


async def test_a_turn_completes_through_haproxy_when_the_active_node_dies_mid_tool(
    proxied: ProxiedCluster, haproxy: HAProxyProcess
) -> None:
    ledger = Ledger()
    only_haproxy = [haproxy.url]
    worker = Worker(
        only_haproxy,
        token=proxied.tokens["worker"],
        agents=[make_agent(ledger)],
        poll_wait_ms=2_000,
        heartbeat_interval_s=0.2,
        drain_timeout_s=1.0,
    )
    async with (
        running(worker),
        DexClient(only_haproxy, token=proxied.tokens["client"]) as client,
        ReadinessRecorder(proxied.probe_urls) as record,
        running(AckedWriter(only_haproxy, proxied.tokens["client"])) as writer,
    ):
        sid = (await client.create_session(AGENT)).session_id
        await client.send_message(sid, "failover")
        await asyncio.wait_for(ledger.first_attempt_running.wait(), DEADLINE_S)
        old = await proxied.active_node()
        killed_at = time.monotonic()
        proxied.kill(old)
        final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
        turn_done_s = time.monotonic() - killed_at
        await writer.acked_after(3)
        await record.next_round()

    assert final.turns[-1].status == "completed"
    attempts = attempts_of(final.raw, "c-failover")
    assert [(a["status"], a["attempt_progress"]) for a in attempts] == [
        ("failed", "NOT_COMPLETED"),
        ("completed", None),
    ]
    assert ledger.runs == [("slow_put", f"{sid}:c-failover", 1), ("slow_put", f"{sid}:c-failover", 2)]
    assert turn_done_s < TURN_AFTER_KILL_S, f"the turn completed {turn_done_s:.1f} s after the kill"
    assert record.overlapping_rounds() == []
    survivors = [n for n in proxied.node_ids if n != old]
    await all_caught_up(proxied, survivors)
    for node_id in survivors:
        assert set(writer.acked) <= sessions_on_disk(proxied.plan.node(node_id).data_dir)
