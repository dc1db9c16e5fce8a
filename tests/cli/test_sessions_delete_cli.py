"""`dex-ha sessions delete` and `DexClient.delete` against a real node, and retention on a
real node: an ended session past `retention_days` is deleted by the active node."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dex_ha.cli.main import build_parser
from dex_ha.cli.sessions import run
from dex_ha.client import DexClient, DexError
from harness.waiting import eventually
from tests.server.node_fixture import single_node_config, start_node


async def test_delete_refuses_a_running_session_and_deletes_an_ended_one(tmp_path: Path) -> None:
    node = await start_node(single_node_config(tmp_path / "node", auth=False))
    try:
        async with DexClient(f"http://127.0.0.1:{node.http_port}") as client:
            await client.create_session("helper", session_id="s-1")
            await client.send_message("s-1", "hello")  # no Worker: the turn stays running
            delete = build_parser().parse_args(["sessions", "delete", "s-1"])
            with pytest.raises(DexError) as refused:
                await run(delete, client)
            assert refused.value.status == 409 and "cancel" in str(refused.value)

            await client.cancel("s-1")
            events = client.events("s-1")
            first = await asyncio.wait_for(anext(events), 5)  # the stream is open
            assert first.type == "session_created"
            assert await run(delete, client) == "session s-1: deleted"
            rest = [event.type async for event in events]  # ends by itself after the deletion
            assert rest[-1] == "session_deleted"

            with pytest.raises(DexError) as gone:
                await client.delete("s-1")
            assert gone.value.status == 404
    finally:
        await node.stop()


async def test_retention_deletes_ended_sessions_past_retention_days_and_keeps_the_rest(tmp_path: Path) -> None:
    retention_days = 2.0 / 86_400  # two seconds
    config = single_node_config(
        tmp_path / "node", auth=False, retention_days=retention_days, retention_check_interval_ms=100
    )
    node = await start_node(config)
    try:
        async with DexClient(f"http://127.0.0.1:{node.http_port}") as client:
            await client.create_session("helper", session_id="ended")
            await client.create_session("helper", session_id="running")
            await client.send_message("running", "hello")  # no Worker: it stays running

            async def ended_is_gone() -> bool:
                return node.replica.reads.session_namespace("ended") is None

            await eventually(ended_is_gone, deadline_s=15, what="retention to delete the ended session")
            assert node.replica.reads.session_namespace("running") is not None  # a running turn stays
            assert node.replica.reads.stats()["sessions_deleted"] == {"expired": 1}
    finally:
        await node.stop()
