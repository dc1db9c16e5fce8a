"""Leader services beyond the routes: start_to_close timeouts and timers
that came due while no node was active."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from dex_ha.engine import StartQueuedAttempts
from dex_ha.server.leader import HANDOUTS_PER_PROPOSAL
from dex_ha.server.node import NodeServer
from harness.waiting import eventually
from tests.server.node_fixture import (
    call_view,
    single_node_config,
    start_node,
    tool,
    tool_call,
)


async def test_an_attempt_past_its_start_to_close_fails_even_with_heartbeats(nodes, http, tmp_path: Path) -> None:
    node = await nodes(single_node_config(tmp_path / "node"))
    api = http(node)
    await api.start_turn_with_tool_calls(
        "slow", "s1", [tool("crawl", "read", start_to_close_ms=300)], [tool_call("c1", "crawl")]
    )
    task = await api.poll_one("slow")
    assert task["deadline_ms"] is not None
    beating = True

    async def heartbeat_forever() -> None:  # the Worker is alive; only the deadline can end it
        while beating:
            await api.post(f"/v1/worker/tasks/{task['task_token']}/heartbeat", {"worker_id": "worker-1"}, role="worker")
            await asyncio.sleep(0.05)

    beater = asyncio.create_task(heartbeat_forever())
    try:

        async def first_attempt_failed() -> dict[str, Any] | None:
            attempts = [a for s in call_view(await api.snapshot("s1"), "c1")["steps"] for a in s["attempts"]]
            return attempts[0] if attempts and attempts[0]["status"] == "failed" else None

        attempt = await eventually(first_attempt_failed, deadline_s=10, what="the attempt to time out")
    finally:
        beating = False
        await beater
    assert "start_to_close" in attempt["error"] and attempt["attempt_progress"] == "NOT_COMPLETED"
    metrics = (await api.get("/metrics", role=None)).body
    assert 'dex_attempts_failed_total{kind="CallTool",reason="start_to_close"} 1.0' in metrics


async def test_a_timer_that_came_due_while_the_node_was_down_fires_at_once(http, tmp_path: Path) -> None:
    config = single_node_config(tmp_path / "node")
    node = await start_node(config)
    try:
        api = http(node)
        await api.start_turn_with_tool_calls("waiter", "s1", [], [tool_call("c1", "sleep", ms=500)])
        timer = (await api.snapshot("s1"))["pending_timers"][0]
    finally:
        await node.stop()
    # Let the timer come due during the outage: a wait for wall-clock time, not for a state.
    await asyncio.sleep(max(0.0, (timer["due_at"] + 200) / 1000 - time.time()))
    restarted: NodeServer = await start_node(config)
    try:
        api = http(restarted)
        started = time.monotonic()

        async def sleep_call_done() -> bool:
            return call_view(await api.snapshot("s1"), "c1")["status"] == "succeeded"

        await eventually(sleep_call_done, deadline_s=10, what="the overdue timer to fire")
        assert time.monotonic() - started < 3.0, "an overdue timer must fire right after the takeover"
        assert (await api.snapshot("s1"))["pending_timers"] == []
    finally:
        await restarted.stop()


async def test_two_hundred_waiting_polls_get_exactly_one_task_each(nodes, http, tmp_path: Path) -> None:
    """Every queued step is handed out once, and every waiting poll gets its one task:
    no poll is skipped and none gets a step twice, however many wait at once."""
    node = await nodes(single_node_config(tmp_path / "node"))
    api = http(node)
    await api.register_agent("many", [tool("lookup")])
    count = 200
    polls = [
        asyncio.create_task(node.leader.poll(f"worker-{i}", ["many"], max_tasks=1, wait_ms=30_000))
        for i in range(count)
    ]
    await eventually(lambda: _polls_waiting(node, count), deadline_s=10, what=f"{count} polls to wait", interval_s=0.01)

    async def queue_one_step(i: int) -> None:
        await api.create_session("many", f"s{i}")
        await api.send_message(f"s{i}", "hello")

    await asyncio.gather(*(queue_one_step(i) for i in range(count)))
    async with asyncio.timeout(30):
        answers = await asyncio.gather(*polls)

    assert [len(tasks) for tasks in answers] == [1] * count
    handed_out = [tasks[0] for tasks in answers]
    assert len({t["step_id"] for t in handed_out}) == count, "a step was handed out twice"
    assert {t["session_id"] for t in handed_out} == {f"s{i}" for i in range(count)}
    assert node.leader.waiting_polls() == 0


async def test_a_poll_for_many_tasks_is_handed_out_in_entries_of_a_bounded_size(nodes, http, tmp_path: Path) -> None:
    """One poll takes 100 queued steps: it gets all 100 (each once), committed as entries of
    at most HANDOUTS_PER_PROPOSAL hand-outs, so that no one entry keeps the Raft loop
    applying for long."""
    node = await nodes(single_node_config(tmp_path / "node"))
    api = http(node)
    await api.register_agent("many", [tool("lookup")])
    count = 100
    for i in range(count):
        await api.create_session("many", f"s{i}")
        await api.send_message(f"s{i}", "hello")
    leader = node.leader
    assert leader is not None
    proposed: list[Any] = []
    propose = leader._propose

    async def recording_propose(cmd: Any) -> Any:
        proposed.append(cmd)
        return await propose(cmd)

    leader._propose = recording_propose
    async with asyncio.timeout(30):
        tasks = await leader.poll("worker-1", ["many"], max_tasks=count, wait_ms=10_000)
    assert len({t["step_id"] for t in tasks}) == count
    sizes = [len(cmd.token_secrets) for cmd in proposed if isinstance(cmd, StartQueuedAttempts)]
    assert sizes == [HANDOUTS_PER_PROPOSAL] * (count // HANDOUTS_PER_PROPOSAL) + [count % HANDOUTS_PER_PROPOSAL]


async def test_a_poll_gets_a_step_when_a_result_took_the_one_it_was_counted(nodes, http, tmp_path: Path) -> None:
    """Two steps queued; the leader matches a poll for one. Before the poll's hand-out
    applies, another hand-out (as a result's eager dispatch does) takes the head of the
    queue: the poll still gets the other step, from its one proposal. (A hand-out that named
    the step it counted missed it; under a backlog every such hand-out missed, and polls
    waited out their wait while hundreds of steps stayed queued.)"""
    node = await nodes(single_node_config(tmp_path / "node"))
    api = http(node)
    await api.register_agent("race", [tool("lookup")])
    for sid in ("s1", "s2"):
        await api.create_session("race", sid)
        await api.send_message(sid, "hello")
    leader = node.leader
    assert leader is not None
    propose = leader._propose
    poll_proposals: list[StartQueuedAttempts] = []
    taken_first: list[str] = []

    async def a_result_applies_first(cmd: Any) -> Any:
        if isinstance(cmd, StartQueuedAttempts) and cmd.worker_id == "worker-1":
            poll_proposals.append(cmd)
            if not taken_first:
                other = StartQueuedAttempts(
                    at=cmd.at, worker_id="worker-2", term=cmd.term, agents=cmd.agents, token_secrets=["ab" * 16]
                )
                taken_first.extend(s.session_id for s in (await propose(other)).value.started)
        return await propose(cmd)

    leader._propose = a_result_applies_first
    async with asyncio.timeout(10):
        tasks = await leader.poll("worker-1", ["race"], max_tasks=1, wait_ms=5_000)
    assert taken_first == ["s1"]
    assert [t["session_id"] for t in tasks] == ["s2"]
    assert len(poll_proposals) == 1


async def _polls_waiting(node: NodeServer, n: int) -> bool:
    return node.leader is not None and node.leader.waiting_polls() == n
