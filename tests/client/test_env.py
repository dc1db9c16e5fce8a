"""DexClient's URLs and token: one URL, a list, a comma-separated string, or the environment
that `source tokens.env` sets (DEX_HA_URLS, DEX_HA_CLIENT_TOKEN, else DEX_HA_TOKEN); a
malformed URL fails at once, naming it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from dex_ha.client import Connection, DexClient
from tests.client.fake_server import FakeCluster, FakeNode, start_nodes

# A malformed URL must fail well before this: no retry loop may hide it.
AT_ONCE_S = 2.0


@pytest.fixture
async def nodes() -> AsyncIterator[list[FakeNode]]:
    """A standby naming the active node, then the active node."""
    started = await start_nodes(FakeCluster(), "standby", "active")
    started[0].leader_url = started[1].url
    yield started
    for node in started:
        await node.stop()


def bearer(node: FakeNode, path: str) -> str | None:
    return node.requests_to(path)[-1].headers.get("Authorization")


@pytest.fixture(autouse=True)
def no_dex_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own DEX_HA_* settings must not leak into these tests."""
    for name in ("DEX_HA_URLS", "DEX_HA_TOKEN", "DEX_HA_CLIENT_TOKEN", "DEX_HA_WORKER_TOKEN", "DEX_HA_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)


async def test_a_comma_separated_string_is_several_urls(nodes: list[FakeNode]) -> None:
    joined = ",".join(node.url for node in nodes)  # as DEX_HA_URLS holds them
    async with DexClient(joined, token="t", backoff_max_s=0.1, give_up_after_s=AT_ONCE_S) as client:
        assert client.connection.urls == [node.url for node in nodes]
        await asyncio.wait_for(client.create_session("helper", session_id="s1"), AT_ONCE_S)
        assert client.connection.current_url == nodes[1].url  # followed the standby's leader_url
    assert [r.body["session_id"] for r in nodes[1].requests_to("/v1/sessions")] == ["s1"]


async def test_no_arguments_read_dex_ha_urls_and_the_client_token(
    nodes: list[FakeNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEX_HA_URLS", ",".join(node.url for node in nodes))
    monkeypatch.setenv("DEX_HA_TOKEN", "admin-token")
    monkeypatch.setenv("DEX_HA_CLIENT_TOKEN", "client-token")
    async with DexClient(give_up_after_s=AT_ONCE_S) as client:
        await client.create_session("helper", session_id="s1")
    assert bearer(nodes[1], "/v1/sessions") == "Bearer client-token"


async def test_dex_ha_token_is_used_when_there_is_no_client_token(
    nodes: list[FakeNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEX_HA_URLS", nodes[1].url)
    monkeypatch.setenv("DEX_HA_TOKEN", "admin-token")
    async with DexClient(give_up_after_s=AT_ONCE_S) as client:
        await client.create_session("helper", session_id="s1")
    assert bearer(nodes[1], "/v1/sessions") == "Bearer admin-token"


async def test_arguments_win_over_the_environment(nodes: list[FakeNode], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEX_HA_URLS", "http://127.0.0.1:1")  # nothing there
    monkeypatch.setenv("DEX_HA_CLIENT_TOKEN", "env-token")
    async with DexClient(nodes[1].url, token="given-token", give_up_after_s=AT_ONCE_S) as client:
        await client.create_session("helper", session_id="s1")
    assert bearer(nodes[1], "/v1/sessions") == "Bearer given-token"


async def test_the_namespace_comes_from_the_argument_else_dex_ha_namespace_else_none_is_named(
    nodes: list[FakeNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    def named() -> str | None:
        return nodes[1].requests_to("/v1/sessions")[-1].headers.get("Dex-Namespace")

    async with DexClient(nodes[1].url, give_up_after_s=AT_ONCE_S) as client:
        await client.create_session("helper", session_id="s1")
    assert named() is None  # the server's default
    monkeypatch.setenv("DEX_HA_NAMESPACE", "team-env")
    async with DexClient(nodes[1].url, give_up_after_s=AT_ONCE_S) as client:
        await client.create_session("helper", session_id="s1")
    assert named() == "team-env"
    async with DexClient(nodes[1].url, namespace="team-a", give_up_after_s=AT_ONCE_S) as client:
        await client.create_session("helper", session_id="s1")
    assert named() == "team-a"


def test_without_arguments_or_environment_the_dev_url_and_no_token() -> None:
    client = DexClient()
    assert client.connection.urls == ["http://127.0.0.1:8801"]


@pytest.mark.parametrize(
    ("urls", "named", "bad"),
    [
        ("http://127.0.0.1:8801,http://127.0.0.1:88o2", "urls[1]", "http://127.0.0.1:88o2"),
        ("http://127.0.0.1:99999", "urls", "http://127.0.0.1:99999"),
        (["http://127.0.0.1:8801", "127.0.0.1:8802"], "urls[1]", "127.0.0.1:8802"),
        ("http://127.0.0.1:8801 http://127.0.0.1:8802", "urls", "http://127.0.0.1:8801 http://127.0.0.1:8802"),
        ("http://:8801", "urls", "http://:8801"),
    ],
)
def test_a_malformed_url_fails_at_once_naming_it(urls: str | list[str], named: str, bad: str) -> None:
    with pytest.raises(ValueError) as raised:
        DexClient(urls, give_up_after_s=60)
    assert str(raised.value).startswith(f"{named} ") and repr(bad) in str(raised.value)


async def test_a_url_aiohttp_cannot_use_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence behind the checks above: InvalidURL from aiohttp ends the call at once."""
    conn = Connection("http://127.0.0.1:1", give_up_after_s=60)
    conn._current_url = "http://[::1"  # what a check could miss; the request cannot even be built
    try:
        with pytest.raises(ValueError, match=r"http://\[::1 is not a URL a request can be sent to"):
            await asyncio.wait_for(conn.request("GET", "/readyz"), AT_ONCE_S)
    finally:
        await conn.close()
