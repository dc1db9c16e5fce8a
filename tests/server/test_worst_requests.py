"""The worst requests one client can build keep the Raft loop running and the term where it
is (real processes: a three-node `dex-ha cluster up`).

The repro: sessions with 1 MB of metadata each, then one `GET /v1/sessions?limit=1000`
built an answer of the whole list in one call that held the interpreter lock; the Raft
loop did not run for 1.8 s and the term changed. Here the nodes run with the metadata cap
raised to its ceiling (an operator may), hold that many sessions, and take, many at once
and for a while: pages of the whole list with limit=1000, snapshots of those sessions,
bodies just under the route limit (decoded, then refused by the text cap), and bodies of
4 MiB of tiny JSON values (the costliest to decode), while the test watches each node's
slow-turn counter and the term.

The threshold is the one every node counts with (`dex_raft_slow_turns_total`): a loop turn,
or a gap between two turns, over a quarter of the election timeout, 125 ms by default. The
bound the server aims at is 100 ms; the 25 ms more are for a loaded two-core CI machine,
where the test's own client, three nodes and other jobs share the cores, and a thread that
is ready can wait some tens of milliseconds for one. Before the fix one list request alone
kept the loop from running for over a second.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.cluster_process import LocalCluster
from harness.cluster_state import observe, term_changes
from harness.waiting import eventually

SESSIONS = 100
METADATA_BYTES = 1_000_000  # the repro's
ATTACK_S = 8.0
CLIENTS_PER_KIND = 4
RAISED_CAPS = {"DEX_HA_MAX_METADATA_BYTES": str(1 << 20)}  # the ceiling: create_session's body limit


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    cluster = LocalCluster(tmp_path / "cluster")
    cluster.up()
    try:
        for node_id in cluster.urls:  # again, with the metadata cap raised
            cluster.kill(node_id)
            cluster.restart(node_id, extra_env=RAISED_CAPS)
        await cluster.active_node(deadline_s=30)
        yield cluster
    finally:
        cluster.down()


async def slow_turns(url: str) -> float:
    """A node's dex_raft_slow_turns_total, long and late turns together."""
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            text = await r.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "dex_raft_slow_turns"
        for sample in family.samples
        if sample.name == "dex_raft_slow_turns_total"
    )


async def every_slow_turn(cluster: LocalCluster) -> dict[str, float]:
    return {node_id: await slow_turns(url) for node_id, url in cluster.urls.items()}


async def until(deadline: float, request: Callable[[], Awaitable[None]]) -> int:
    done = 0
    while time.monotonic() < deadline:
        await request()
        done += 1
    return done


async def test_the_worst_requests_move_neither_the_raft_loop_nor_the_term(cluster: LocalCluster):
    url = cluster.urls[await cluster.active_node()]
    client = {"Authorization": f"Bearer {cluster.tokens['client']}", "Content-Type": "application/json"}
    worker = {"Authorization": f"Bearer {cluster.tokens['worker']}", "Content-Type": "application/json"}
    statuses: dict[str, set[int]] = {}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def send(kind: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> None:
            async with http.request(method, url + path, headers=headers, data=body) as r:
                await r.read()
                statuses.setdefault(kind, set()).add(r.status)

        agent = json.dumps({"tools": [{"name": "lookup", "effect": "read"}]}).encode()
        await send("setup", "PUT", "/v1/agents/a", worker, agent)
        pad = "m" * (METADATA_BYTES - len('{"pad":""}'))
        for i in range(SESSIONS):
            body = json.dumps({"agent": "a", "session_id": f"s{i:03d}", "metadata": {"pad": pad}}).encode()
            await send("setup", "POST", "/v1/sessions", client, body)
        assert statuses["setup"] <= {200, 201}, statuses

        before_turns = await every_slow_turn(cluster)
        before = await observe(cluster.urls, cluster.tokens["client"])
        deadline = time.monotonic() + ATTACK_S

        async def list_everything() -> None:
            after: str | None = ""
            while True:
                async with http.get(
                    url + "/v1/sessions",
                    params={"limit": "1000", **({"after": after} if after else {})},
                    headers=client,
                ) as r:
                    statuses.setdefault("list", set()).add(r.status)
                    after = (await r.json()).get("next_after") if r.status == 200 else None
                if not after:
                    return

        near_limit = json.dumps({"text": "x" * ((4 << 20) - 100)}).encode()
        tiny_values = b'{"worker_id":"w","result":[' + b",".join([b"[]"] * ((4 << 20) // 3 - 20)) + b"]}"
        kinds = [
            lambda: list_everything(),
            lambda: send("snapshot", "GET", f"/v1/sessions/s{time.monotonic_ns() % SESSIONS:03d}", client),
            lambda: send("near_limit", "POST", "/v1/sessions/s000/messages", client, near_limit),
            lambda: send("tiny_values", "POST", "/v1/worker/tasks/not-a-token/complete", worker, tiny_values),
        ]
        counts = await asyncio.gather(*(until(deadline, kind) for kind in kinds for _ in range(CLIENTS_PER_KIND)))

    after = await observe(cluster.urls, cluster.tokens["client"])
    after_turns = await every_slow_turn(cluster)
    slow = {node_id: after_turns[node_id] - before_turns[node_id] for node_id in after_turns}
    assert term_changes(before, after) == 0, f"an election ran: {before.describe()} -> {after.describe()}"
    assert not any(slow.values()), f"Raft loop turns (or gaps) over 125 ms during the requests, by node: {slow}"
    assert statuses["list"] <= {200, 503} and 200 in statuses["list"], statuses
    assert statuses["snapshot"] <= {200, 503} and statuses["near_limit"] <= {413, 503}, statuses
    assert statuses["tiny_values"] <= {413, 503}, statuses  # more than MAX_JSON_ITEMS
    assert min(counts) >= 1, f"every client got answers: {counts}"
    await eventually(lambda: cluster.active_node(), deadline_s=10, what="the same cluster to serve after")
