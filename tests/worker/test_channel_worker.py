"""The Worker SDK on the Worker channel, against a real NodeServer in this event loop: the
default transport, no polls and no heartbeats on the way, one asyncio task per attempt;
HTTP when asked, and no silent fallback when the channel is required."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dex_ha.client import DexClient
from dex_ha.client.connection import DexError
from dex_ha.server.node import NodeServer
from dex_ha.worker import Agent, ScriptedModel, ToolContext, Worker
from dex_ha.worker.runner import CHANNEL, HTTP
from harness.waiting import eventually
from tests.server.node_fixture import base_url, single_node_config, start_node
from tests.worker.fake_server import FakeServer

AGENT = "helper"
DEADLINE_S = 20.0


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[NodeServer]:
    server = await start_node(single_node_config(tmp_path / "n", auth=False))
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    async with FakeServer() as server:
        yield server


def script(request: Any) -> dict[str, Any]:
    last = request.history[-1]
    if last["type"] == "user":
        return {"content": "", "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {"q": last["text"]}}]}
    return {"content": f"found {last.get('output')}", "tool_calls": []}


def make_agent(seen: list[asyncio.Task[Any] | None]) -> Agent:
    agent = Agent(AGENT, model=ScriptedModel(script))

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, q: str) -> str:
        seen.append(asyncio.current_task())
        await ctx.heartbeat(looked=q)  # progress: a delta on the channel, not a request
        return q.upper()

    return agent


def requests_to(node: NodeServer, route: str) -> float:
    return sum(
        sample.value
        for metric in node.metrics.http_requests.collect()
        for sample in metric.samples
        if sample.labels.get("route") == route and sample.name.endswith("_total")
    )


async def run_turn(node: NodeServer, worker: Worker) -> dict[str, Any]:
    runner = asyncio.create_task(worker.run())
    try:
        async with DexClient(base_url(node)) as client:
            sid = (await client.create_session(AGENT)).session_id
            await client.send_message(sid, "abc")

            async def idle() -> bool:
                snap = await client.get_session(sid)
                return snap.status == "idle" and bool(snap.turns)

            await eventually(idle, "the turn to end", DEADLINE_S)
            return (await client.get_session(sid)).history[-1]
    finally:
        await worker.stop()
        await runner


async def test_a_turn_runs_on_the_channel_without_polls_or_heartbeats(node: NodeServer) -> None:
    seen: list[asyncio.Task[Any] | None] = []
    worker = Worker(base_url(node), agents=[make_agent(seen)], drain_timeout_s=2.0)
    last = await run_turn(node, worker)
    assert last["content"] == "found ABC"
    assert worker.completed == 3  # two model calls and the tool call, each acked
    assert requests_to(node, "worker_channel") == 1
    assert requests_to(node, "worker_poll") == requests_to(node, "task_heartbeat") == 0
    assert requests_to(node, "task_complete") == 0
    assert seen and seen[0] is not None and seen[0].get_name().startswith("dex-ha CallTool")  # the attempt's own task


async def test_transport_http_polls_as_before(node: NodeServer) -> None:
    seen: list[asyncio.Task[Any] | None] = []
    worker = Worker(base_url(node), agents=[make_agent(seen)], transport=HTTP, poll_wait_ms=500)
    assert (await run_turn(node, worker))["content"] == "found ABC"
    assert requests_to(node, "worker_channel") == 0
    assert requests_to(node, "worker_poll") >= 1 and requests_to(node, "task_complete") == 3


async def test_the_environment_chooses_the_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEX_HA_WORKER_TRANSPORT", "http")
    assert Worker("http://127.0.0.1:1", agents=[make_agent([])]).transport == HTTP
    monkeypatch.setenv("DEX_HA_WORKER_TRANSPORT", "pigeon")
    with pytest.raises(ValueError, match="transport"):
        Worker("http://127.0.0.1:1", agents=[make_agent([])])


async def test_a_server_without_a_channel_is_polled_unless_the_channel_is_required(fake: FakeServer) -> None:
    """An older server answers the upgrade 404: "auto" polls over HTTP, "channel" says why it cannot run."""
    worker = Worker(fake.url, agents=[make_agent([])], transport=CHANNEL, poll_wait_ms=100)
    with pytest.raises(DexError) as refused:
        await asyncio.wait_for(worker.run(), DEADLINE_S)
    assert refused.value.status == 404
    assert fake.polls == []
