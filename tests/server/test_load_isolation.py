"""Load must never cost the active node its lease (issue: hold under overload).

- The Raft node runs on its own thread: an HTTP event loop that is busy (here: blocked
  outright, far past the election timeout) neither lets the lease lapse nor starts an
  election.
- Admission control: past `max_inflight_requests` a request is answered at once with 503
  `overloaded` and Retry-After; probes are never shed; the node stays the active node.
- /metrics is rendered at most once a second, whatever the scrape rate.
- Probes on the probe port are answered from a thread of their own, never behind API requests.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dex_ha.engine import CompleteAttempt
from dex_ha.server.metrics import RENDER_INTERVAL_S, ServerMetrics
from harness.waiting import eventually
from tests.server.node_fixture import (
    CLIENT_TOKEN,
    assert_error,
    base_url,
    cluster_plan,
    model_result,
    node_config,
    single_node_config,
    tool,
)

BLOCK_S = 1.5  # the HTTP loop is blocked this long: far past every election timeout below


def block_the_event_loop(seconds: float) -> None:
    """What a CPU-bound burst of requests does to the loop, in its purest form."""
    time.sleep(seconds)


async def test_a_blocked_http_loop_keeps_the_lease_of_a_single_node(tmp_path: Path, nodes):
    node = await nodes(single_node_config(tmp_path))  # election timeout 150-300 ms (dev)
    term = node.raft.view.term
    block_the_event_loop(BLOCK_S)
    # Checked before the loop runs anything: the Raft thread kept the lease fresh meanwhile.
    assert node.raft.view.lease_valid(), "the lease lapsed while the HTTP loop was busy"
    assert node.is_ready()
    assert node.raft.view.term == term


async def test_a_blocked_http_loop_moves_neither_term_nor_leader_in_a_cluster(tmp_path: Path, nodes):
    plan = cluster_plan(tmp_path)
    # All three nodes share this test's event loop (each has its own Raft thread), so the
    # block below stalls every node's HTTP side at once.
    cluster = [await nodes(node_config(plan, nid), wait_ready=False) for nid in plan.node_ids]

    async def one_active():
        ready = [n for n in cluster if n.is_ready()]
        return ready[0] if len(ready) == 1 else None

    active = await eventually(one_active, deadline_s=10, what="an active node")
    term, leader = active.raft.view.term, active.raft.view.leader_id
    block_the_event_loop(BLOCK_S)  # 5x the 300 ms election timeout minimum
    assert active.raft.view.lease_valid(), "the active node's lease lapsed while its HTTP loop was busy"
    assert [n.raft.view.term for n in cluster] == [term] * 3, "an election ran while the HTTP loop was busy"
    assert {n.raft.view.leader_id for n in cluster} == {leader}
    gap = max(n.raft.node.metrics.leader_contact_gap_max_ms for n in cluster if n is not active)
    assert gap < 300 / 2, f"a follower went {gap} ms without a message from the leader"


async def _send_a_partial_body(url: str, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A POST whose body never finishes arriving."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {CLIENT_TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
        ).encode()
    )
    await writer.drain()
    return reader, writer


async def _in_flight(node, n: int) -> bool:
    return node.admission.in_flight == n


def hold_proposals(node) -> asyncio.Event:
    """Make the node's proposals wait until the returned event is set: the requests that
    propose stay in flight meanwhile, as they would while a busy cluster commits."""
    release = asyncio.Event()
    propose = node.propose

    async def held(cmd, **kwargs):
        await release.wait()
        return await propose(cmd, **kwargs)

    node.propose = held
    return release


async def test_past_the_bound_requests_get_overloaded_at_once_and_probes_still_pass(tmp_path: Path, nodes):
    node = await nodes(single_node_config(tmp_path, max_inflight_requests=2))
    url = base_url(node)
    headers = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    release = hold_proposals(node)
    async with aiohttp.ClientSession() as session:
        held = [
            asyncio.ensure_future(session.post(url + "/v1/sessions", json={"agent": "a"}, headers=headers))
            for _ in range(2)
        ]
        await eventually(lambda: _in_flight(node, 2), deadline_s=5, what="both creates in flight")
        started = time.monotonic()
        async with session.post(url + "/v1/sessions", json={"agent": "a"}, headers=headers) as r:
            body = await r.json()
            assert (r.status, body["error"]) == (503, "overloaded"), body
            assert r.headers["Retry-After"] == "1"
        async with session.get(url + "/v1/sessions", headers=headers) as r:
            assert (r.status, (await r.json())["error"]) == (503, "overloaded")
        assert time.monotonic() - started < 2, "shedding must answer at once, not queue"
        for probe in ("/livez", "/readyz"):
            async with session.get(url + probe) as r:
                assert r.status == 200, f"{probe} was shed"
        assert node.is_ready(), "a node at its bound is still the active node"
        release.set()  # the held requests finish: their slots come back
        for response in await asyncio.gather(*held):
            assert response.status == 201, await response.text()
            response.release()
        await eventually(lambda: _in_flight(node, 0), deadline_s=5, what="the slots to be given back")
        async with session.post(url + "/v1/sessions", json={"agent": "a"}, headers=headers) as r:
            assert r.status == 201, await r.text()
        async with session.get(url + "/metrics") as r:
            text = await r.text()
    assert "dex_http_requests_shed_total 2.0" in text, "the shed requests are counted"


async def test_a_client_that_trickles_its_body_holds_no_slot(tmp_path: Path, nodes):
    node = await nodes(single_node_config(tmp_path, max_inflight_requests=1))
    url = base_url(node)
    _, slow = await _send_a_partial_body(url, "/v1/sessions")  # never finishes its body
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                url + "/v1/sessions", json={"agent": "a"}, headers={"Authorization": f"Bearer {CLIENT_TOKEN}"}
            ) as r:
                assert r.status == 201, await r.text()
        assert node.admission.in_flight == 0
    finally:
        slow.close()


async def test_a_long_poll_does_not_take_a_slot(tmp_path: Path, nodes):
    node = await nodes(single_node_config(tmp_path, max_inflight_requests=1))
    url = base_url(node)
    headers = {"Authorization": "Bearer worker-token-routes-0123456789"}
    async with aiohttp.ClientSession() as session:
        poll = asyncio.ensure_future(
            session.post(
                url + "/v1/worker/poll", headers=headers, json={"worker_id": "w1", "agents": ["a"], "wait_ms": 3000}
            )
        )
        await eventually(lambda: _waiting_polls(node), deadline_s=5, what="the long poll to wait")
        async with session.post(
            url + "/v1/sessions", json={"agent": "a"}, headers={"Authorization": f"Bearer {CLIENT_TOKEN}"}
        ) as r:
            assert r.status == 201, await r.text()
        response = await poll
        response.release()


async def _waiting_polls(node) -> bool:
    return node.leader is not None and node.leader.waiting_polls() == 1


async def test_a_workers_heartbeat_and_result_are_not_shed_when_the_bound_is_full(tmp_path: Path, nodes, http):
    """The hand-outs bound a Worker's reports: shedding a result of work already done
    would only make the Worker wait and send it again (the throughput knee of the steps bench)."""
    node = await nodes(single_node_config(tmp_path, max_inflight_requests=1))
    api = http(node)
    await api.register_agent("a", [tool("lookup")])
    await api.create_session("a", "s1")
    await api.send_message("s1", "hello")
    task = await api.poll_one("a")
    release = hold_proposals(node)
    proposed = count_proposals(node)
    client = asyncio.ensure_future(api.post("/v1/sessions", {"agent": "a", "session_id": "s2"}))
    await eventually(lambda: _in_flight(node, 1), deadline_s=5, what="the client's create to hold the one slot")
    assert_error(await api.post("/v1/sessions", {"agent": "a", "session_id": "s3"}), 503, "overloaded")

    beat = await api.post(f"/v1/worker/tasks/{task['task_token']}/heartbeat", {"worker_id": "worker-1"}, role="worker")
    assert beat.status == 200, beat.body
    result = asyncio.ensure_future(api.complete(task, model_result("done")))
    await eventually(
        lambda: _proposed_a(proposed, CompleteAttempt),
        deadline_s=5,
        what="the result to wait for its commit, not a 503",
    )
    release.set()
    assert (await result)["status"] == "completed"
    assert (await client).status == 201
    assert node.admission.shed_total == 1, "only the client's request over the bound was shed"


def count_proposals(node) -> list[Any]:
    """The commands the node proposes from now on, in order."""
    proposed: list[Any] = []
    propose = node.propose

    async def counted(cmd, **kwargs):
        proposed.append(cmd)
        return await propose(cmd, **kwargs)

    node.propose = counted
    return proposed


async def _proposed_a(proposed: list[Any], kind: type) -> bool:
    return any(isinstance(cmd, kind) for cmd in proposed)


def test_metrics_are_rendered_at_most_once_per_interval():
    now = [100.0]
    metrics = ServerMetrics(clock=lambda: now[0])
    metrics.count_request("get_session", 200)
    first = metrics.render_cached()
    metrics.count_request("get_session", 200)
    assert metrics.render_cached() is first, "a second scrape within the interval renders again"
    now[0] += RENDER_INTERVAL_S
    fresh = metrics.render_cached()
    assert fresh != first and b'code="200",route="get_session"} 2.0' in fresh


@pytest.mark.parametrize("limit", [0, -3])
def test_the_bound_must_be_positive(tmp_path: Path, limit: int):
    from dex_ha.server.config import ConfigError

    with pytest.raises(ConfigError, match="max_inflight_requests"):
        single_node_config(tmp_path, max_inflight_requests=limit).check()


def _get_in_a_thread(url: str, timeout_s: float) -> tuple[threading.Thread, dict]:
    """GET `url` from another thread (the test's event loop is about to be blocked)."""
    outcome: dict = {}

    def get() -> None:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                outcome.update(status=r.status, body=json.loads(r.read()))
        except urllib.error.HTTPError as exc:
            outcome.update(status=exc.code, body=json.loads(exc.read()))
        except OSError as exc:
            outcome.update(error=repr(exc))
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=get)
    return thread, outcome


async def test_probes_on_the_probe_port_answer_while_the_api_loop_is_busy(tmp_path: Path, nodes):
    node = await nodes(single_node_config(tmp_path, probe_listen=("127.0.0.1", 0)))
    assert node.probes is not None
    probe_url = f"http://127.0.0.1:{node.probes.port}"
    readyz, ready = _get_in_a_thread(probe_url + "/readyz", timeout_s=0.5)
    livez, alive = _get_in_a_thread(probe_url + "/livez", timeout_s=0.5)
    api_readyz, api_ready = _get_in_a_thread(base_url(node) + "/readyz", timeout_s=0.5)
    for thread in (readyz, livez, api_readyz):
        thread.start()
    block_the_event_loop(BLOCK_S)  # the API loop answers nothing meanwhile
    for thread in (readyz, livez, api_readyz):
        thread.join(timeout=10)
    assert ready.get("status") == 200 and ready["body"]["role"] == "active", ready
    assert alive.get("status") == 200 and alive["body"]["node_id"] == "dev", alive
    assert ready["seconds"] < BLOCK_S and alive["seconds"] < BLOCK_S
    # The same probe on the API port had to wait for the loop (what a balancer would see).
    assert "error" in api_ready, f"the API port answered a probe while its loop was blocked: {api_ready}"


async def test_the_probe_port_says_not_ready_with_the_role_on_a_standby(tmp_path: Path, nodes):
    plan = cluster_plan(tmp_path)
    cluster = [
        await nodes(node_config(plan, nid, probe_listen=("127.0.0.1", 0)), wait_ready=False) for nid in plan.node_ids
    ]

    async def one_active():
        ready = [n for n in cluster if n.is_ready()]
        return ready[0] if len(ready) == 1 else None

    active = await eventually(one_active, deadline_s=10, what="an active node")
    standby = next(n for n in cluster if n is not active)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{standby.probes.port}/readyz") as r:
            body = await r.json()
    assert r.status == 503 and body["role"] == "standby", body
    assert body["leader_url"] == plan.node(active.config.node_id).url


async def test_a_command_too_large_for_the_log_is_413_not_500(tmp_path: Path, nodes):
    node = await nodes(single_node_config(tmp_path))
    # The Raft log's entry cap (8 MiB) is above what the API's bodies allow; lower it on
    # this node's core so that an ordinary request meets it.
    node.raft.node.core._cfg.max_entry_bytes = 256
    async with aiohttp.ClientSession() as session:
        async with session.post(
            base_url(node) + "/v1/sessions",
            headers={"Authorization": f"Bearer {CLIENT_TOKEN}"},
            json={"agent": "a", "metadata": {"note": "x" * 1000}},
        ) as r:
            body = await r.json()
    assert (r.status, body["error"]) == (413, "too_large"), body
    assert node.is_ready()
