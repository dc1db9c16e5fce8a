"""Nodes that are not the active node: every active-only route answers 503
`not_active` with `leader_url` and Retry-After; /readyz is 503; /livez and /v1/cluster are
200. A 2-of-3 cluster in one process elects exactly one active node, the other points to it,
and a planned step down moves the active role to the other node.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from dex_ha.local_cluster import ClusterPlan
from dex_ha.server.api_spec import ROUTES, RouteSpec
from dex_ha.server.node import NodeServer
from harness.waiting import eventually
from tests.server.node_fixture import (
    HttpApi,
    assert_error,
    cluster_plan,
    concrete_path,
    expect,
    node_config,
    role_for,
    start_node,
)

covers = pytest.mark.covers

ACTIVE_ONLY = [route for route in ROUTES if route.active_only]
ELECTION_DEADLINE_S = 15.0


async def request_route(api: HttpApi, route: RouteSpec) -> Any:
    body: dict[str, Any] | None = {} if route.body is not None else None  # an empty JSON body where one is taken
    return await api.call(route.method, concrete_path(route), role=role_for(route), json_body=body)


def assert_not_active(reply: Any, route_name: str, leader_url: str | None) -> None:
    assert reply.status == 503, f"{route_name}: expected 503, got {reply.status}: {reply.body}"
    assert reply.body["error"] == "not_active" and isinstance(reply.body["message"], str), reply.body
    assert "leader_url" in reply.body and reply.body["leader_url"] == leader_url, (route_name, reply.body)
    assert reply.headers.get("Retry-After", "").isdigit(), f"{route_name}: no Retry-After: {reply.headers}"


@pytest.fixture
def plan(tmp_path) -> ClusterPlan:
    return cluster_plan(tmp_path)


@covers("cluster", "livez")
async def test_a_node_that_cannot_win_an_election_serves_no_v1_route(nodes, http, plan: ClusterPlan):
    node: NodeServer = await nodes(node_config(plan, "n1"), wait_ready=False)  # n2 and n3 never start
    api = http(node)

    # A fresh voter whose peers never answer waits for them: it neither votes nor campaigns.
    async def serving_but_not_active() -> bool:
        view = expect(await api.get("/v1/cluster", role="client"), 200)
        return view["role"] in ("standby", "candidate")

    await eventually(serving_but_not_active, deadline_s=ELECTION_DEADLINE_S, what="n1 to serve /v1/cluster")
    for route in ACTIVE_ONLY:
        assert_not_active(await request_route(api, route), route.name, leader_url=None)

    ready = await api.get("/readyz", role=None)
    assert_error(ready, 503, "not_ready")
    assert expect(await api.get("/livez", role=None), 200)["node_id"] == "n1"
    view = expect(await api.get("/v1/cluster", role="admin"), 200)
    assert view["node_id"] == "n1" and view["role"] != "active" and view["leader_id"] is None
    assert {m["id"] for m in view["members"]} == {"n1", "n2", "n3"}
    metrics = await api.get("/metrics", role=None)
    assert metrics.status == 200 and "\ndex_active 0.0\n" in metrics.body


async def wait_for_one_active(apis: dict[str, HttpApi]) -> str:
    """The id of the one node whose /readyz is 200 (never two at once)."""

    async def the_ready_node() -> str | None:
        ready = [nid for nid, api in apis.items() if (await api.get("/readyz", role=None)).status == 200]
        assert len(ready) <= 1, f"two active nodes at once: {ready}"
        return ready[0] if ready else None

    return await eventually(the_ready_node, deadline_s=ELECTION_DEADLINE_S, what="one node to become active")


async def two_of_three(nodes, plan: ClusterPlan) -> dict[str, NodeServer]:
    """n1 and n2 of a three-node cluster, running; n3 stopped. A new cluster is founded by
    all its declared voters, so n3 runs until the cluster has its id; then two of three
    are a quorum."""
    servers = {nid: await nodes(node_config(plan, nid), wait_ready=False) for nid in ("n1", "n2")}
    founder = await start_node(node_config(plan, "n3"), wait_ready=False)
    try:
        await eventually(
            lambda: all(server.raft.node.cluster_id for server in servers.values()),
            deadline_s=ELECTION_DEADLINE_S,
            what="the cluster to be founded",
        )
    finally:
        await founder.stop()
    return servers


async def wait_for_leader_url(api: HttpApi, url: str) -> None:
    async def knows_leader() -> bool:
        return expect(await api.get("/v1/cluster", role="client"), 200)["leader_url"] == url

    await eventually(knows_leader, deadline_s=ELECTION_DEADLINE_S, what=f"{api.url} to name {url} as leader")


@covers("step_down", "create_session")
async def test_two_of_three_nodes_elect_one_active_node_and_the_other_points_to_it(nodes, http, plan: ClusterPlan):
    servers = await two_of_three(nodes, plan)
    apis = {nid: http(server) for nid, server in servers.items()}
    active = await wait_for_one_active(apis)
    standby = "n2" if active == "n1" else "n1"
    await wait_for_leader_url(apis[standby], plan.node(active).url)

    for route in ACTIVE_ONLY:
        assert_not_active(await request_route(apis[standby], route), route.name, leader_url=plan.node(active).url)
    not_ready = await apis[standby].get("/readyz", role=None)
    assert_error(not_ready, 503, "not_ready")
    assert not_ready.body["leader_url"] == plan.node(active).url
    view = expect(await apis[standby].get("/v1/cluster", role="client"), 200)
    assert view["role"] == "standby" and view["leader_id"] == active

    # The active node serves; a planned step down hands the active role to the standby.
    expect(await apis[active].post("/v1/sessions", {"agent": "helper", "session_id": "s1"}), 201)
    moved = expect(await apis[active].post("/v1/cluster/step-down", {"to": standby}, role="admin"), 200)
    assert moved["from"] == active and moved["to"] == standby
    assert await wait_for_one_active(apis) == standby
    await wait_for_leader_url(apis[active], plan.node(standby).url)
    assert_not_active(await apis[active].get("/v1/sessions/s1"), "get_session", leader_url=plan.node(standby).url)
    # The session committed on the old active node is there on the new one.
    assert expect(await apis[standby].get("/v1/sessions/s1"), 200)["agent"] == "helper"


def stall_raft_loop(node: NodeServer, seconds: float) -> None:
    """A test double for a Raft loop that stops (a starved or blocked thread): block the
    node's Raft thread. Its published view, and so its lease end, stays as it was."""
    loop = node.raft._thread.loop
    assert loop is not None
    loop.call_soon_threadsafe(time.sleep, seconds)


@covers("worker_poll")
async def test_a_long_poll_whose_lease_lapses_meanwhile_answers_not_active(nodes, http, plan: ClusterPlan):
    """The lease is checked when the poll comes in and again before it answers from this
    node's state: the active node's Raft loop stalls while the poll waits, the lease
    lapses, and the answer is 503 not_active rather than "no work" from a node that may
    no longer lead."""
    servers = await two_of_three(nodes, plan)
    apis = {nid: http(server) for nid, server in servers.items()}
    active = servers[await wait_for_one_active(apis)]
    poll = asyncio.create_task(
        http(active).post("/v1/worker/poll", {"worker_id": "w", "agents": ["helper"], "wait_ms": 1500}, role="worker")
    )
    await eventually(
        lambda: active.leader is not None and active.leader.waiting_polls() == 1, what="the poll to wait for work"
    )
    stall_raft_loop(active, seconds=3.0)  # longer than the poll's wait: no new term starts meanwhile
    assert_not_active(await poll, "worker_poll", leader_url=None)
