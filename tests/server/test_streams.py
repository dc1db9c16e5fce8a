"""SSE event streams that scale: a commit wakes only the streams of the sessions it added
events to, a stream still sees every event once and in order (across many commits at once
and across a takeover), and open streams are capped per node and per token.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dex_ha.engine import CreateSession, Engine, SendMessage, encode_command
from dex_ha.local_cluster import ClusterPlan
from dex_ha.server.admission import StreamAdmission
from dex_ha.server.errors import Overloaded
from dex_ha.server.node import NodeServer
from dex_ha.server.replica import Replica
from tests.server.node_fixture import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    HttpApi,
    SseEvent,
    SseStream,
    assert_error,
    cluster_plan,
    expect,
    open_sse,
    single_node_config,
)
from tests.server.test_not_active import two_of_three, wait_for_leader_url, wait_for_one_active

covers = pytest.mark.covers

OTHER_STREAMS = 20


def count_event_reads(node: NodeServer, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the node's streams read each session's events from now on."""
    reads: Counter[str] = Counter()
    real_events = node.replica.reads.events_page

    def events(session_id: str, *args: Any, **kwargs: Any) -> Any:
        reads[session_id] += 1
        return real_events(session_id, *args, **kwargs)

    monkeypatch.setattr(node.replica.reads, "events_page", events)
    return reads


async def open_streams(api: HttpApi, session_ids: list[str]) -> dict[str, tuple[aiohttp.ClientResponse, SseStream]]:
    """A stream on each session, each read up to its session_created event."""
    streams = {sid: await open_sse(api, sid) for sid in session_ids}
    for sid, (response, stream) in streams.items():
        assert response.status == 200, (sid, response.status)
        await stream.until(lambda e: e.event == "session_created")
    return streams


def close_all(streams: dict[str, tuple[aiohttp.ClientResponse, SseStream]]) -> None:
    for response, _ in streams.values():
        response.close()


async def read_through(stream: SseStream, last_id: str) -> list[str]:
    """Read until the event `last_id` has arrived; the ids of every committed event seen."""
    if all(e.id != last_id for e in stream.seen):
        await stream.until(lambda e: e.id == last_id)
    return [e.id for e in stream.seen if e.id is not None]


async def messages_seen(stream: SseStream, count: int) -> list[SseEvent]:
    """Read until `count` message_received events have arrived on `stream` (all of them seen)."""
    await stream.until(lambda e: sum(s.event == "message_received" for s in stream.seen) >= count)
    return [e for e in stream.seen if e.event == "message_received"]


# ---------------------------------------------------------------- only the changed sessions wake


async def test_a_commit_wakes_only_the_stream_of_the_session_it_changed(
    node: NodeServer, api: HttpApi, monkeypatch: pytest.MonkeyPatch
):
    others = [f"other-{i}" for i in range(OTHER_STREAMS)]
    for sid in [*others, "x"]:
        await api.create_session("helper", sid)
    streams = await open_streams(api, [*others, "x"])
    try:
        # A write to x that its stream has seen: every earlier wake-up is over by now.
        await api.send_message("x", "first")
        await messages_seen(streams["x"][1], 1)
        reads = count_event_reads(node, monkeypatch)

        for i in range(5):
            await api.send_message("x", f"message {i}")
        seen = await messages_seen(streams["x"][1], 6)
        assert [e.data["data"]["text"] for e in seen] == ["first"] + [f"message {i}" for i in range(5)]
        assert reads["x"] >= 1
        woken = {sid: n for sid, n in reads.items() if sid != "x"}
        assert woken == {}, f"commits to x made the streams of other sessions read: {woken}"
    finally:
        close_all(streams)


def test_the_replica_wakes_the_waiters_of_the_sessions_an_entry_added_events_to(tmp_path: Path):
    """Without an event loop the replica wakes at once: each apply wakes only the sessions
    it changed, and a snapshot install (which sessions changed is unknown) wakes them all."""
    engine = Engine(str(tmp_path / "state.db"))
    replica = Replica(engine)
    try:
        waiting = {sid: asyncio.Event() for sid in ("a", "b", "c")}
        for sid, event in waiting.items():
            replica.session_waiters.add(sid, event)

        def woken() -> set[str]:
            found = {sid for sid, event in waiting.items() if event.is_set()}
            for event in waiting.values():
                event.clear()
            return found

        replica.apply_batch(
            [
                (i, encode_command(CreateSession(at=1, agent="helper", session_id=sid)))
                for i, sid in ((1, "a"), (2, "b"))
            ]
        )
        assert woken() == {"a", "b"}
        replica.apply_batch([(3, encode_command(SendMessage(at=2, session_id="b", text="hi")))])
        assert woken() == {"b"}
        replica.apply_batch([(4, b"")])  # a leader's no-op changes no session
        assert woken() == set()

        snapshot = engine.snapshot()
        replica.restore(snapshot, 4)
        assert woken() == {"a", "b", "c"}
        replica.session_waiters.remove("c", waiting["c"])
        replica.wake_everyone()
        assert woken() == {"a", "b"}
    finally:
        replica.close()


# ---------------------------------------------------------------- every event, in order


async def test_a_stream_sees_every_event_once_and_in_order_while_many_commits_land_at_once(
    node: NodeServer, api: HttpApi
):
    sessions = ["x", "y", "z"]
    for sid in sessions:
        await api.create_session("helper", sid)
    streams = await open_streams(api, sessions)
    try:
        writes = [api.send_message(sid, f"{sid} {i}", message_id=f"{sid}-{i}") for i in range(30) for sid in sessions]
        await asyncio.gather(*writes)
        for sid in sessions:
            stream = streams[sid][1]
            await messages_seen(stream, 30)
            stored = [str(e.event_id) for e in node.replica.reads.events(sid, 0, 10_000)]
            assert await read_through(stream, stored[-1]) == stored, f"{sid}: the stream differs from the stored events"
    finally:
        close_all(streams)


@pytest.fixture
def plan(tmp_path: Path) -> ClusterPlan:
    return cluster_plan(tmp_path)


async def test_a_stream_resumed_after_a_takeover_misses_no_event(nodes, http, plan: ClusterPlan):
    servers = await two_of_three(nodes, plan)
    apis = {nid: http(server) for nid, server in servers.items()}
    active = await wait_for_one_active(apis)
    standby = "n2" if active == "n1" else "n1"
    await wait_for_leader_url(apis[standby], plan.node(active).url)
    for sid in ("x", "quiet"):
        await apis[active].create_session("helper", sid)
    response, stream = await open_sse(apis[active], "x")
    quiet_response, quiet = await open_sse(apis[active], "quiet")
    try:
        for i in range(10):
            await apis[active].send_message("x", f"before {i}")
        await messages_seen(stream, 10)
        await quiet.until(lambda e: e.event == "session_created")

        expect(await apis[active].post("/v1/cluster/step-down", {"to": standby}, role="admin"), 200)
        # The old active node ends every stream, even one whose session saw no commit.
        for ending in (stream, quiet):
            with pytest.raises(pytest.fail.Exception, match="the event stream ended"):
                await ending.until(lambda e: False)
    finally:
        response.close()
        quiet_response.close()

    assert await wait_for_one_active(apis) == standby
    new = apis[standby]
    last_seen = [e for e in stream.seen if e.id is not None][-1].id
    response, resumed = await open_sse(new, "x", last_event_id=last_seen)
    try:
        for i in range(10):
            await new.send_message("x", f"after {i}")
        await messages_seen(resumed, 10)
        stored = [str(e.event_id) for e in servers[standby].replica.reads.events("x", 0, 10_000)]
        ids = [e.id for e in stream.seen if e.id is not None] + await read_through(resumed, stored[-1])
        assert ids == stored, "the two streams together are not the stored events, once each and in order"
    finally:
        response.close()


# ---------------------------------------------------------------- caps


async def open_stream_with(
    api: HttpApi, session_id: str, token: str
) -> tuple[aiohttp.ClientResponse, SseStream | dict[str, Any]]:
    response = await api.session.get(
        f"{api.url}/v1/sessions/{session_id}/events",
        headers={"Authorization": f"Bearer {token}"},
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
    )
    api.hits.append(("session_events", response.status))
    if response.status != 200:
        return response, await response.json()
    stream = SseStream(response)
    await stream.until(lambda e: e.event == "session_created")
    return response, stream


@covers("session_events")
async def test_streams_past_the_per_token_cap_or_the_node_cap_answer_503_naming_the_cap(nodes, http, tmp_path):
    node = await nodes(single_node_config(tmp_path / "n", max_streams=3, max_streams_per_token=2))
    api = http(node)
    await api.create_session("helper", "s1")
    opened: list[aiohttp.ClientResponse] = []
    try:
        for _ in range(2):
            response, _stream = await open_stream_with(api, "s1", CLIENT_TOKEN)
            assert response.status == 200
            opened.append(response)
        response, body = await open_stream_with(api, "s1", CLIENT_TOKEN)
        assert response.status == 503 and response.headers["Retry-After"].isdigit(), body
        assert isinstance(body, dict) and body["error"] == "overloaded"
        assert "max_streams_per_token = 2" in body["message"], body

        # Another token still has its own places, up to the node's cap.
        response, _stream = await open_stream_with(api, "s1", ADMIN_TOKEN)
        assert response.status == 200
        opened.append(response)
        response, body = await open_stream_with(api, "s1", ADMIN_TOKEN)
        assert response.status == 503 and isinstance(body, dict) and body["error"] == "overloaded", body
        assert "max_streams = 3" in body["message"], body
        assert node.streams.open_total == 3 and node.streams.shed_total == 2
        exported = node.metrics.render().decode()
        assert "\ndex_sse_streams 3.0\n" in exported and "\ndex_sse_streams_shed_total 2.0\n" in exported
        # Other requests are not held back by the streams.
        assert expect(await api.get("/v1/sessions/s1"), 200)["session_id"] == "s1"
    finally:
        for response in opened:
            response.close()


async def test_without_tokens_only_the_node_cap_counts(nodes, http, tmp_path):
    node = await nodes(single_node_config(tmp_path / "n", auth=False, max_streams=2, max_streams_per_token=1))
    api = http(node, auth=False)
    await api.create_session("helper", "s1")
    first, second = await open_sse(api, "s1"), await open_sse(api, "s1")
    try:
        assert (first[0].status, second[0].status) == (200, 200)
        reply = await api.get("/v1/sessions/s1/events")
        assert_error(reply, 503, "overloaded")
        assert "max_streams" in reply.body["message"] and "per_token" not in reply.body["message"]
    finally:
        first[0].close()
        second[0].close()


def test_a_closed_stream_gives_its_place_back():
    streams = StreamAdmission(limit=2, per_token_limit=1, owner="node t")
    with streams.open(b"a"):
        with pytest.raises(Overloaded, match="max_streams_per_token"):
            with streams.open(b"a"):
                pass
        with (
            streams.open(b"b"),
            pytest.raises(Overloaded, match="node t has 2 event streams open, its cap max_streams = 2"),
        ):
            with streams.open(None):
                pass
    assert streams.open_total == 0
    with streams.open(b"a"), streams.open(b"b"):
        assert streams.open_total == 2
    with pytest.raises(ValueError, match="at least 1"):
        StreamAdmission(limit=0, per_token_limit=1)
