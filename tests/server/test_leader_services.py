"""Leader services beyond the routes: start_to_close timeouts and timers
that came due while no node was active."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

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
