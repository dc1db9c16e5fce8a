"""A standby passes the console's calls (`Dex-Forward: active`) on to the active node.

Two of three nodes in one process: the standby, asked with the header, answers the active
node's sessions, takes a message for it, and relays its event stream; a call without the
header, a Worker's route and a bad token are not passed on; and when the active node is
gone the standby answers 503 `not_active`, not a hang or a 500.
"""

from __future__ import annotations

import aiohttp
import pytest

from dex_ha.local_cluster import ClusterPlan
from dex_ha.server.forwarding import FORWARD_HEADER
from tests.server.node_fixture import HttpApi, assert_error, cluster_plan, expect
from tests.server.test_not_active import two_of_three, wait_for_leader_url, wait_for_one_active

covers = pytest.mark.covers
FORWARD = {FORWARD_HEADER: "active"}


@pytest.fixture
def plan(tmp_path) -> ClusterPlan:
    return cluster_plan(tmp_path)


@covers("list_sessions", "get_session", "send_message", "session_events")
async def test_a_standby_forwards_the_consoles_calls_to_the_active_node(nodes, http, plan: ClusterPlan):
    servers = await two_of_three(nodes, plan)
    apis = {nid: http(server) for nid, server in servers.items()}
    active = await wait_for_one_active(apis)
    standby = apis["n2" if active == "n1" else "n1"]
    await wait_for_leader_url(standby, plan.node(active).url)
    await apis[active].create_session("support", "s-1")

    # Without the header: 503 not_active, as before (the SDKs follow leader_url themselves).
    assert_error(await standby.get("/v1/sessions"), 503, "not_active")
    # With it: the active node's answers, through the standby.
    page = expect(await standby.get("/v1/sessions", headers=FORWARD), 200)
    assert [s["session_id"] for s in page["sessions"]] == ["s-1"]
    sent = await standby.post("/v1/sessions/s-1/messages", {"text": "hi", "message_id": "m-1"}, headers=FORWARD)
    assert expect(sent, 202)["session_id"] == "s-1"
    snapshot = expect(await standby.get("/v1/sessions/s-1", headers=FORWARD), 200)
    assert snapshot["status"] == "running" and snapshot["history"][0]["text"] == "hi"
    # The active node's own errors come back as they are.
    assert_error(await standby.get("/v1/sessions/nope", headers=FORWARD), 404, "not_found")

    # The event stream, relayed as it comes.
    async with standby.session.get(
        f"{standby.url}/v1/sessions/s-1/events",
        headers={**standby.auth_header("client"), **FORWARD},
        timeout=aiohttp.ClientTimeout(total=15),
    ) as stream:
        standby.hits.append(("session_events", stream.status))
        assert stream.status == 200 and stream.content_type == "text/event-stream"
        seen = b""
        while b"event: message_received" not in seen:
            seen += await stream.content.readany()

    # Not passed on: a bad token (refused by the standby itself) and a Worker's route.
    bad_token = await standby.call("GET", "/v1/sessions", headers={"Authorization": "Bearer wrong", **FORWARD})
    assert_error(bad_token, 401)
    poll = await standby.post(
        "/v1/worker/poll", {"worker_id": "w", "agents": ["support"], "wait_ms": 0}, role="worker", headers=FORWARD
    )
    assert_error(poll, 503, "not_active")


async def test_a_standby_whose_active_node_is_gone_answers_not_active(nodes, http, plan: ClusterPlan):
    servers = await two_of_three(nodes, plan)
    apis = {nid: http(server) for nid, server in servers.items()}
    active = await wait_for_one_active(apis)
    standby_id = "n2" if active == "n1" else "n1"
    standby: HttpApi = apis[standby_id]
    await wait_for_leader_url(standby, plan.node(active).url)
    await servers[active].stop()

    reply = await standby.get("/v1/sessions", headers=FORWARD, timeout_s=10)
    assert_error(reply, 503, "not_active")
    assert reply.headers.get("Retry-After", "").isdigit()
