"""Hostile input over raw HTTP: no request gets a 500 or a non-JSON answer, and one
Worker's bad poll cannot stop the dispatch of everyone else's steps.

Each case here was a 500, a text/plain answer or a stalled dispatch before the fix that
came with it (see the git log of this file).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from dex_ha.engine.kinds import MAX_DURATION_MS
from dex_ha.server.node import NodeServer
from dex_ha.server.validation import InvalidRequest
from harness.waiting import eventually
from tests.server.node_fixture import (
    CLIENT_TOKEN,
    HttpApi,
    assert_error,
    call_view,
    cluster_plan,
    expect,
    model_result,
    node_config,
    tool,
    tool_call,
)

TOKEN_PATH = "/v1/worker/tasks/st999-1-1"
DEADLINE_S = 5.0


# ---------------------------------------------------------------- values the Raft log cannot carry

# JSON text for values that JSON allows but msgpack (the Raft log) or Python cannot take.
ABOVE_UINT64 = str(2**64)
BELOW_INT64 = str(-(2**63) - 1)
FIVE_THOUSAND_DIGITS = "9" * 5000  # over Python's int-string conversion limit (4300 digits)
LONE_SURROGATE = '"\\ud800"'

# (method, path, role, body with {v} where the value goes, the field the message must name)
FREE_FORM_PLACES = [
    ("POST", "/v1/sessions", "client", '{"agent": "a", "metadata": {"k": {v}}}', "metadata.k"),
    (
        "POST",
        f"{TOKEN_PATH}/complete",
        "worker",
        '{"result": {"status": "ok", "output": [1, {v}]}}',
        "result.output[1]",
    ),
    ("POST", "/v1/sessions/s1/questions/q1/answer", "client", '{"answer": {"choice": {v}}}', "answer.choice"),
    ("POST", "/v1/sessions/s1/tool-calls/c1/reconcile", "client", '{"outcome": "succeeded", "result": {v}}', "result"),
    ("PUT", "/v1/agents/a", "worker", '{"tools": [], "metadata": {"k": {v}}}', "metadata.k"),
    (
        "PUT",
        "/v1/agents/a",
        "worker",
        '{"tools": [{"name": "t", "effect": "read", "max_attempts": {v}}]}',
        "tools[0].max_attempts",
    ),
]
INTEGERS = {"above_uint64": ABOVE_UINT64, "below_int64": BELOW_INT64, "5000_digits": FIVE_THOUSAND_DIGITS}


async def send_raw(api: HttpApi, method: str, path: str, role: str, body: str) -> Any:
    return await api.call(method, path, role=role, data=body.encode(), headers={"Content-Type": "application/json"})


def place_id(place: tuple[str, ...]) -> str:
    return f"{place[0]} {place[1]} {place[4]}"


@pytest.mark.parametrize("value", INTEGERS.values(), ids=INTEGERS.keys())
@pytest.mark.parametrize(
    ("method", "path", "role", "template", "field"), FREE_FORM_PLACES, ids=[place_id(p) for p in FREE_FORM_PLACES]
)
async def test_an_integer_out_of_the_64_bit_range_is_400_naming_the_field(
    api: HttpApi, method, path, role, template, field, value
):
    reply = await send_raw(api, method, path, role, template.replace("{v}", value))
    assert_error(reply, 400, "invalid", names=f"{field}: integer out of range")


STRING_PLACES = [place for place in FREE_FORM_PLACES if place[4] != "tools[0].max_attempts"] + [
    ("POST", "/v1/sessions/s1/messages", "client", '{"text": {v}}', "text"),
    ("POST", f"{TOKEN_PATH}/fail", "worker", '{"error": {v}}', "error"),
]
SURROGATES = {"alone": LONE_SURROGATE, "inside text": '"abc\\udfffdef"', "high then high": '"\\ud800\\ud800"'}


@pytest.mark.parametrize("value", SURROGATES.values(), ids=SURROGATES.keys())
@pytest.mark.parametrize(
    ("method", "path", "role", "template", "field"), STRING_PLACES, ids=[place_id(p) for p in STRING_PLACES]
)
async def test_a_lone_surrogate_is_400_naming_the_field(api: HttpApi, method, path, role, template, field, value):
    reply = await send_raw(api, method, path, role, template.replace("{v}", value))
    assert_error(reply, 400, "invalid", names=f"{field}: must be valid Unicode text")


async def test_a_lone_surrogate_in_a_key_is_400_and_the_answer_escapes_it(api: HttpApi):
    reply = await send_raw(api, "POST", "/v1/sessions", "client", '{"agent": "a", "metadata": {"\\ud800": 1}}')
    assert_error(reply, 400, "invalid", names="metadata.\\ud800: key must be valid Unicode text")
    unknown = await send_raw(api, "POST", "/v1/sessions", "client", '{"agent": "a", "\\udfff": 1}')
    assert_error(unknown, 400, "invalid", names="\\udfff: unknown field")


async def test_the_64_bit_range_itself_is_stored_and_read_back(api: HttpApi):
    metadata = {"max": 2**63 - 1, "min": -(2**63), "float": 1e300}
    created = expect(await api.post("/v1/sessions", {"agent": "a", "session_id": "s-edge", "metadata": metadata}), 201)
    assert created["metadata"] == metadata
    assert (await api.snapshot("s-edge"))["metadata"] == metadata


# ---------------------------------------------------------------- every error answer is JSON


async def test_an_unknown_route_is_a_json_404(api: HttpApi):
    for method, path in [("GET", "/nope"), ("POST", "/v1/nothing/here"), ("GET", "/v1/sessions/s1/unknown")]:
        reply = await api.call(method, path, role="admin")
        assert_error(reply, 404, "not_found", names=path)


async def test_a_known_path_with_a_wrong_method_is_a_json_405_with_allow(api: HttpApi):
    reply = await api.call("DELETE", "/v1/sessions", role="admin")
    assert_error(reply, 405, "method_not_allowed", names="DELETE")
    assert set(reply.headers["Allow"].split(",")) == {"GET", "POST"}


MALFORMED_HTTP = {
    "bad Content-Length": b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
    "over-long header": b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
    "over-long request line": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "bad method": b"G(T /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "too many headers": b"GET /livez HTTP/1.1\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(200)) + b"\r\n",
    "bad chunk size": (
        b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\nzz\r\n"
    ),
    "raw byte in path": b"GET /v1/sessions/\xff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "TLS on the HTTP port": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
}


async def raw_exchange(node: NodeServer, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are; the status, headers and body of the answer (the server
    closes the connection after a malformed request)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", node.http_port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(DEADLINE_S):
            answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize("request_bytes", MALFORMED_HTTP.values(), ids=MALFORMED_HTTP.keys())
async def test_malformed_http_gets_a_json_error(node: NodeServer, api: HttpApi, request_bytes: bytes):
    status, headers, body = await raw_exchange(node, request_bytes)
    assert 400 <= status < 500, (status, body)
    assert headers["content-type"].startswith("application/json"), (headers, body)
    error = json.loads(body)
    assert error["error"] == "invalid" and error["message"].startswith("the HTTP request is malformed: "), error
    expect(await api.get("/readyz", role=None), 200)  # and the node goes on serving


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_does_not_inflate_is_400(node: NodeServer, api: HttpApi, encoding: str):
    status, headers, body = await raw_exchange(
        node,
        (
            b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + CLIENT_TOKEN.encode() + b"\r\n"
            b"Content-Encoding: " + encoding.encode() + b"\r\nContent-Length: 10\r\n\r\n0123456789"
        ),
    )
    assert status == 400 and headers["content-type"].startswith("application/json"), (status, body)
    assert json.loads(body) == {
        "error": "invalid",
        "message": "body: cannot be read: its Content-Encoding does not decode",
    }


# A client that hangs up mid-body: 499, never a 500 (tests/server/test_http_limits.py).


# ---------------------------------------------------------------- not_active says it once


async def test_the_not_active_message_says_it_once(nodes, http, tmp_path):
    plan = cluster_plan(tmp_path)
    api = http(await nodes(node_config(plan, "n1"), wait_ready=False))  # n2 and n3 never start: no leader

    # A fresh voter whose peers never answer waits for them (it neither votes nor campaigns):
    # it serves /v1/cluster and is not active.
    async def serving_but_not_active() -> bool:
        return expect(await api.get("/v1/cluster", role="client"), 200)["role"] in ("standby", "candidate")

    await eventually(serving_but_not_active, deadline_s=15, what="n1 to serve /v1/cluster")
    reply = await api.get("/v1/sessions", role="client")
    assert_error(reply, 503, "not_active")
    assert reply.body["message"] == "this node is not the active node"


# ---------------------------------------------------------------- one bad poll, everyone else dispatched


BAD_POLL = '{"worker_id": "evil", "agents": ["\\ud800"], "wait_ms": 20000}'


@pytest.mark.parametrize("agents", [["\ud800"], [""], ["line\nbreak"], ["x" * 201]], ids=repr)
async def test_a_poll_for_an_agent_name_that_is_not_an_id_is_400(api: HttpApi, agents):
    started = time.monotonic()
    reply = await api.post(
        "/v1/worker/poll", {"worker_id": "w", "agents": ["ok", *agents], "wait_ms": 20_000}, role="worker"
    )
    assert_error(reply, 400, "invalid", names="agents[1]")
    assert time.monotonic() - started < DEADLINE_S


async def queue_a_model_step(api: HttpApi, agent: str) -> None:
    await api.register_agent(agent, [])
    await api.create_session(agent, f"session-of-{agent}")
    await api.send_message(f"session-of-{agent}", "hello")


async def good_poll_gets_its_step(api: HttpApi, poll: asyncio.Task[Any]) -> None:
    started = time.monotonic()
    reply = await poll
    tasks = expect(reply, 200)["tasks"]
    assert [t["kind"] for t in tasks] == ["RunModel"], f"the good Worker got {tasks}"
    assert time.monotonic() - started < 3.0, "the queued step should be handed out at once"


async def test_a_bad_poll_over_http_is_refused_and_a_good_worker_gets_its_step(api: HttpApi, caplog):
    caplog.set_level(logging.WARNING, logger="dex_ha.server.leader")
    bad = asyncio.create_task(send_raw(api, "POST", "/v1/worker/poll", "worker", BAD_POLL))
    good = asyncio.create_task(
        api.post("/v1/worker/poll", {"worker_id": "good", "agents": ["helper"], "wait_ms": 5_000}, role="worker")
    )
    await queue_a_model_step(api, "helper")
    await good_poll_gets_its_step(api, good)
    async with asyncio.timeout(DEADLINE_S):
        assert_error(await bad, 400, "invalid", names="agents[0]")
    assert not [r for r in caplog.records if "restarting it" in r.getMessage()], "a leader service crashed"


async def test_a_poll_the_store_cannot_match_fails_alone_and_dispatch_goes_on(node: NodeServer, api: HttpApi, caplog):
    """The leader's own guard, below the route's validation: a poll whose agent names make
    the queue lookup raise gets that error; the dispatch service does not crash-loop."""
    caplog.set_level(logging.WARNING, logger="dex_ha.server.leader")
    leader = node.serving()
    bad = asyncio.create_task(leader.poll("evil", ["\ud800"], 1, 20_000))
    good = asyncio.create_task(
        api.post("/v1/worker/poll", {"worker_id": "good", "agents": ["helper"], "wait_ms": 5_000}, role="worker")
    )
    await queue_a_model_step(api, "helper")
    await good_poll_gets_its_step(api, good)
    with pytest.raises(InvalidRequest) as refused:
        async with asyncio.timeout(DEADLINE_S):
            await bad
    assert refused.value.field == "agents"
    assert not [r for r in caplog.records if "restarting it" in r.getMessage()], "a leader service crashed"


# ---------------------------------------------------------------- durations the leader services compute with

INT64_MAX = 2**63 - 1


async def test_a_tool_timeout_too_long_for_a_deadline_is_refused_and_the_longest_allowed_is_handed_out(
    api: HttpApi, caplog
):
    """With start_to_close_ms 2^63-1 accepted, every hand-out of the tool's step failed to
    apply (its deadline overflowed SQLite) and dispatch proposed it again at once, forever."""
    caplog.set_level(logging.WARNING, logger="dex_ha.server.leader")
    reply = await api.put("/v1/agents/slow", {"tools": [tool("crawl", "read", start_to_close_ms=INT64_MAX)]})
    assert_error(reply, 400, "invalid", names="definition.tools[0].start_to_close_ms")
    await api.start_turn_with_tool_calls(
        "slow", "s1", [tool("crawl", "read", start_to_close_ms=MAX_DURATION_MS)], [tool_call("c1", "crawl")]
    )
    task = await api.poll_one("slow")
    assert task["kind"] == "CallTool" and task["deadline_ms"] > time.time() * 1000 + MAX_DURATION_MS - 60_000


async def test_a_sleep_too_long_for_a_timer_fails_the_call_and_the_turn_goes_on(api: HttpApi):
    """A model asking to sleep 2^63-1 ms made the Worker's complete a 500 (the timer's due
    time overflowed SQLite); now the call fails as not run and the model hears about it."""
    await api.register_agent("sleeper", [])
    await api.create_session("sleeper", "s1")
    await api.send_message("s1", "nap")
    model = await api.poll_one("sleeper")
    await api.complete(model, model_result("napping", [tool_call("z", "sleep", ms=INT64_MAX)]))
    call = call_view(await api.snapshot("s1"), "z")
    assert call["status"] == "failed" and "sleep needs `ms`" in call["error"]
    assert (await api.poll_one("sleeper"))["kind"] == "RunModel"  # the turn goes on
