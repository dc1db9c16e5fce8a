"""harness/http_load.py and cluster_state.py, the overload harness: against a small
in-process HTTP server whose answers are known, the generator must count each answer under
its kind, status and error code, tell 503s without Retry-After apart, count a connection
the server resets as a transport error (not an answer), and refuse to run when the file
descriptor limit is too low."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from harness import http_load
from harness.cluster_state import ClusterSnapshot, FollowerGapSampler, NodeState, parse_gauge, term_changes
from harness.http_load import LoadConfig, LoadSetupError, error_code, percentile_ms, run_load
from harness.local_app import local_app
from harness.waiting import eventually

TOKEN = "t" * 24
MIX = {"get_session": 1.0, "list_sessions": 1.0, "create_session": 1.0, "metrics": 1.0}


def error(status: int, code: str, retry_after: bool) -> web.Response:
    headers = {"Retry-After": "1"} if retry_after else {}
    return web.json_response({"error": code, "message": "test"}, status=status, headers=headers)


def reset(request: web.Request) -> web.Response:
    """Close the connection with an RST (SO_LINGER 0) instead of answering."""
    assert request.transport is not None
    sock = request.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    request.transport.abort()
    return web.Response()  # never sent


def fake_node(session_answer: str = "overloaded") -> web.Application:
    """Creates: 201. Session GETs: 503 overloaded with Retry-After (or an RST). Lists: 503
    not_active without Retry-After. /metrics: 200, and refused with a token (a scraper
    sends none)."""

    def authorized(request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {TOKEN}"

    async def create(request: web.Request) -> web.Response:
        body = await request.json()
        if not authorized(request) or body.get("agent") != http_load.LOAD_AGENT or "session_id" not in body:
            return error(400, "invalid", False)
        return web.json_response({"session_id": body["session_id"]}, status=201)

    async def get_session(request: web.Request) -> web.Response:
        if session_answer == "reset":
            return reset(request)
        return error(503, "overloaded", True) if authorized(request) else error(401, "unauthorized", False)

    async def list_sessions(request: web.Request) -> web.Response:
        if request.query.get("limit") != "10" or not authorized(request):
            return error(400, "invalid", False)
        return error(503, "not_active", False)

    async def metrics(request: web.Request) -> web.Response:
        if "Authorization" in request.headers:
            return error(400, "invalid", False)
        return web.Response(text="dex_raft_term 3\n")

    app = web.Application()
    app.router.add_post("/v1/sessions", create)
    app.router.add_get("/v1/sessions", list_sessions)
    app.router.add_get("/v1/sessions/{sid}", get_session)
    app.router.add_get("/metrics", metrics)
    return app


@pytest.fixture
async def node_url() -> AsyncIterator[str]:
    async with local_app(fake_node()) as url:
        yield url


@pytest.fixture
async def resetting_node_url() -> AsyncIterator[str]:
    async with local_app(fake_node(session_answer="reset")) as url:
        yield url


async def test_every_answer_is_counted_by_kind_status_and_error_code(node_url: str) -> None:
    result = await run_load(
        LoadConfig(node_url, TOKEN, clients=8, duration_s=0.5, mix=MIX, seed_sessions=3, rng_seed=1)
    )

    kinds = result.by_kind
    assert set(kinds) == set(MIX)
    assert set(kinds["create_session"]) == {"2xx"} and set(kinds["metrics"]) == {"2xx"}
    assert set(kinds["get_session"]) == {"overloaded"}
    assert set(kinds["list_sessions"]) == {"not_active"}
    assert result.by_answer == {
        "201": kinds["create_session"]["2xx"],
        "200": kinds["metrics"]["2xx"],
        "503 overloaded": kinds["get_session"]["overloaded"],
        "503 not_active": kinds["list_sessions"]["not_active"],
    }
    assert result.answers == sum(result.by_answer.values())
    assert result.accepted == kinds["create_session"]["2xx"] + kinds["metrics"]["2xx"]
    assert result.other_non_2xx == 0
    # The not_active answers came without Retry-After; the overloaded ones with it.
    assert result.unavailable_without_retry_after == {"not_active": kinds["list_sessions"]["not_active"]}
    assert result.transport_errors == {}
    assert result.clients_answered == 8 and result.connections_opened >= 1
    assert result.p50_ms is not None and result.p99_ms is not None and 0 < result.p50_ms <= result.p99_ms


async def test_a_connection_reset_is_a_transport_error_not_an_answer(resetting_node_url: str) -> None:
    result = await run_load(
        LoadConfig(resetting_node_url, TOKEN, clients=4, duration_s=0.5, mix={"get_session": 1.0}, seed_sessions=1)
    )

    assert result.answers == 0 and result.by_kind == {}
    assert result.transport_error_count > 0
    # Whether the client sees the RST while it writes or while it reads decides the class.
    assert set(result.transport_errors) <= {"reset", "disconnected"}, result.error_examples
    assert set(result.transport_errors_by_kind) == {"get_session"}


def test_too_low_a_hard_fd_limit_is_refused_with_the_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_load.resource, "getrlimit", lambda _: (1024, 4096))
    with pytest.raises(LoadSetupError, match=r"5256 file descriptors needed .* hard limit RLIMIT_NOFILE is 4096"):
        http_load.raise_fd_limit(http_load.fds_needed(5000))


def test_the_soft_fd_limit_is_raised_to_the_hard_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"now": (1024, 65536)}
    monkeypatch.setattr(http_load.resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(http_load.resource, "setrlimit", lambda _, value: limits.update(now=value))
    assert http_load.raise_fd_limit(5256) == (65536, 65536)


def test_a_soft_fd_limit_that_is_enough_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_load.resource, "getrlimit", lambda _: (8192, 65536))
    monkeypatch.setattr(http_load.resource, "setrlimit", lambda *_: pytest.fail("setrlimit called"))
    assert http_load.raise_fd_limit(5256) == (8192, 65536)


def test_error_codes_come_from_json_error_bodies_only() -> None:
    assert error_code(201, b"not json") == "2xx"
    assert error_code(503, json.dumps({"error": "overloaded"}).encode()) == "overloaded"
    assert error_code(502, b"<html>bad gateway</html>") == "http_502"
    assert error_code(500, b"[1, 2]") == "http_500"


def test_percentiles_pick_the_nearest_rank() -> None:
    values = [i / 1000 for i in range(1, 101)]
    assert percentile_ms(values, 50) == 50.0 and percentile_ms(values, 99) == 99.0
    assert percentile_ms([], 50) is None


def test_the_contact_gap_gauge_is_read_when_present_and_none_when_absent() -> None:
    text = (
        "# HELP dex_raft_leader_contact_gap_max_seconds gap\n"
        "dex_raft_leader_contact_gap_max_seconds_other 9.0\n"
        "dex_raft_leader_contact_gap_max_seconds 0.125\n"
    )
    assert parse_gauge(text, "dex_raft_leader_contact_gap_max_seconds") == 0.125
    assert parse_gauge("dex_raft_term 3\n", "dex_raft_leader_contact_gap_max_seconds") is None


def test_terms_and_follower_gaps_from_snapshots() -> None:
    before = ClusterSnapshot(
        (
            NodeState("n1", "u1", 2, "active", "n1", 0.9),
            NodeState("n2", "u2", 2, "standby", "n1", 0.05),
            NodeState("n3", "u3", 2, "standby", "n1", None),
        )
    )
    after = ClusterSnapshot(
        (
            NodeState("n1", "u1", 3, "standby", "n2"),
            NodeState("n2", "u2", 3, "active", "n2"),
            NodeState("n3", "u3", error="timeout"),
        )
    )
    assert before.settled and not after.settled
    assert term_changes(before, after) == 1
    assert before.largest_follower_gap_s() == 0.05  # the active node's own value does not count
    assert after.largest_follower_gap_s() is None  # n/a: no follower exports the gauge


async def test_the_sampler_keeps_the_largest_gap_even_after_the_gauge_restarts() -> None:
    # A follower's gauge: 0.1 s, then 0.4 s, then a new term restarts it at 0.05 s.
    values = iter(["0.1", "0.4", "0.05"])

    async def metrics(request: web.Request) -> web.Response:
        value = next(values, None)
        return web.Response(
            text="dex_raft_term 1\n" if value is None else f"dex_raft_leader_contact_gap_max_seconds {value}\n"
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with local_app(app) as url:
        async with FollowerGapSampler({"n2": url}, interval_s=0.01) as sampler:
            # three values, then no gauge
            await eventually(lambda: sampler.samples >= 4, "four samples", 10, interval_s=0.01)
    assert sampler.samples >= 4
    assert sampler.max_gap_s == 0.4
