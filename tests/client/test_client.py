"""DexClient: every client route, retries across failovers, the event stream and waiting, on fake nodes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from dex_ha.client import (
    DexClient,
    DexError,
    IdleTimeoutError,
    MalformedAnswer,
    SessionEvent,
)
from harness.waiting import eventually
from tests.client.fake_server import (
    FakeCluster,
    FakeNode,
    FakeSleep,
    Fault,
    UpperBoundRng,
    start_nodes,
)

STEP = 5.0  # deadline for one expected event or state


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    yield FakeCluster()


@pytest.fixture
async def nodes(cluster: FakeCluster) -> AsyncIterator[list[FakeNode]]:
    """Two nodes: the first active, the second a standby naming it."""
    started = await start_nodes(cluster, "active", "standby")
    started[1].leader_url = started[0].url
    yield started
    for node in started:
        await node.stop()


@pytest.fixture
async def client(nodes: list[FakeNode]) -> AsyncIterator[DexClient]:
    async with DexClient([n.url for n in nodes], token="client-token", backoff_max_s=0.1) as c:
        yield c


def fail_over(old: FakeNode, new: FakeNode) -> None:
    """The active node dies while it serves the next request (it was received, then dropped)."""
    old.add_faults(Fault("drop"))
    old.become_standby(new.url)
    new.become_active()


async def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = STEP) -> None:
    await eventually(condition, what, deadline_s=timeout_s, interval_s=0.01)


# ---------------------------------------------------------------------------- sessions


async def test_create_session_makes_an_id_and_returns_the_201_body(client: DexClient, nodes: list[FakeNode]) -> None:
    session = await client.create_session("helper", metadata={"user": "u1"})
    assert session.session_id.startswith("s-") and len(session.session_id) > 10
    assert session.agent == "helper" and session.metadata == {"user": "u1"}
    sent = nodes[0].requests_to("/v1/sessions")[0]
    assert sent.body == {"agent": "helper", "session_id": session.session_id, "metadata": {"user": "u1"}}
    assert sent.headers["Authorization"] == "Bearer client-token"
    other = await client.create_session("helper")
    assert other.session_id != session.session_id


async def test_create_session_retried_across_a_failover_uses_the_same_id(
    client: DexClient, nodes: list[FakeNode], cluster: FakeCluster
) -> None:
    old, new = nodes
    fail_over(old, new)
    session = await client.create_session("helper")
    sent = old.requests_to("/v1/sessions") + new.requests_to("/v1/sessions")
    assert len(sent) >= 2
    assert {r.body["session_id"] for r in sent} == {session.session_id}
    assert list(cluster.sessions) == [session.session_id]
    assert client.connection.current_url == new.url


async def test_create_session_for_another_agent_is_a_conflict(client: DexClient) -> None:
    await client.create_session("a", session_id="s-1")
    assert (await client.create_session("a", session_id="s-1")).session_id == "s-1"
    with pytest.raises(DexError) as info:
        await client.create_session("b", session_id="s-1")
    assert (info.value.status, info.value.code) == (409, "conflict")


async def test_get_session_of_an_unknown_id_raises_not_found(client: DexClient, nodes: list[FakeNode]) -> None:
    with pytest.raises(DexError) as info:
        await client.get_session("nope")
    assert (info.value.status, info.value.code) == (404, "not_found")
    assert len(nodes[0].requests_to("/v1/sessions/nope")) == 1  # not retried


async def test_list_sessions_pages_and_iter_sessions_follows_them(client: DexClient, nodes: list[FakeNode]) -> None:
    for i in range(5):
        await client.create_session("a", session_id=f"s-a{i}")
    await client.create_session("b", session_id="s-b0")
    first = await client.list_sessions(agent="a", limit=2)
    assert [s.session_id for s in first.sessions] == ["s-a0", "s-a1"]
    assert first.next_after == "s-a1"
    assert nodes[0].requests_to("/v1/sessions")[-1].query == {"agent": "a", "limit": "2"}

    listed = [s.session_id async for s in client.iter_sessions(agent="a", page_size=2)]
    assert listed == [f"s-a{i}" for i in range(5)]
    pages = [r.query for r in nodes[0].requests_to("/v1/sessions") if r.method == "GET"][1:]
    assert pages == [
        {"agent": "a", "limit": "2"},
        {"agent": "a", "limit": "2", "after": "s-a1"},
        {"agent": "a", "limit": "2", "after": "s-a3"},
    ]
    everything = [s.session_id async for s in client.iter_sessions(status="idle", page_size=100)]
    assert sorted(everything) == sorted([f"s-a{i}" for i in range(5)] + ["s-b0"])


async def test_list_sessions_rejects_a_bad_limit(client: DexClient) -> None:
    with pytest.raises(ValueError, match="limit"):
        await client.list_sessions(limit=0)


# ---------------------------------------------------------------------------- messages and decisions


async def test_send_message_retried_across_a_failover_sends_the_same_message_id(
    client: DexClient, nodes: list[FakeNode], cluster: FakeCluster
) -> None:
    old, new = nodes
    await client.create_session("helper", session_id="s-1")
    fail_over(old, new)
    accepted = await client.send_message("s-1", "hello")
    sent = old.requests_to("/v1/sessions/s-1/messages") + new.requests_to("/v1/sessions/s-1/messages")
    assert len(sent) >= 2
    assert {r.body["message_id"] for r in sent} == {accepted.message_id}
    assert all(r.body == {"text": "hello", "message_id": accepted.message_id, "mode": "queue"} for r in sent)
    assert cluster.message_ids["s-1"] == [accepted.message_id]


async def test_send_message_checks_its_arguments(client: DexClient) -> None:
    with pytest.raises(ValueError, match="mode"):
        await client.send_message("s-1", "hi", mode="shout")
    with pytest.raises(TypeError, match="text"):
        await client.send_message("s-1", 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="session_id"):
        await client.send_message("", "hi")


async def test_send_message_keeps_a_given_id_and_steer_mode(client: DexClient, nodes: list[FakeNode]) -> None:
    await client.create_session("helper", session_id="s-1")
    await client.send_message("s-1", "faster", message_id="m-7", mode="steer")
    assert nodes[0].requests_to("/v1/sessions/s-1/messages")[0].body == {
        "text": "faster",
        "message_id": "m-7",
        "mode": "steer",
    }


async def test_decisions_go_to_their_routes_with_quoted_ids(client: DexClient, nodes: list[FakeNode]) -> None:
    await client.approve("s 1", "call/1")
    await client.approve("s 1", "call/2", approved=False, reason="no")
    await client.deny("s 1", "call/3", reason="never")
    await client.answer("s 1", "q?1", {"choice": 2})
    await client.cancel("s 1")
    await client.reconcile("s 1", "c4", "succeeded", result={"status": "ok", "output": 1})
    await client.reconcile("s 1", "c5", "failed", error="it did not happen")
    sent = [(r.raw_path, r.body) for r in nodes[0].requests if r.method == "POST"]
    assert sent == [
        ("/v1/sessions/s%201/approvals/call%2F1", {"approved": True}),
        ("/v1/sessions/s%201/approvals/call%2F2", {"approved": False, "reason": "no"}),
        ("/v1/sessions/s%201/approvals/call%2F3", {"approved": False, "reason": "never"}),
        ("/v1/sessions/s%201/questions/q%3F1/answer", {"answer": {"choice": 2}}),
        ("/v1/sessions/s%201/cancel", {}),
        (
            "/v1/sessions/s%201/tool-calls/c4/reconcile",
            {"outcome": "succeeded", "result": {"status": "ok", "output": 1}},
        ),
        ("/v1/sessions/s%201/tool-calls/c5/reconcile", {"outcome": "failed", "error": "it did not happen"}),
    ]


async def test_decisions_check_their_arguments(client: DexClient) -> None:
    with pytest.raises(ValueError, match="outcome"):
        await client.reconcile("s", "c", "maybe")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="approved"):
        await client.approve("s", "c", approved="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="call_id"):
        await client.approve("s", None)  # type: ignore[arg-type]


async def test_cluster_is_answered_by_a_standby_too(nodes: list[FakeNode]) -> None:
    async with DexClient(nodes[1].url) as client:
        view = await client.cluster()
    assert (view.role, view.leader_url) == ("standby", nodes[0].url)
    assert view.raw == {"node_id": view.node_id, "role": "standby", "leader_url": nodes[0].url, "url": nodes[1].url}


# ---------------------------------------------------------------------------- events


async def next_event(events: AsyncIterator[SessionEvent]) -> SessionEvent:
    return await asyncio.wait_for(anext(events), STEP)


async def test_events_parses_committed_events_and_deltas(client: DexClient, cluster: FakeCluster) -> None:
    await cluster.commit_event("s-1", "turn_started", {"turn_id": "t1"})
    await cluster.commit_event("s-2", "turn_started", {"turn_id": "other session"})
    events = client.events("s-1")
    try:
        first = await next_event(events)
        assert first == SessionEvent(id="100", type="turn_started", data={"turn_id": "t1"}, at=1_700_000_000_100)
        await cluster.push_delta(
            "s-1", {"type": "delta", "step_id": "st1", "attempt": 2, "session_id": "s-1", "data": {"text": "Hel"}}
        )
        delta = await next_event(events)
        assert delta == SessionEvent(id=None, type="delta", data={"text": "Hel"}, at=None, step_id="st1", attempt=2)
        await cluster.commit_event("s-1", "turn_completed", {"turn_id": "t1", "status": "completed"})
        last = await next_event(events)
        assert (last.id, last.type, last.data) == ("114", "turn_completed", {"turn_id": "t1", "status": "completed"})
    finally:
        await events.aclose()


async def test_events_resume_after_a_dropped_stream_without_duplicates(
    client: DexClient, nodes: list[FakeNode], cluster: FakeCluster
) -> None:
    for n in range(4):
        await cluster.commit_event("s-1", "step", {"n": n})
    active = nodes[0]
    active.drop_stream_after = 2  # cut after ids 100, 107
    active.replay_overlap = 1  # and resend 107 on the reconnect
    events = client.events("s-1")
    try:
        got = [await next_event(events) for _ in range(4)]
        await cluster.commit_event("s-1", "step", {"n": 4})
        got.append(await next_event(events))
    finally:
        await events.aclose()
    assert [e.id for e in got] == ["100", "107", "114", "121", "128"]
    assert [e.data["n"] for e in got] == [0, 1, 2, 3, 4]
    streams = active.requests_to("/v1/sessions/s-1/events")
    assert len(streams) == 2
    assert "Last-Event-ID" not in streams[0].headers
    assert streams[1].headers["Last-Event-ID"] == "107"


async def test_events_after_an_id_starts_there(client: DexClient, nodes: list[FakeNode], cluster: FakeCluster) -> None:
    for n in range(3):
        await cluster.commit_event("s-1", "step", {"n": n})
    events = client.events("s-1", after="107")
    try:
        assert (await next_event(events)).id == "114"
    finally:
        await events.aclose()
    assert nodes[0].requests_to("/v1/sessions/s-1/events")[0].headers["Last-Event-ID"] == "107"


async def test_events_follow_a_failover_to_the_new_active_node(
    client: DexClient, nodes: list[FakeNode], cluster: FakeCluster
) -> None:
    old, new = nodes
    await cluster.commit_event("s-1", "turn_started", {})
    await cluster.commit_event("s-1", "step", {})
    old.drop_stream_after = 2
    events = client.events("s-1")
    try:
        assert [(await next_event(events)).id for _ in range(2)] == ["100", "107"]
        old.become_standby(new.url)  # the old node lost the lease when its stream died
        new.become_active()
        await cluster.commit_event("s-1", "turn_completed", {})
        resumed = await next_event(events)
    finally:
        await events.aclose()
    assert (resumed.id, resumed.type) == ("114", "turn_completed")
    assert new.requests_to("/v1/sessions/s-1/events")[0].headers["Last-Event-ID"] == "107"
    assert client.connection.current_url == new.url


async def test_events_back_off_when_streams_keep_ending_empty(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    active.empty_streams = True
    fake = FakeSleep()
    async with DexClient(
        active.url, sleep=fake, rng=UpperBoundRng(), backoff_initial_s=0.05, backoff_max_s=0.4
    ) as client:
        events = client.events("s-1")
        consumer = asyncio.ensure_future(anext(events))
        try:
            await wait_for(lambda: len(fake.sleeps) >= 5, "five reconnect waits")
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await events.aclose()
    assert fake.sleeps[:5] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.4])
    assert len(active.requests_to("/v1/sessions/s-1/events")) >= 5


# ---------------------------------------------------------------------------- waiting


async def test_wait_until_idle_returns_the_idle_snapshot(client: DexClient, cluster: FakeCluster) -> None:
    await client.create_session("helper", session_id="s-1")
    session = cluster.sessions["s-1"]
    session.update(status="running", waiting_messages=[{"message_id": "m2"}])

    async def finish_the_turns() -> None:
        await asyncio.sleep(0.2)
        session["status"] = "idle"  # idle, but a message still waits: not done yet
        await asyncio.sleep(0.2)
        session.update(waiting_messages=[], history=[{"type": "assistant", "content": "done"}])

    finisher = asyncio.create_task(finish_the_turns())
    snapshot = await client.wait_until_idle("s-1", timeout_s=STEP)
    await finisher
    assert snapshot.status == "idle"
    assert snapshot.waiting_messages == ()
    assert snapshot.history == ({"type": "assistant", "content": "done"},)


async def test_wait_until_idle_raises_after_its_deadline(client: DexClient, cluster: FakeCluster) -> None:
    await client.create_session("helper", session_id="s-1")
    cluster.sessions["s-1"]["status"] = "running"
    started = time.monotonic()
    with pytest.raises(asyncio.TimeoutError) as info:
        await client.wait_until_idle("s-1", timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 2.0
    assert isinstance(info.value, IdleTimeoutError)
    assert "s-1" in str(info.value) and "running" in str(info.value)
    assert info.value.last_status == "running"


async def test_wait_until_idle_keeps_waiting_through_a_failover(
    client: DexClient, nodes: list[FakeNode], cluster: FakeCluster
) -> None:
    old, new = nodes
    await client.create_session("helper", session_id="s-1")
    cluster.sessions["s-1"]["status"] = "running"
    fail_over(old, new)

    async def finish() -> None:
        await wait_for(lambda: len(new.requests_to("/v1/sessions/s-1")) >= 1, "a read on the new node")
        cluster.sessions["s-1"]["status"] = "idle"

    finisher = asyncio.create_task(finish())
    snapshot = await client.wait_until_idle("s-1", timeout_s=STEP)
    await finisher
    assert snapshot.status == "idle"


# ---------------------------------------------------------------------------- typed answers


async def test_list_sessions_sends_the_approval_and_outcome_filters(client: DexClient, nodes: list[FakeNode]) -> None:
    await client.list_sessions(awaiting_approval=True, outcome_unknown=False)
    assert nodes[0].requests_to("/v1/sessions")[-1].query == {"awaiting_approval": "true", "outcome_unknown": "false"}
    async for _ in client.iter_sessions(status="running", awaiting_approval=False):
        pass
    assert nodes[0].requests_to("/v1/sessions")[-1].query == {
        "status": "running",
        "limit": "100",
        "awaiting_approval": "false",
    }
    with pytest.raises(TypeError, match="awaiting_approval"):
        await client.list_sessions(awaiting_approval="yes")  # type: ignore[arg-type]


async def test_a_malformed_answer_raises_the_sdk_error_naming_the_field(
    client: DexClient, nodes: list[FakeNode]
) -> None:
    nodes[0].add_faults(Fault("status", status=200, body={"session_id": "s-1", "agent": "a", "status": 3}))
    with pytest.raises(MalformedAnswer) as caught:
        await client.get_session("s-1")
    assert caught.value.field == "status" and "expected a string, got int" in caught.value.message


async def test_an_acknowledgement_that_is_not_a_json_object_raises_the_sdk_error(
    client: DexClient, nodes: list[FakeNode]
) -> None:
    nodes[0].add_faults(Fault("status", status=200, body=["cancelled"]))
    with pytest.raises(MalformedAnswer) as caught:
        await client.cancel("s-1")
    assert caught.value.field == "answer" and "expected a JSON object, got list" in caught.value.message
