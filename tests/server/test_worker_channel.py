"""The Worker channel (`GET /v1/worker/channel`) against a real NodeServer, spoken raw
(aiohttp WebSocket, the frames of docs/worker-protocol.md), not through the SDK."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest

from dex_ha.server.node import NodeServer
from tests.server.conftest import HttpFactory, NodeFactory
from tests.server.node_fixture import HttpApi, expect, model_result, single_node_config

covers = pytest.mark.covers
FRAME_DEADLINE_S = 10.0


async def receive(ws: aiohttp.ClientWebSocketResponse, kind: str, encoding: str = "msgpack") -> dict[str, Any]:
    """The next frame of type `kind` (others are skipped), within a deadline."""
    async with asyncio.timeout(FRAME_DEADLINE_S):
        while True:
            msg = await ws.receive()
            assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), msg
            frame = json.loads(msg.data) if encoding == "json" else msgpack.unpackb(msg.data)
            if frame["type"] == kind:
                return frame


async def send(ws: aiohttp.ClientWebSocketResponse, frame: dict[str, Any], encoding: str = "msgpack") -> None:
    if encoding == "json":
        await ws.send_str(json.dumps(frame))
    else:
        await ws.send_bytes(msgpack.packb(frame))


async def a_turn(api: HttpApi, *sessions: str) -> None:
    await api.register_agent("helper", [])
    for sid in sessions:
        await api.create_session("helper", sid)
        await api.send_message(sid, "hi")


@covers("worker_channel")
@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_credit_brings_tasks_and_a_results_frame_commits_them_with_an_ack_each(
    api: HttpApi, encoding: str
) -> None:
    await a_turn(api, "s1", "s2")
    ws = await api.open_channel("helper", worker_id="w1", encoding=encoding)
    try:
        welcome = await receive(ws, "welcome", encoding)
        assert welcome["protocol"] == 1 and welcome["worker_id"] == "w1" and welcome["grace_ms"] == 1000
        await send(ws, {"type": "credit", "credit": 2}, encoding)
        tasks = (await receive(ws, "tasks", encoding))["tasks"]
        while len(tasks) < 2:
            tasks += (await receive(ws, "tasks", encoding))["tasks"]
        assert sorted(t["session_id"] for t in tasks) == ["s1", "s2"] and {t["kind"] for t in tasks} == {"RunModel"}
        reports = [
            {"task_token": tasks[0]["task_token"], "outcome": "complete", "result": model_result("done")},
            {"task_token": tasks[1]["task_token"], "outcome": "fail", "error": "boom", "retryable": False},
            {"task_token": "not-a-token", "outcome": "complete", "result": model_result("x")},
        ]
        await send(ws, {"type": "results", "results": reports, "ack": 1}, encoding)
        acks = (await receive(ws, "acks", encoding))["acks"]
        assert [a["status"] for a in acks] == [200, 200, 404]
        assert [a["task_token"] for a in acks] == [r["task_token"] for r in reports]
        # The same complete again (a retry after a lost ack) is 200; the fail again is 409.
        await send(ws, {"type": "results", "results": reports[:2]}, encoding)
        assert [a["status"] for a in (await receive(ws, "acks", encoding))["acks"]] == [200, 409]
    finally:
        await ws.close()
    done = {t["session_id"]: t for t in tasks}
    assert (await api.snapshot(done[tasks[0]["session_id"]]["session_id"]))["status"] == "idle"
    failed = await api.snapshot(tasks[1]["session_id"])
    assert failed["turns"][-1]["status"] == "failed"


@covers("worker_channel")
async def test_a_report_on_another_workers_attempt_is_acked_403(api: HttpApi) -> None:
    await a_turn(api, "s1")
    task = await api.poll_one("helper", worker_id="http-worker")
    ws = await api.open_channel("helper", worker_id="w1")
    try:
        await receive(ws, "welcome")
        report = {"task_token": task["task_token"], "outcome": "complete", "result": model_result("x")}
        await send(ws, {"type": "results", "results": [report]})
        [ack] = (await receive(ws, "acks"))["acks"]
        assert ack["status"] == 403 and ack["error"] == "forbidden" and "worker_id" in ack["message"]
    finally:
        await ws.close()


@covers("worker_channel")
async def test_the_result_frame_spends_the_credit_on_the_next_step_in_the_same_entry(
    api: HttpApi, node: NodeServer
) -> None:
    """A model answer with a tool call: the CallTool step comes back after the ack, with
    no poll (one entry for the result and the hand-out)."""
    await api.register_agent("helper", [{"name": "lookup", "effect": "read"}])
    await api.create_session("helper", "s1")
    await api.send_message("s1", "hi")
    ws = await api.open_channel("helper", worker_id="w1")
    try:
        await receive(ws, "welcome")
        await send(ws, {"type": "credit", "credit": 1})
        [task] = (await receive(ws, "tasks"))["tasks"]
        applied = node.replica.reads.applied_index()
        call = {"id": "c1", "name": "lookup", "arguments": {}}
        report = {"task_token": task["task_token"], "outcome": "complete", "result": model_result("", [call])}
        await send(ws, {"type": "results", "results": [report], "credit": 1})
        [next_task] = (await receive(ws, "tasks"))["tasks"]
        assert next_task["kind"] == "CallTool" and next_task["input"]["call_id"] == "c1"
        assert node.replica.reads.applied_index() == applied + 1  # one entry: the result and the hand-out
    finally:
        await ws.close()


@covers("worker_channel")
async def test_a_frame_that_breaks_the_contract_closes_the_channel_naming_the_field(api: HttpApi) -> None:
    ws = await api.open_channel("helper", worker_id="w1")
    await receive(ws, "welcome")
    await send(ws, {"type": "credit", "credit": "lots"})
    msg = await ws.receive(timeout=FRAME_DEADLINE_S)
    assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 4400
    assert msg.extra is not None and "credit" in msg.extra  # the close reason names the field


async def test_a_plain_get_is_told_to_upgrade(api: HttpApi) -> None:
    reply = await api.call("GET", "/v1/worker/channel", role="worker", params={"worker_id": "w1", "agents": "helper"})
    assert reply.status == 400 and "WebSocket" in reply.error_message()


async def test_bad_parameters_are_refused_before_the_upgrade(api: HttpApi) -> None:
    reply = await api.call("GET", "/v1/worker/channel", role="worker", params={"worker_id": "w1", "agents": "a,,b"})
    assert reply.status == 400 and "agents" in reply.error_message()
    reply = await api.call("GET", "/v1/worker/channel", role="client", params={"worker_id": "w1", "agents": "a"})
    assert reply.status == 403


async def test_a_closed_channel_fails_its_attempts_after_the_grace_and_a_reconnect_in_time_keeps_them(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path
) -> None:
    node = await nodes(replace(single_node_config(tmp_path / "n"), worker_channel_grace_ms=300))
    api = http(node)
    await a_turn(api, "s1", "s2")
    ws = await api.open_channel("helper", worker_id="w1")
    await receive(ws, "welcome")
    await send(ws, {"type": "credit", "credit": 2})
    tasks = (await receive(ws, "tasks"))["tasks"]
    while len(tasks) < 2:
        tasks += (await receive(ws, "tasks"))["tasks"]
    await ws.close()
    # Back within the grace: the new channel holds both attempts, and delivers one.
    ws = await api.open_channel("helper", worker_id="w1")
    welcome = await receive(ws, "welcome")
    assert sorted(welcome["held"]) == sorted(t["task_token"] for t in tasks)
    report = {"task_token": tasks[0]["task_token"], "outcome": "complete", "result": model_result("ok")}
    await send(ws, {"type": "results", "results": [report]})
    assert [a["status"] for a in (await receive(ws, "acks"))["acks"]] == [200]
    closed_at = time.monotonic()
    await ws.close()
    # Gone for good: the other attempt fails once the grace is over, long before any heartbeat timeout.
    other = tasks[1]["session_id"]
    while True:
        attempts = (await api.snapshot(other))["current_turn"]["steps"][0]["attempts"]
        if attempts[0]["status"] != "running":
            break
        assert time.monotonic() - closed_at < 10, attempts
        await asyncio.sleep(0.05)
    assert attempts[0]["status"] == "failed" and time.monotonic() - closed_at >= 0.3
    assert expect(await api.get(f"/v1/sessions/{tasks[0]['session_id']}"), 200)["status"] == "idle"
