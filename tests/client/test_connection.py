"""Connection: leader following, retries, backoff and errors, against fake nodes on loopback."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from dex_ha.client import Connection, DexError, DexUnavailable
from dex_ha.client.sse import read_events
from harness.local_app import start_local_app
from tests.client.fake_server import (
    FakeCluster,
    FakeNode,
    FakeSleep,
    Fault,
    LowerBoundRng,
    RefusedPort,
    UpperBoundRng,
    start_nodes,
)


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    yield FakeCluster()


@pytest.fixture
async def nodes(cluster: FakeCluster) -> AsyncIterator[list[FakeNode]]:
    """Three nodes: the first active, the others standbys naming it."""
    started = await start_nodes(cluster, "active", "standby", "standby")
    for node in started[1:]:
        node.leader_url = started[0].url
    yield started
    for node in started:
        await node.stop()


@pytest.fixture
def refused() -> Iterator[RefusedPort]:
    port = RefusedPort()
    yield port
    port.close()


def standby_503(leader_url: str | None = None) -> Fault:
    return Fault(
        "status", 503, {"error": "not_active", "message": "standby", "leader_url": leader_url}, {"Retry-After": "1"}
    )


# ---------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("urls", [[], "", "ftp://x", ["http://ok:1", "node2:8801"], "http://"])
def test_bad_urls_are_rejected_naming_the_argument(urls: object) -> None:
    with pytest.raises(ValueError, match="urls"):
        Connection(urls)  # type: ignore[arg-type]


def test_urls_lose_their_trailing_slash() -> None:
    conn = Connection(["http://127.0.0.1:1/", "https://h:2//"])
    assert conn.urls == ["http://127.0.0.1:1", "https://h:2"]
    assert conn.current_url == "http://127.0.0.1:1"


def test_bad_backoff_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="backoff_max_s"):
        Connection("http://h:1", backoff_initial_s=1.0, backoff_max_s=0.5)
    with pytest.raises(ValueError, match="request_timeout_s"):
        Connection("http://h:1", request_timeout_s=0)
    with pytest.raises(TypeError, match="token"):
        Connection("http://h:1", token=123)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- following the leader


async def test_503_with_leader_url_moves_a_multi_url_connection_to_the_leader(nodes: list[FakeNode]) -> None:
    active, standby, _ = nodes
    fake = FakeSleep()
    async with Connection([standby.url, active.url], sleep=fake) as conn:
        answer = await conn.request("GET", "/v1/echo")
        assert answer["ok"] is True
        assert conn.current_url == active.url
        await conn.request("GET", "/v1/echo")  # stays on the leader now
    assert len(standby.requests_to("/v1/echo")) == 1
    assert len(active.requests_to("/v1/echo")) == 2
    assert fake.sleeps == []  # following a named leader costs no wait


async def test_leader_url_outside_the_list_is_followed(nodes: list[FakeNode], refused: RefusedPort) -> None:
    active, standby, _ = nodes
    async with Connection([standby.url, refused.url], sleep=FakeSleep()) as conn:
        await conn.request("GET", "/v1/echo")
        assert conn.current_url == active.url
    assert len(active.requests_to("/v1/echo")) == 1


async def test_503_without_leader_rotates_through_the_list(nodes: list[FakeNode]) -> None:
    active, standby1, standby2 = nodes
    standby1.leader_url = standby2.leader_url = None  # an election: nobody knows the leader
    async with Connection([standby1.url, standby2.url, active.url], sleep=FakeSleep()) as conn:
        await conn.request("GET", "/v1/echo")
        assert conn.current_url == active.url
    assert [len(n.requests_to("/v1/echo")) for n in (standby1, standby2, active)] == [1, 1, 1]


@pytest.mark.parametrize("code", ["overloaded", "unavailable"])
async def test_the_active_nodes_own_503_keeps_a_multi_url_connection_there_and_backs_off(
    nodes: list[FakeNode], code: str
) -> None:
    """`overloaded` (it sheds load) and `unavailable` (a write not committed in time: it may
    still commit, and the same request again is safe) come from the active node itself."""
    active, standby, _ = nodes
    fake = FakeSleep()
    overloaded = Fault("status", 503, {"error": code, "message": "not now"}, {"Retry-After": "1"})
    async with Connection([active.url, standby.url], sleep=fake, rng=LowerBoundRng()) as conn:
        active.add_faults(overloaded, overloaded)
        answer = await conn.request("GET", "/v1/echo")
        assert answer["ok"] is True
        assert conn.current_url == active.url
    # The busy node IS the active node: no request went to a standby, and each retry waited.
    assert len(active.requests_to("/v1/echo")) == 3
    assert standby.requests == []
    assert len(fake.sleeps) == 2 and all(s > 0 for s in fake.sleeps)


async def test_single_url_stays_put_and_retries_until_the_node_is_active(nodes: list[FakeNode]) -> None:
    _, standby, _ = nodes
    fake = FakeSleep()
    async with Connection(standby.url, sleep=fake) as conn:
        # The node answers 503 naming a leader, which a single URL must not follow;
        # after four refusals it becomes active (the load balancer's node took the lease).
        standby.add_faults(*[standby_503(nodes[0].url)] * 4)
        standby.become_active()
        answer = await conn.request("GET", "/v1/echo")
        assert answer["ok"] is True
        assert conn.current_url == standby.url
    assert len(standby.requests_to("/v1/echo")) == 5
    assert len(nodes[0].requests) == 0
    assert len(fake.sleeps) == 4


async def test_a_refused_port_is_skipped_without_waiting(nodes: list[FakeNode], refused: RefusedPort) -> None:
    active = nodes[0]
    fake = FakeSleep()
    async with Connection([refused.url, active.url], sleep=fake) as conn:
        answer = await conn.request("GET", "/v1/echo")
        assert answer["ok"] is True
        assert conn.current_url == active.url
    assert fake.sleeps == []


async def test_dropped_connection_and_502_504_are_retried(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    # Two drops in a row: aiohttp itself retries a GET once on a dropped connection.
    active.add_faults(
        Fault("drop"), Fault("drop"), Fault("status", 502, {"error": "bad_gateway"}), Fault("status", 504, None)
    )
    fake = FakeSleep()
    async with Connection(active.url, sleep=fake) as conn:
        assert (await conn.request("GET", "/v1/echo"))["ok"] is True
    assert len(active.requests_to("/v1/echo")) == 5
    assert len(fake.sleeps) >= 3  # the drop(s), the 502 and the 504 each cost a backoff


async def test_a_post_dropped_without_answer_is_sent_again(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    active.add_faults(Fault("drop"))
    async with Connection(active.url, sleep=FakeSleep()) as conn:
        assert (await conn.request("POST", "/v1/echo", {"n": 1}))["body"] == {"n": 1}
    assert [r.body for r in active.requests_to("/v1/echo")] == [{"n": 1}, {"n": 1}]


async def test_a_request_timeout_is_retried(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    active.add_faults(Fault("delay", delay_s=2.0))
    started = time.monotonic()
    async with Connection(active.url, request_timeout_s=0.2, sleep=FakeSleep()) as conn:
        assert (await conn.request("GET", "/v1/echo"))["ok"] is True
    assert len(active.requests_to("/v1/echo")) == 2
    assert time.monotonic() - started < 1.5  # it did not wait for the slow answer


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("status, code", [(400, "invalid"), (404, "not_found"), (409, "conflict"), (500, "internal")])
async def test_4xx_and_500_raise_dex_error_and_are_not_retried(nodes: list[FakeNode], status: int, code: str) -> None:
    active = nodes[0]
    active.add_faults(Fault("status", status, {"error": code, "message": f"it said {status}"}))
    async with Connection(active.url, sleep=FakeSleep()) as conn:
        with pytest.raises(DexError) as info:
            await conn.request("POST", "/v1/echo", {"x": 1})
    assert (info.value.status, info.value.code, info.value.message) == (status, code, f"it said {status}")
    assert info.value.body == {"error": code, "message": f"it said {status}"}
    assert len(active.requests_to("/v1/echo")) == 1


async def test_an_error_without_json_body_still_has_a_code(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    async with Connection(active.url) as conn:
        with pytest.raises(DexError) as info:
            await conn.request("GET", "/v1/no-such-route")
    assert info.value.status == 404
    assert info.value.code == "http_404"


async def test_give_up_after_raises_dex_unavailable_naming_time_and_last_error(nodes: list[FakeNode]) -> None:
    _, standby, _ = nodes
    started = time.monotonic()
    async with Connection(standby.url, give_up_after_s=0.4, backoff_initial_s=0.02, backoff_max_s=0.1) as conn:
        with pytest.raises(DexUnavailable) as info:
            await conn.request("GET", "/v1/echo")
    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 2.0
    error = info.value
    assert (error.status, error.code) == (503, "unavailable")
    assert "give_up_after_s=0.4" in error.message
    assert "not_active" in error.message  # the last error
    assert "no active dex-ha node answered after trying for" in error.message
    assert standby.url in error.message
    assert len(standby.requests_to("/v1/echo")) >= 2


async def test_giving_up_on_an_overloaded_active_node_says_it_sheds_load(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    active.add_faults(*[Fault("status", 503, {"error": "overloaded"}, {"Retry-After": "0"})] * 1000)
    async with Connection(active.url, give_up_after_s=0.3, backoff_initial_s=0.02, backoff_max_s=0.05) as conn:
        with pytest.raises(DexUnavailable) as info:
            await conn.request("GET", "/v1/echo")
    assert "the active dex-ha node kept shedding load after trying for" in info.value.message
    assert "overloaded" in info.value.message  # the last error


async def test_giving_up_on_writes_the_active_node_cannot_commit_says_so(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    active.add_faults(*[Fault("status", 503, {"error": "unavailable"}, {"Retry-After": "0"})] * 1000)
    async with Connection(active.url, give_up_after_s=0.3, backoff_initial_s=0.02, backoff_max_s=0.05) as conn:
        with pytest.raises(DexUnavailable) as info:
            await conn.request("POST", "/v1/echo", {"message_id": "m1"})
    assert "the active dex-ha node kept failing to commit the write in time after trying for" in info.value.message
    assert "503 unavailable" in info.value.message  # the last error


async def test_give_up_after_also_covers_unreachable_nodes(refused: RefusedPort) -> None:
    async with Connection([refused.url, refused.url + "/"], give_up_after_s=0.2, backoff_max_s=0.05) as conn:
        with pytest.raises(DexUnavailable, match="Connect|connect"):
            await conn.request("GET", "/v1/echo")


# ---------------------------------------------------------------------------- backoff


async def test_backoff_doubles_to_its_cap_and_resets_after_success(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    fake = FakeSleep()
    conn = Connection(active.url, backoff_initial_s=0.05, backoff_max_s=0.4, rng=UpperBoundRng(), sleep=fake)
    async with conn:
        active.add_faults(*[Fault("status", 503, {"error": "not_active"})] * 6)
        await conn.request("GET", "/v1/echo")
        assert fake.sleeps == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.4, 0.4])
        active.add_faults(*[Fault("status", 503, {"error": "not_active"})] * 2)
        await conn.request("GET", "/v1/echo")
    assert fake.sleeps[6:] == pytest.approx([0.05, 0.1])  # the success reset it


async def test_backoff_is_full_jitter_drawn_from_the_injected_rng(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    fake = FakeSleep()
    async with Connection(
        active.url, backoff_initial_s=0.1, backoff_max_s=0.8, rng=random.Random(7), sleep=fake
    ) as conn:
        active.add_faults(*[Fault("status", 503, {"error": "not_active"})] * 8)
        await conn.request("GET", "/v1/echo")
    replay = random.Random(7)
    caps = [0.1, 0.2, 0.4, 0.8, 0.8, 0.8, 0.8, 0.8]
    assert fake.sleeps == pytest.approx([replay.uniform(0, cap) for cap in caps])
    assert all(0 <= s <= cap for s, cap in zip(fake.sleeps, caps, strict=True))
    assert len({round(s, 9) for s in fake.sleeps}) == len(fake.sleeps)  # jittered, not a fixed ladder


async def test_retry_after_is_honoured_only_up_to_the_backoff_cap(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    fake = FakeSleep()
    async with Connection(
        active.url, backoff_initial_s=0.05, backoff_max_s=0.2, rng=LowerBoundRng(), sleep=fake
    ) as conn:
        retry_later = Fault("status", 503, {"error": "not_active"}, {"Retry-After": "30"})
        active.add_faults(retry_later, retry_later, retry_later, retry_later)
        await conn.request("GET", "/v1/echo")
    # Jitter drew 0 each time; Retry-After (30 s) lifted each wait to the cap, not to 30 s.
    assert fake.sleeps == pytest.approx([0.05, 0.1, 0.2, 0.2])


async def test_rotation_is_free_once_through_the_list_then_backs_off(refused: RefusedPort) -> None:
    other = RefusedPort()
    try:
        fake = FakeSleep()
        async with Connection(
            [refused.url, other.url],
            give_up_after_s=3.0,
            sleep=fake,
            clock=fake.clock,
            rng=UpperBoundRng(),
            backoff_initial_s=0.5,
            backoff_max_s=1.0,
        ) as conn:
            with pytest.raises(DexUnavailable):
                await conn.request("GET", "/v1/echo")
        # 1st failure: free switch; then waits 0.5, 1.0, 1.0 and a last 0.5 up to the 3 s limit.
        assert fake.sleeps == pytest.approx([0.5, 1.0, 1.0, 0.5])
    finally:
        other.close()


@pytest.mark.parametrize(
    "error, why",
    [
        ("not_active", "no active node yet"),
        ("overloaded", "the active node is shedding load"),
        ("unavailable", "the active node cannot commit writes in time (too few nodes replicate)"),
    ],
)
async def test_slow_retries_warn_at_most_once_per_five_seconds(
    nodes: list[FakeNode], caplog: pytest.LogCaptureFixture, error: str, why: str
) -> None:
    """The warning says why: no active node, or an active node that sheds load (then
    looking for another node would not help)."""
    active = nodes[0]
    fake = FakeSleep(advance_by=1.0)  # each failed try costs one fake second
    async with Connection(active.url, sleep=fake, clock=fake.clock) as conn:
        active.add_faults(*[Fault("status", 503, {"error": error})] * 17)
        with caplog.at_level(logging.INFO, logger="dex_ha.client"):
            await conn.request("GET", "/v1/echo")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "dex_ha.client"]
    # Failures at fake seconds 0..16: warnings once past 5 s, then every 5 s: at 6, 11, 16.
    assert len(warnings) == 3
    assert all(f"still retrying after {t:.1f} s, {why};" in w.getMessage() for t, w in zip((6, 11, 16), warnings))


async def test_switching_node_is_logged_at_info(nodes: list[FakeNode], caplog: pytest.LogCaptureFixture) -> None:
    active, standby, _ = nodes
    with caplog.at_level(logging.INFO, logger="dex_ha.client"):
        async with Connection([standby.url, active.url]) as conn:
            await conn.request("GET", "/v1/echo")
    switches = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "switching" in r.getMessage()]
    assert switches and active.url in switches[0]


# ---------------------------------------------------------------------------- headers and bodies


async def test_token_and_json_headers_are_sent(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    async with Connection(active.url, token="sekret") as conn:
        answer = await conn.request("POST", "/v1/echo", {"a": [1, 2]}, params={"q": "v w"})
    assert answer["body"] == {"a": [1, 2]}
    recorded = active.requests_to("/v1/echo")[0]
    assert recorded.headers["Authorization"] == "Bearer sekret"
    assert recorded.headers["Content-Type"] == "application/json"
    assert recorded.query == {"q": "v w"}


async def test_no_token_means_no_authorization_header(nodes: list[FakeNode]) -> None:
    active = nodes[0]
    async with Connection(active.url) as conn:
        await conn.request("GET", "/v1/echo")
    assert "Authorization" not in active.requests_to("/v1/echo")[0].headers


async def test_open_stream_follows_the_leader_and_keeps_the_stream_open(nodes: list[FakeNode]) -> None:
    active, standby, _ = nodes
    await active.cluster.commit_event("s1", "turn_started", {"n": 1})
    async with Connection([standby.url, active.url], token="t", request_timeout_s=0.3) as conn:
        resp = await conn.open_stream("/v1/sessions/s1/events", {"Last-Event-ID": "5"})
        try:
            assert resp.status == 200
            first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
            assert first == b": keep-alive\n\n"
            # Longer than request_timeout_s: a stream has no read timeout.
            second = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
            assert second.startswith(b"id: 100\n")
        finally:
            resp.close()
    recorded = active.requests_to("/v1/sessions/s1/events")[0]
    assert recorded.headers["Last-Event-ID"] == "5"
    assert recorded.headers["Authorization"] == "Bearer t"


async def test_the_session_is_made_inside_the_running_loop_and_closed(nodes: list[FakeNode]) -> None:
    conn = Connection(nodes[0].url)  # built outside any request: no session yet
    assert conn._session is None
    await conn.request("GET", "/v1/echo")
    session = conn._session
    assert session is not None and not session.closed
    await conn.close()
    assert session.closed


async def test_a_stream_that_goes_silent_times_out_instead_of_hanging() -> None:
    """A node that vanished without closing the connection must not hang an event reader."""
    from aiohttp import web

    async def silent(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": hello\n\n")
        await asyncio.sleep(30)  # then nothing, like a partitioned node
        return response

    app = web.Application()
    app.router.add_get("/v1/sessions/s1/events", silent)
    runner, url = await start_local_app(app, shutdown_timeout=0.1)
    conn = Connection(url)
    try:
        resp = await conn.open_stream("/v1/sessions/s1/events")
        started = asyncio.get_running_loop().time()
        with pytest.raises(asyncio.TimeoutError):
            async for _ in read_events(resp, idle_timeout_s=0.3):
                pass
        assert asyncio.get_running_loop().time() - started < 5
        resp.release()
    finally:
        await conn.close()
        await runner.cleanup()
