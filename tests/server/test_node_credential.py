"""Node-to-node HTTP calls carry the cluster's own credential, never the caller's token.

`GET /v1/cluster/nodes` asks every member's URL for its view. A member's URL is whatever an
admin added; one that points at a hostile server must not receive the client's or the
admin's token. The credential the node sends instead opens `GET /v1/cluster` and nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from dex_ha.server.node_credential import VALID_FOR_S, NodeCredential
from tests.server.node_fixture import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    WORKER_TOKEN,
    assert_error,
    cluster_plan,
    expect,
    free_ports,
)
from tests.server.test_not_active import two_of_three, wait_for_leader_url, wait_for_one_active

covers = pytest.mark.covers

SECRET = "cluster-secret-credential-0123456789"
NOW_S = 1_800_000_000.0


def test_a_credential_is_accepted_by_its_cluster_only_and_only_for_a_minute():
    mine = NodeCredential(SECRET)
    header = mine.authorization(NOW_S)
    assert header is not None and header.startswith("Bearer dexnode.")
    assert mine.accepts(header, NOW_S) and mine.accepts(header, NOW_S + VALID_FOR_S)
    assert not mine.accepts(header, NOW_S + VALID_FOR_S + 1)
    assert not mine.accepts(header, NOW_S - VALID_FOR_S - 1)
    assert not NodeCredential("another-cluster-secret-0123").accepts(header, NOW_S)
    seconds, _, mac = header.removeprefix("Bearer dexnode.").partition(".")
    assert not mine.accepts(f"Bearer dexnode.{int(seconds) + 1}.{mac}", NOW_S), "the time is signed"
    for bad in (None, "", "Bearer", "Basic x", f"Bearer {CLIENT_TOKEN}", "Bearer dexnode.x.y", "Bearer dexnode.²."):
        assert not mine.accepts(bad, NOW_S), bad
    # Without a secret (--insecure, dev) a node makes no credential and accepts none.
    assert NodeCredential(None).authorization(NOW_S) is None
    assert not NodeCredential(None).accepts(header, NOW_S)


@pytest.fixture
async def hostile_member() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A web server posing as a member: its URL and the headers of every request it got."""
    received: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        received.append(dict(request.headers))
        return web.json_response({"node_id": "evil", "role": "standby"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    [port] = free_ports(1)
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        await runner.cleanup()


@covers("cluster_nodes", "add_member", "cluster")
async def test_the_nodes_view_sends_no_caller_token_to_a_member_and_still_shows_every_node(
    nodes, http, tmp_path: Path, hostile_member: tuple[str, list[dict[str, str]]]
):
    plan = cluster_plan(tmp_path)
    servers = await two_of_three(nodes, plan)
    apis = {nid: http(server) for nid, server in servers.items()}
    active = await wait_for_one_active(apis)
    standby = "n2" if active == "n1" else "n1"
    await wait_for_leader_url(apis[standby], plan.node(active).url)
    api = apis[active]
    hostile_url, received = hostile_member
    [raft_port] = free_ports(1)
    expect(
        await api.post(
            "/v1/cluster/members", {"id": "n9", "raft_addr": f"127.0.0.1:{raft_port}", "url": hostile_url}, role="admin"
        ),
        200,
    )

    for role in ("client", "admin", "worker"):
        body = expect(await api.get("/v1/cluster/nodes", role=role), 200)
        entries = {entry["id"]: entry for entry in body["nodes"]}
        # The other running node accepted the cluster's credential: the console's view works.
        assert entries[standby]["reachable"] is True, entries[standby]
        assert entries[standby]["view"]["role"] == "standby"
        assert entries[active]["view"]["role"] == "active"
        assert entries["n3"]["reachable"] is False  # stopped
        assert entries["n9"]["reachable"] is True  # it answered

    assert len(received) == 3
    caller_tokens = (CLIENT_TOKEN, ADMIN_TOKEN, WORKER_TOKEN)
    for headers in received:
        sent = " ".join(headers.values())
        assert not any(token in sent for token in caller_tokens), f"a caller's token reached the member: {headers}"
        assert headers["Authorization"].startswith("Bearer dexnode."), headers

    # What the hostile member got opens GET /v1/cluster, and no other route.
    stolen = {"Authorization": received[-1]["Authorization"]}
    expect(await api.get("/v1/cluster", role=None, headers=stolen), 200)
    assert_error(await api.get("/v1/cluster/nodes", role=None, headers=stolen), 401, "unauthorized")
    assert_error(await api.get("/v1/sessions", role=None, headers=stolen), 401, "unauthorized")
    assert_error(await api.post("/v1/cluster/step-down", {}, role=None, headers=stolen), 401, "unauthorized")
