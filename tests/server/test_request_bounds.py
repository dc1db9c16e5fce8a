"""Bounded work per request: what one careless or hostile client can make a node hold.

- Caps (413 `too_large` naming the field, the cap and its setting): a session's or an
  agent's metadata, a user message, an answer, a Worker's result and a reconcile's.
- Pages with a byte budget: a list of sessions stops once it holds `page_max_bytes` and
  says where to go on (`next_after`), whatever `limit` asked for; one session bigger than
  the budget comes alone. Event reads have the same budget (an SSE stream still sends all).
- Items: a body holds at most MAX_JSON_ITEMS array elements and object members (413).
- Bodies: a Content-Length over the route's limit is answered 413 before any of the body
  is sent; a chunked body is answered 413 as soon as it passes the limit; and the bytes of
  the bodies in flight count in admission (503 `overloaded` past `max_inflight_body_bytes`,
  before the body is read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dex_ha.engine import Page
from dex_ha.server.api_spec import ROUTES_BY_NAME
from dex_ha.server.config import ConfigError, ServerConfig
from dex_ha.server.validation import MAX_JSON_ITEMS, TooManyItems, decode_json_body
from harness.waiting import eventually
from tests.server.conftest import HttpFactory, NodeFactory
from tests.server.node_fixture import (
    CLIENT_TOKEN,
    WORKER_TOKEN,
    HttpApi,
    assert_error,
    expect,
    model_result,
    open_sse,
    single_node_config,
    tool,
)
from tests.server.test_http_limits import connect, post_head, sample

CAP = 2000  # bytes: every size cap of the small-caps node below
PAGE_BUDGET = 64 << 10  # the smallest page_max_bytes allowed


def metadata_of_size(size: int) -> dict[str, str]:
    """A metadata object whose compact JSON is exactly `size` bytes."""
    return {"pad": "x" * (size - len('{"pad":""}'))}


def small_caps_config(tmp_path: Path, **overrides: Any) -> ServerConfig:
    return single_node_config(
        tmp_path / "node", max_metadata_bytes=CAP, max_message_bytes=CAP, max_result_bytes=CAP, **overrides
    )


def assert_too_large(reply: Any, field: str, setting: str, cap: int) -> None:
    assert_error(reply, 413, "too_large")
    message = reply.error_message()
    assert message.startswith(f"{field}: must be at most {cap} bytes"), message
    assert setting in message, message


# ---------------------------------------------------------------- caps


async def test_the_repro_metadata_of_1_mb_is_413_naming_the_field_on_a_default_node(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path
):
    api = http(await nodes(single_node_config(tmp_path / "node")))
    reply = await api.post("/v1/sessions", {"agent": "a", "session_id": "s1", "metadata": metadata_of_size(1_000_000)})
    assert_too_large(reply, "metadata", "max_metadata_bytes", ServerConfig.max_metadata_bytes)
    expect(await api.post("/v1/sessions", {"agent": "a", "metadata": metadata_of_size(64 << 10)}), 201)


@pytest.mark.covers("create_session", "register_agent", "send_message", "task_complete")
async def test_every_capped_field_is_413_over_its_cap_and_accepted_at_it(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path
):
    api = http(await nodes(small_caps_config(tmp_path)))
    at, over = metadata_of_size(CAP), metadata_of_size(CAP + 1)
    assert_too_large(
        await api.put("/v1/agents/a", {"tools": [], "metadata": over}), "metadata", "max_metadata_bytes", CAP
    )
    expect(await api.put("/v1/agents/a", {"tools": [tool("lookup")], "metadata": at}), 200)
    new_session = {"agent": "a", "session_id": "s1"}
    assert_too_large(
        await api.post("/v1/sessions", {**new_session, "metadata": over}), "metadata", "max_metadata_bytes", CAP
    )
    expect(await api.post("/v1/sessions", {**new_session, "metadata": at}), 201)
    # A message is measured in UTF-8: 667 three-byte characters are 2001 bytes.
    for text in ("x" * (CAP + 1), "€" * 667):
        reply = await api.post("/v1/sessions/s1/messages", {"text": text})
        assert_too_large(reply, "text", "max_message_bytes", CAP)
    await api.send_message("s1", "€" * 666)
    task = await api.poll_one("a")
    big_result = model_result("y" * CAP)
    reply = await api.post(
        f"/v1/worker/tasks/{task['task_token']}/complete",
        {"worker_id": "worker-1", "result": big_result},
        role="worker",
    )
    assert_too_large(reply, "result", "max_result_bytes", CAP)
    await api.complete(task, model_result("done"))


async def test_answers_and_reconciles_are_capped_too(nodes: NodeFactory, http: HttpFactory, tmp_path: Path):
    """Checked before the route's own checks (no such question or call): the cap is the first answer."""
    api = http(await nodes(small_caps_config(tmp_path)))
    reply = await api.post("/v1/sessions/s1/questions/q1/answer", {"answer": ["x" * CAP]})
    assert_too_large(reply, "answer", "max_message_bytes", CAP)
    reply = await api.post(
        "/v1/sessions/s1/tool-calls/c1/reconcile", {"outcome": "succeeded", "result": {"out": "x" * CAP}}
    )
    assert_too_large(reply, "result", "max_result_bytes", CAP)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("max_metadata_bytes", 0, "max_metadata_bytes: must be from 1 to 1048576"),
        ("max_metadata_bytes", (1 << 20) + 1, "max_metadata_bytes: must be from 1 to 1048576"),
        ("max_result_bytes", (4 << 20) + 1, "max_result_bytes: must be from 1 to 4194304"),
        ("max_inflight_body_bytes", 1 << 20, "max_inflight_body_bytes: must be at least 4194304"),
        ("page_max_bytes", 1000, "page_max_bytes: must be at least 65536"),
    ],
)
def test_bound_settings_are_checked(tmp_path: Path, setting: str, value: int, message: str):
    with pytest.raises(ConfigError, match=message):
        overrides: dict[str, Any] = {setting: value}  # a ServerConfig field, named by the parameter
        single_node_config(tmp_path, **overrides).check()


def test_the_bound_settings_load_from_the_environment(tmp_path: Path):
    from dex_ha.server.config import dev_overrides_from_env

    env = {
        "DEX_HA_MAX_METADATA_BYTES": "1000",
        "DEX_HA_PAGE_MAX_BYTES": "100000",
        "DEX_HA_MAX_INFLIGHT_BODY_BYTES": "5",
    }
    assert dev_overrides_from_env(env) == {
        "max_metadata_bytes": 1000,
        "page_max_bytes": 100_000,
        "max_inflight_body_bytes": 5,
    }


# ---------------------------------------------------------------- pages


async def create_sessions(api: HttpApi, count: int, metadata_bytes: int) -> list[str]:
    ids = [f"s{i:03d}" for i in range(count)]
    for session_id in ids:
        body = {"agent": "a", "session_id": session_id, "metadata": metadata_of_size(metadata_bytes)}
        expect(await api.post("/v1/sessions", body), 201)
    return ids


async def all_pages(api: HttpApi, limit: int) -> list[dict[str, Any]]:
    pages, after = [], None
    while True:
        params = {"limit": str(limit), **({"after": after} if after else {})}
        page = expect(await api.get("/v1/sessions", params=params), 200)
        pages.append(page)
        after = page["next_after"]
        if after is None:
            return pages


@pytest.mark.covers("list_sessions")
async def test_a_page_of_sessions_stops_at_its_byte_budget_and_says_where_to_go_on(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path
):
    api = http(await nodes(single_node_config(tmp_path / "node", page_max_bytes=PAGE_BUDGET)))
    ids = await create_sessions(api, 12, metadata_bytes=20_000)  # 240 KB in all: about 4 budgets
    pages = await all_pages(api, limit=1000)
    sizes = [len(json.dumps(page).encode()) for page in pages]
    assert len(pages) >= 4, f"limit=1000 must not put all 240 KB on one page: page sizes {sizes}"
    assert all(size <= PAGE_BUDGET + 25_000 for size in sizes), (
        f"a page holds more than the budget and one more: {sizes}"
    )
    listed = [s["session_id"] for page in pages for s in page["sessions"]]
    assert listed == ids[::-1], "every session once, newest first, across the pages"


async def test_a_session_bigger_than_the_page_budget_comes_alone(nodes: NodeFactory, http: HttpFactory, tmp_path: Path):
    config = single_node_config(tmp_path / "node", page_max_bytes=PAGE_BUDGET, max_metadata_bytes=200_000)
    api = http(await nodes(config))
    ids = await create_sessions(api, 3, metadata_bytes=150_000)
    pages = await all_pages(api, limit=100)
    listed = [[s["session_id"] for s in page["sessions"]] for page in pages]
    assert listed == [[i] for i in ids[::-1]] + [[]], "one session a page (a full page may be followed by an empty one)"


async def test_an_event_stream_sends_every_event_across_reads_of_the_page_budget(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path
):
    node = await nodes(single_node_config(tmp_path / "node", page_max_bytes=PAGE_BUDGET))
    api = http(node)
    await create_sessions(api, 1, metadata_bytes=10)
    texts = [f"{i}:" + "m" * 30_000 for i in range(6)]  # about 3 budgets of events
    for i, text in enumerate(texts):
        await api.send_message("s000", text, message_id=f"m{i}")
    first = node.replica.reads.events_page("s000", 0, 1000, PAGE_BUDGET)
    every_event = node.replica.reads.events("s000", 0, 1000)
    assert isinstance(first, Page) and first.more and len(first.items) < len(every_event), "a read stops at the budget"
    response, stream = await open_sse(api, "s000")
    try:
        received = [e for e in await stream.until(lambda e: e.data.get("data", {}).get("text") == texts[-1])]
    finally:
        response.close()
    seen = [e.data["data"]["text"] for e in received if e.event == "message_received"]
    assert seen == texts


async def test_a_read_of_events_after_the_last_one_of_a_big_entry_moves_on(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path
):
    """The entry of the resume point holds more than the budget but nothing after it: the
    read must not come back empty with `more` (a stream would read it again forever)."""
    node = await nodes(single_node_config(tmp_path / "node", page_max_bytes=PAGE_BUDGET))
    api = http(node)
    await create_sessions(api, 1, metadata_bytes=10)
    await api.send_message("s000", "b" * (PAGE_BUDGET + 1000), message_id="big")
    reads = node.replica.reads
    big = next(e for e in reads.events("s000") if e.type == "message_received")
    last_of_its_entry = max(e.event_id for e in reads.events("s000") if e.event_id >> 16 == big.event_id >> 16)
    page = reads.events_page("s000", last_of_its_entry, 1000, PAGE_BUDGET)
    assert page.items or not page.more, "an empty read that says there is more"


# ---------------------------------------------------------------- bodies


async def test_a_content_length_over_the_limit_is_413_before_the_body_is_sent(nodes: NodeFactory, tmp_path: Path):
    node = await nodes(single_node_config(tmp_path / "node"))
    route = ROUTES_BY_NAME["task_complete"]
    conn = await connect(
        node.http_port,
        post_head(
            "/v1/worker/tasks/t/complete",
            route.max_body_bytes + 1,
            f"Authorization: Bearer {WORKER_TOKEN}\r\n".encode(),
        ),
    )
    try:
        status, _headers, body = await conn.response(timeout_s=5)  # not one byte of the body was sent
    finally:
        conn.close()
    assert status == 413 and json.loads(body)["error"] == "too_large", body
    assert f"at most {route.max_body_bytes} bytes" in json.loads(body)["message"]


async def test_a_chunked_body_is_413_as_soon_as_it_passes_the_limit(nodes: NodeFactory, tmp_path: Path):
    """The body never ends: only a node that counts while it reads can answer."""
    node = await nodes(single_node_config(tmp_path / "node"))
    limit = ROUTES_BY_NAME["task_heartbeat"].max_body_bytes
    head = (
        "POST /v1/worker/tasks/t/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {WORKER_TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = b"x" * (64 << 10)
    conn = await connect(node.http_port, head)
    try:
        for _ in range(limit // len(chunk) + 1):  # just past the limit, and no last chunk
            await conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, _headers, body = await conn.response(timeout_s=5)
    finally:
        conn.close()
    assert status == 413 and json.loads(body)["error"] == "too_large", body


async def test_bodies_past_the_bytes_in_flight_get_503_overloaded_before_they_are_read(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path
):
    budget = 4 << 20  # the smallest allowed: the largest route limit
    node = await nodes(single_node_config(tmp_path / "node", max_inflight_body_bytes=budget))
    auth = f"Authorization: Bearer {CLIENT_TOKEN}\r\n".encode()
    # One body of 3 MiB starts and stalls half way: it holds its 3 MiB meanwhile.
    holder = await connect(node.http_port, post_head("/v1/sessions/s1/messages", 3 << 20, auth) + b'{"text": "')
    try:
        await eventually(lambda: _body_bytes(node, 3 << 20), deadline_s=5, what="the stalled body to count its 3 MiB")
        second = await connect(node.http_port, post_head("/v1/sessions/s1/messages", 2 << 20, auth))
        try:
            status, headers, body = await second.response(timeout_s=5)  # its body was never sent
        finally:
            second.close()
        assert (status, json.loads(body)["error"]) == (503, "overloaded"), body
        assert headers["retry-after"] == "1" and "max_inflight_body_bytes" in json.loads(body)["message"]
        assert sample(node, "dex_http_request_body_bytes_in_flight") == 3 << 20
    finally:
        holder.close()
    await eventually(lambda: _body_bytes(node, 0), deadline_s=5, what="the stalled body's bytes to be given back")
    api = http(node)
    await api.register_agent("a", [tool("lookup")])
    expect(await api.post("/v1/sessions", {"agent": "a", "session_id": "s1"}), 201)
    await api.send_message("s1", "x" * 1_000_000)  # 1 MB bodies are admitted again


async def _body_bytes(node: Any, expected: int) -> bool:
    return node.admission.body_bytes == expected


# ---------------------------------------------------------------- items


def test_a_body_of_more_than_max_json_items_is_413_and_commas_in_strings_do_not_count():
    route = ROUTES_BY_NAME["task_complete"]

    def body(result: Any) -> bytes:
        return json.dumps({"worker_id": "w", "result": result}).encode()

    # The body object and its 2 members, the array and its elements: MAX_JSON_ITEMS items.
    at_cap = [0] * (MAX_JSON_ITEMS - 4)
    assert decode_json_body(route, body(at_cap))["result"] == at_cap
    for over in ([0] * (MAX_JSON_ITEMS - 3), [[]] * (4 * MAX_JSON_ITEMS), [{"a": 1}] * (MAX_JSON_ITEMS // 3)):
        with pytest.raises(TooManyItems) as caught:
            decode_json_body(route, body(over))
        assert (caught.value.status, caught.value.code) == (413, "too_large")
        assert str(caught.value).startswith(f"body: must hold at most {MAX_JSON_ITEMS} JSON items")
    text = ",[{" * MAX_JSON_ITEMS  # looks like many items, holds one
    assert decode_json_body(route, body(text))["result"] == text


# ---------------------------------------------------------------- big answers


def test_a_big_answer_is_encoded_in_pieces_of_one_member_or_item_that_make_its_json():
    from dex_ha.server.app import _json_pieces

    value = {"session_id": "s1", "history": [{"seq": i, "text": "x" * 1000} for i in range(50)], "n": None, 7: [[]]}
    pieces = list(_json_pieces(value))
    assert json.loads("".join(pieces)) == json.loads(json.dumps(value))
    assert max(map(len, pieces)) < 1100, "no piece holds more than one item of the history"
    assert json.loads("".join(_json_pieces([1, "a"]))) == [1, "a"] and "".join(_json_pieces("a")) == '"a"'


@pytest.mark.covers("get_session", "list_sessions")
async def test_snapshots_and_pages_are_streamed_and_whole(nodes: NodeFactory, http: HttpFactory, tmp_path: Path):
    node = await nodes(single_node_config(tmp_path / "node"))
    api = http(node)
    await create_sessions(api, 3, metadata_bytes=50_000)
    for i in range(3):
        await api.send_message("s000", f"{i}" * 600_000, message_id=f"m{i}")
    snapshot = expect(await api.get("/v1/sessions/s000"), 200)
    assert snapshot == json.loads(json.dumps(node.replica.reads.get_agent_snapshot("s000")))
    reply = await api.get("/v1/sessions", params={"limit": "2", "order": "id"})
    assert reply.headers.get("Transfer-Encoding") == "chunked"
    assert [s["session_id"] for s in reply.body["sessions"]] == ["s000", "s001"] and reply.body["next_after"] == "s001"
