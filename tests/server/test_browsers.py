"""A web page in someone's browser cannot drive a node (dex_ha/server/browsers.py).

The repro: against `dex-ha dev` (no tokens), a page on another site sent JSON as
`text/plain` (no preflight) and a pending write tool call was approved; a foreign `Host`
was answered (DNS rebinding). Each check is tested on a node without tokens, where it is
all that stands between a page and the API, and the console's own requests still pass.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from dex_ha.server.browsers import BrowserGuard, check_content_type, is_loopback
from dex_ha.server.config import ConfigError, dev_config
from dex_ha.server.node import NodeServer
from harness.ports import free_ports
from tests.server.conftest import HttpFactory, NodeFactory
from tests.server.node_fixture import HttpApi, assert_error, expect, single_node_config, tool

FOREIGN_ORIGIN = "https://evil.example"
DEADLINE_S = 5.0


# ---------------------------------------------------------------- Content-Type


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
async def test_a_post_that_is_not_json_is_415_naming_the_header(open_api: HttpApi, content_type: str):
    """A page may send these without a preflight; before, text/plain created the session (201)."""
    body = json.dumps({"agent": "a", "session_id": "s1"}).encode()
    reply = await open_api.call("POST", "/v1/sessions", data=body, headers={"Content-Type": content_type})
    assert_error(reply, 415, "unsupported_media_type", names="Content-Type")
    assert_error(await open_api.get("/v1/sessions/s1"), 404, "not_found")  # nothing was created


async def test_a_post_without_content_type_is_415(open_node: NodeServer):
    status, body = await _raw(open_node, b'POST /v1/sessions HTTP/1.1\r\nContent-Length: 13\r\n\r\n{"agent":"a"}')
    assert status == 415 and body["error"] == "unsupported_media_type", body


async def test_an_approval_sent_as_text_plain_is_refused_before_it_is_recorded(open_api: HttpApi):
    await open_api.register_agent("bank", [tool("transfer", "write", approval=True)])
    await open_api.create_session("bank", "s1")
    reply = await open_api.call(
        "POST", "/v1/sessions/s1/approvals/c1", data=b'{"approved": true}', headers={"Content-Type": "text/plain"}
    )
    assert_error(reply, 415, "unsupported_media_type", names="Content-Type")


async def test_json_with_a_charset_passes_and_an_empty_post_passes_when_it_says_json(open_api: HttpApi):
    expect(
        await open_api.call(
            "POST",
            "/v1/sessions",
            data=b'{"agent": "a", "session_id": "s1"}',
            headers={"Content-Type": "Application/JSON; charset=utf-8"},
        ),
        201,
    )
    expect(await open_api.call("POST", "/v1/sessions/s1/cancel", headers={"Content-Type": "application/json"}), 200)


def test_which_requests_must_say_json():
    check_content_type("GET", None)
    check_content_type("DELETE", None)  # no body: browsers preflight every DELETE anyway
    check_content_type("DELETE", "application/json")
    for method, content_type in [("POST", None), ("PUT", None), ("DELETE", "text/plain"), ("POST", "text/json")]:
        with pytest.raises(Exception) as caught:
            check_content_type(method, content_type)
        assert getattr(caught.value, "status", None) == 415, (method, content_type)


async def _raw(node: NodeServer, request: bytes) -> tuple[int, dict[str, object]]:
    """Send a request line and headers as they are (aiohttp would add a Content-Type), with
    `Host: 127.0.0.1` and `Connection: close` added; the status and JSON body of the answer."""
    line, _, rest = request.partition(b"\r\n")
    answer = await _exchange(node, line + b"\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + rest)
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


async def _exchange(node: NodeServer, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", node.http_port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(DEADLINE_S):
            return await reader.read()
    finally:
        writer.close()


# ---------------------------------------------------------------- Host


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8801", "localhost.evil.example", "127.0.0.1.nip.io"])
async def test_a_host_the_node_does_not_serve_is_421(open_api: HttpApi, host: str):
    """DNS rebinding: the page's own name, pointed at the node, arrives as Host. Before: 200."""
    for path in ("/v1/sessions", "/readyz", "/ui", "/no-such-route"):
        reply = await open_api.call("GET", path, headers={"Host": host})
        assert_error(reply, 421, "misdirected_request", names="Host")


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1", "127.0.0.1:1", "[::1]:1", "10.1.2.3:8801", "[fe80::1]"])
async def test_loopback_names_and_ip_addresses_are_served(open_api: HttpApi, host: str):
    expect(await open_api.call("GET", "/v1/sessions", headers={"Host": host}), 200)


async def test_the_hosts_of_url_and_allowed_hosts_are_served(nodes: NodeFactory, http: HttpFactory, tmp_path: Path):
    port = free_ports(1)[0]  # not 0: a node asked for port 0 makes its url of the port it bound
    config = single_node_config(tmp_path / "n", auth=False, allowed_hosts=("dex.internal",))
    node = await nodes(replace(config, http_listen=("127.0.0.1", port), url="http://dex-0.peers.example:8801"))
    api = http(node, auth=False)
    for host in ("dex.internal", "DEX.internal:443", "dex-0.peers.example:8801"):
        expect(await api.call("GET", "/v1/sessions", headers={"Host": host}), 200)
    assert_error(await api.call("GET", "/v1/sessions", headers={"Host": "other.example"}), 421)


def test_any_host_may_be_allowed():
    guard = BrowserGuard.for_node("127.0.0.1", "http://127.0.0.1:1", allowed_hosts=["*"])
    guard._check_host("anything.example")


# ---------------------------------------------------------------- Origin


async def test_a_request_from_a_page_of_another_site_is_403(open_api: HttpApi):
    """Before: the page's JSON POST went through (its answer only hidden from the page)."""
    reply = await open_api.post("/v1/sessions", {"agent": "a", "session_id": "s1"}, headers={"Origin": FOREIGN_ORIGIN})
    assert_error(reply, 403, "forbidden", names="Origin")
    assert_error(await open_api.get("/v1/sessions/s1"), 404, "not_found")
    assert_error(await open_api.get("/v1/sessions", headers={"Origin": "null"}), 403, "forbidden", names="Origin")


async def test_the_consoles_own_requests_pass(open_api: HttpApi):
    """The console at /ui calls the API of the node that served it: Origin is that node."""
    same = open_api.url  # http://127.0.0.1:<port>, as a browser on the console would send it
    expect(await open_api.post("/v1/sessions", {"agent": "a", "session_id": "s1"}, headers={"Origin": same}), 201)
    expect(await open_api.get("/v1/sessions", headers={"Origin": same}), 200)
    page = await open_api.call("GET", "/ui", headers={"Origin": same})
    assert page.status == 200


async def test_a_page_on_another_port_of_the_same_host_is_another_site(open_api: HttpApi):
    other_port = open_api.url.rsplit(":", 1)[0] + ":1"
    assert_error(await open_api.get("/v1/sessions", headers={"Origin": other_port}), 403, "forbidden")


async def test_an_allowed_origin_may_call_and_gets_cors_answers(nodes: NodeFactory, http: HttpFactory, tmp_path: Path):
    allowed = "https://app.example"
    node = await nodes(single_node_config(tmp_path / "n", auth=False, allowed_origins=(allowed + "/",)))
    api = http(node, auth=False)
    reply = await api.post("/v1/sessions", {"agent": "a", "session_id": "s1"}, headers={"Origin": allowed})
    expect(reply, 201)
    assert reply.headers["Access-Control-Allow-Origin"] == allowed and reply.headers["Vary"] == "Origin"
    preflight = await api.call(
        "OPTIONS",
        "/v1/sessions",
        headers={
            "Origin": allowed,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == allowed
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert "Content-Type" in preflight.headers["Access-Control-Allow-Headers"]
    foreign = await api.call(
        "OPTIONS", "/v1/sessions", headers={"Origin": FOREIGN_ORIGIN, "Access-Control-Request-Method": "POST"}
    )
    assert_error(foreign, 403, "forbidden")
    assert "Access-Control-Allow-Origin" not in foreign.headers


async def test_with_tokens_the_checks_hold_too(api: HttpApi):
    reply = await api.post("/v1/sessions", {"agent": "a"}, headers={"Origin": FOREIGN_ORIGIN})
    assert_error(reply, 403, "forbidden", names="Origin")


# ---------------------------------------------------------------- the Server header


async def test_answers_name_the_server_without_a_version(open_node: NodeServer, open_api: HttpApi):
    """Before: `Server: Python/3.x aiohttp/3.y`."""
    replies = [
        await open_api.get("/v1/sessions"),
        await open_api.get("/no-such-route"),
        await open_api.call("GET", "/ui"),
        await open_api.post("/v1/sessions", {}),
        await open_api.get("/v1/sessions", headers={"Host": "evil.example"}),
    ]
    for reply in replies:
        assert reply.headers.get("Server") == "dex-ha", reply.headers
    malformed = await _exchange(open_node, b"G(T /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert b"\r\nServer: dex-ha\r\n" in malformed and b"aiohttp" not in malformed, malformed


async def test_the_probe_port_names_the_server_without_a_version(nodes: NodeFactory, http: HttpFactory, tmp_path: Path):
    port = free_ports(1)[0]
    await nodes(single_node_config(tmp_path / "n", probe_listen=("127.0.0.1", port)))
    reply = await http(f"http://127.0.0.1:{port}").get("/livez", role=None)
    assert reply.status == 200 and reply.headers.get("Server") == "dex-ha", reply.headers


# ---------------------------------------------------------------- dev on the network


def test_dev_without_tokens_refuses_a_non_loopback_address_unless_insecure(tmp_path: Path):
    """Before: `dex-ha dev --host 0.0.0.0` served the whole API to the network, with a warning."""
    for host in ("0.0.0.0", "", "10.0.0.1", "::", "dex.example"):
        with pytest.raises(ConfigError) as caught:
            dev_config(tmp_path, 8801, host=host).check()
        assert str(caught.value).startswith("http_listen: ") and "--insecure" in str(caught.value)
        dev_config(tmp_path, 8801, host=host, insecure=True).check()
        dev_config(tmp_path, 8801, host=host, tokens=TOKENS_OF_EVERY_ROLE).check()
    for host in ("127.0.0.1", "localhost", "::1", "127.1.2.3"):
        dev_config(tmp_path, 8801, host=host).check()


TOKENS_OF_EVERY_ROLE = {role: (f"{role}-token-0123456789",) for role in ("client", "worker", "admin")}


def test_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("") and not is_loopback("0.0.0.0") and not is_loopback("example.com")
