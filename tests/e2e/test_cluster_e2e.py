"""End to end on a three-node cluster started with `dex-ha cluster up` (real processes),
reached two ways: the SDKs given the three node URLs, and one readiness-following address
(HAProxy with the shipped deploy/haproxy.cfg).

- A SIGKILL of the active node while a tool runs: a standby takes over, the attempt that
  the dead node handed out fails (takeover), the same call runs again with the same
  idempotency key (row R04), and the session goes on; the Worker and the client were
  given all three URLs.
- A planned step down while a tool runs: the running attempt finishes within the drain
  timeout, another node becomes active, and no attempt failed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dex_ha.client import DexClient, Session, SessionEvent
from dex_ha.local_cluster import node_process_alive
from dex_ha.worker import Worker
from harness.cluster_process import LocalCluster
from harness.haproxy_process import haproxy_binary, haproxy_in_front_of
from harness.waiting import eventually
from tests.e2e.conftest import running
from tests.support.failover_agent import AGENT, Ledger, attempts_of, make_agent

DEADLINE_S = 45.0


@pytest.fixture(params=["node_urls", "haproxy"])
async def addresses(request: pytest.FixtureRequest, cluster: LocalCluster, tmp_path: Path) -> AsyncIterator[list[str]]:
    if request.param == "node_urls":
        yield list(cluster.urls.values())
        return
    if haproxy_binary() is None:
        pytest.skip("haproxy is not installed (scripts/test installs it with apt-get)")
    with haproxy_in_front_of(cluster.urls, cluster.probe_ports, tmp_path) as proxy:
        yield [proxy.url]


@pytest.fixture
async def stack(addresses: list[str], cluster: LocalCluster) -> AsyncIterator[tuple[DexClient, Ledger]]:
    ledger = Ledger()
    urls = addresses
    worker = Worker(
        urls,
        token=cluster.tokens["worker"],
        agents=[make_agent(ledger)],
        poll_wait_ms=2_000,
        heartbeat_interval_s=0.2,
        drain_timeout_s=1.0,
    )
    async with running(worker), DexClient(urls, token=cluster.tokens["client"]) as client:
        yield client, ledger


async def read_until(client: DexClient, sid: str, last_type: str, sink: list[SessionEvent]) -> None:
    async for event in client.events(sid):
        sink.append(event)
        if event.type == last_type:
            return


async def start_a_turn(client: DexClient, ledger: Ledger, cluster: LocalCluster, text: str) -> tuple[str, str]:
    """A session whose turn has its tool running now; (session id, the active node)."""
    sid = (await client.create_session(AGENT)).session_id
    await client.send_message(sid, text)
    await asyncio.wait_for(ledger.first_attempt_running.wait(), DEADLINE_S)
    return sid, await cluster.active_node()


def assert_completed_without_a_failed_attempt(snapshot: Session) -> None:
    assert snapshot.turns[-1].status == "completed"
    every_attempt = [a for c in snapshot.tool_calls for s in c.steps for a in s.attempts]
    assert every_attempt and all(a.status == "completed" for a in every_attempt)


async def test_a_session_goes_on_through_a_sigkill_of_the_active_node(
    cluster: LocalCluster, stack: tuple[DexClient, Ledger]
) -> None:
    client, ledger = stack
    sid, old = await start_a_turn(client, ledger, cluster, "failover")
    events: list[SessionEvent] = []
    reader = asyncio.create_task(read_until(client, sid, "turn_completed", events))
    await eventually(lambda: any(e.type == "attempt_started" for e in events), "the stream to be open")
    killed_at = time.monotonic()
    cluster.kill(old)
    new = await cluster.active_node(not_=old)
    failover_s = time.monotonic() - killed_at
    assert new != old

    final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
    assert final.turns[-1].status == "completed"
    # The event stream resumed on the new active node: nothing twice, nothing missed.
    await asyncio.wait_for(reader, DEADLINE_S)
    fresh: list[SessionEvent] = []
    await read_until(client, sid, "turn_completed", fresh)  # the whole committed history, read anew
    assert [e.id for e in events if e.id is not None] == [e.id for e in fresh]
    assert {"attempt_failed", "timer_fired", "turn_completed"} <= {e.type for e in events}
    call = final.tool_call("c-failover")
    assert call.status == "succeeded" and call.output == "stored failover"
    attempts = attempts_of(final.raw, "c-failover")
    assert [a["status"] for a in attempts] == ["failed", "completed"]
    assert "lost its lease" in attempts[0]["error"]  # failed by the new node's takeover
    assert attempts[1]["term"] > attempts[0]["term"]
    # The ledger (outside the server): the call ran twice, with the same idempotency key.
    assert ledger.runs == [("slow_put", f"{sid}:c-failover", 1), ("slow_put", f"{sid}:c-failover", 2)]
    # The Worker stops the stale attempt once a heartbeat reaches the new node (409).
    await eventually(
        lambda: ledger.cancelled == [1], "the Worker to stop the attempt the new active node had failed", 10
    )
    assert failover_s < 10, f"failover took {failover_s:.1f} s"


async def test_step_down_moves_the_active_node_without_failing_a_running_attempt(
    cluster: LocalCluster, stack: tuple[DexClient, Ledger]
) -> None:
    client, ledger = stack
    sid, old = await start_a_turn(client, ledger, cluster, "deploy")
    done = await asyncio.to_thread(
        cluster.run_cli,
        "step-down",
        "--url",
        cluster.urls[old],
        f"--token={cluster.tokens['admin']}",
        "--drain-timeout-ms",
        "20000",
    )
    assert done.returncode == 0, f"step-down failed:\n{done.stdout}\n{done.stderr}"
    new = await cluster.active_node(not_=old)
    assert new != old

    final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
    assert_completed_without_a_failed_attempt(final)
    assert attempts_of(final.raw, "c-deploy")[0]["status"] == "completed"
    assert [r[2] for r in ledger.runs] == [1]  # the tool ran once


async def test_sigterm_on_the_active_node_drains_hands_over_and_exits(
    cluster: LocalCluster, stack: tuple[DexClient, Ledger]
) -> None:
    """A deploy's graceful stop: the running attempt finishes on the draining node, another
    node becomes active, the old process exits; no attempt failed, the tool ran once."""
    client, ledger = stack
    sid, old = await start_a_turn(client, ledger, cluster, "deploy")
    pid = cluster.pid(old)
    os.kill(pid, signal.SIGTERM)
    new = await cluster.active_node(not_=old)
    assert new != old

    final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
    assert_completed_without_a_failed_attempt(final)
    assert [r[2] for r in ledger.runs] == [1]
    await eventually(lambda: not node_process_alive(pid), "the old active node to exit after its drain", 20)
    log = (cluster.dir / f"{old}.log").read_text()
    assert "graceful stop" in log and "hands the leadership" in log
