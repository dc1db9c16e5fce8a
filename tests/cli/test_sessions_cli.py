"""`dex-ha sessions list` and `show` against the fake cluster of the Client SDK tests: the
filters reach the server as query parameters, and the typed answers print as tables;
`cancel` against a real node."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dex_ha.cli.main import build_parser
from dex_ha.cli.sessions import run
from dex_ha.client import DexClient
from tests.client.fake_server import FakeCluster, FakeNode, start_nodes
from tests.server.node_fixture import single_node_config, start_node


@pytest.fixture
async def node() -> AsyncIterator[FakeNode]:
    nodes = await start_nodes(FakeCluster(), "active")
    try:
        yield nodes[0]
    finally:
        for n in nodes:
            await n.stop()


async def test_list_sends_the_approval_and_outcome_filters_and_prints_the_page(node: FakeNode) -> None:
    async with DexClient(node.url) as client:
        await client.create_session("ops", session_id="s-1")
        args = build_parser().parse_args(
            ["sessions", "list", "--awaiting-approval", "--outcome-unknown", "--limit", "5"]
        )
        text = await run(args, client)
        assert node.requests_to("/v1/sessions")[-1].query == {
            "limit": "5",
            "awaiting_approval": "true",
            "outcome_unknown": "true",
        }
        assert text.splitlines()[1].split()[:3] == ["s-1", "ops", "idle"]

        plain = build_parser().parse_args(["sessions", "list", "--json"])
        answer = json.loads(await run(plain, client))
        assert "awaiting_approval" not in node.requests_to("/v1/sessions")[-1].query  # no flag: no filter
        assert answer == {"sessions": [json.loads(json.dumps(node.cluster.sessions["s-1"]))], "next_after": None}


async def test_show_prints_the_snapshot_and_json_prints_it_as_received(node: FakeNode) -> None:
    async with DexClient(node.url) as client:
        await client.create_session("ops", session_id="s-1")
        node.cluster.sessions["s-1"]["pending_approvals"] = [
            {"call_id": "c-1", "name": "refund", "arguments": {"order": "A17"}, "requested_at": 0}
        ]
        node.cluster.sessions["s-1"]["new_field"] = "kept"
        text = await run(build_parser().parse_args(["sessions", "show", "s-1"]), client)
        assert text.startswith("session s-1  agent ops  status idle")
        assert "pending approvals (dex-ha sessions approve|deny s-1 CALL):" in text
        assert "c-1   refund" in text
        raw = json.loads(await run(build_parser().parse_args(["sessions", "show", "s-1", "--json"]), client))
        assert raw["new_field"] == "kept"


def test_every_sessions_subcommand_takes_a_namespace() -> None:
    for argv in (["list"], ["show", "s1"], ["approve", "s1", "c1"], ["send", "s1", "hi"], ["cancel", "s1"]):
        args = build_parser().parse_args(["sessions", *argv, "--namespace", "team-a"])
        assert args.namespace == "team-a"
    assert build_parser().parse_args(["sessions", "list"]).namespace is None  # DexClient reads DEX_HA_NAMESPACE


async def test_cancel_cancels_the_running_turn_and_says_when_none_was_running(tmp_path: Path) -> None:
    node = await start_node(single_node_config(tmp_path / "node", auth=False))
    try:
        async with DexClient(f"http://127.0.0.1:{node.http_port}") as client:
            await client.create_session("helper", session_id="s-1")
            await client.send_message("s-1", "hello")  # no Worker: the turn stays running
            running = (await client.get_session("s-1")).raw["current_turn"]["turn_id"]

            args = build_parser().parse_args(["sessions", "cancel", "s-1", "--reason", "operator"])
            assert await run(args, client) == f"turn {running} of s-1: cancelled"
            after = (await client.get_session("s-1")).raw
            assert after["current_turn"] is None and after["turns"][-1]["status"] == "cancelled", after["turns"]

            again = build_parser().parse_args(["sessions", "cancel", "s-1"])
            assert await run(again, client) == "s-1: no turn was running, nothing cancelled"
    finally:
        await node.stop()


async def test_show_prints_the_compaction_summary_first_and_waiting_messages_last(node: FakeNode) -> None:
    async with DexClient(node.url) as client:
        await client.create_session("ops", session_id="s-1")
        session = node.cluster.sessions["s-1"]
        session["summary"] = {"upto_seq": 40, "at": 0, "text": "The user asked for refunds A1 to A9."}
        session["history"] = [
            {"seq": 41, "type": "user", "text": "and A10?"},
            {
                "seq": 42,
                "type": "tool_result",
                "call_id": "c9",
                "name": "refund",
                "status": "failed",
                "error": "x" * 2000,
            },
        ]
        session["waiting_messages"] = [{"text": "hurry", "mode": "steer", "at": 0}]
        text = await run(build_parser().parse_args(["sessions", "show", "s-1"]), client)
    conversation = text.split("conversation (2 items):\n")[1]
    assert conversation.startswith(
        "summary of the items up to #40 (1970-01-01 00:00:00Z):\n  The user asked for refunds A1 to A9.\n"
        "#41 user:\n  and A10?\n#42 tool refund (call c9) failed, error: xxx"
    )
    assert "x" * 999 + "…" in conversation and "x" * 1000 not in conversation  # cut, --json has it all
    assert "waiting (steer) since 1970-01-01 00:00:00Z, not in a turn yet:\n  hurry" in conversation
