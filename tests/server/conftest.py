"""Fixtures for the HTTP tests of the node server: real NodeServers in the test's event loop,
stopped in the finalizer, and raw HTTP clients that check each test's `covers` claim.

`@pytest.mark.covers("route_name", ...)` says that a test exercises the success path of
those routes of `api_spec.ROUTES`; after a passing test the `http` fixture checks that the
test really sent a request to each of them (test_routes.py checks that every route is
claimed by some test).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dex_ha.server.api_spec import ROUTES_BY_NAME
from dex_ha.server.config import ServerConfig
from dex_ha.server.node import NodeServer
from tests.server.node_fixture import HttpApi, base_url, single_node_config, start_node

NodeFactory = Callable[..., Awaitable[NodeServer]]
HttpFactory = Callable[..., HttpApi]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "covers(*route_names): the test exercises these routes' success paths")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    # Keep the outcome of each phase on the item, so a fixture's teardown knows whether
    # the test itself passed (and does not pile a second failure on a failed test).
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def covered_routes(item: pytest.Item) -> set[str]:
    names = {name for mark in item.iter_markers("covers") for name in mark.args}
    unknown = names - set(ROUTES_BY_NAME)
    assert not unknown, f"covers names routes that api_spec.ROUTES does not have: {sorted(unknown)}"
    return names


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[NodeFactory]:
    """Start nodes with `await nodes(config)`; every node started is stopped afterwards."""
    started: list[NodeServer] = []

    async def start(config: ServerConfig, *, wait_ready: bool = True) -> NodeServer:
        node = await start_node(config, wait_ready=wait_ready)
        started.append(node)
        return node

    yield start
    for node in reversed(started):
        await node.stop()


@pytest.fixture
async def http(request: pytest.FixtureRequest) -> AsyncIterator[HttpFactory]:
    """`http(node)` or `http(url)`: an HttpApi on one aiohttp session, closed afterwards."""
    clients: list[HttpApi] = []
    async with aiohttp.ClientSession() as session:

        def make(target: NodeServer | str, *, auth: bool = True) -> HttpApi:
            url = target if isinstance(target, str) else base_url(target)
            client = HttpApi(url, session, auth=auth)
            clients.append(client)
            return client

        yield make
    passed = getattr(request.node, "report_call", None) is not None and request.node.report_call.passed
    if passed:
        hit = set().union(*(client.routes_hit() for client in clients))
        missing = covered_routes(request.node) - hit
        assert not missing, f"the test claims to cover {sorted(missing)} but sent them no request"


@pytest.fixture
async def node(nodes: NodeFactory, tmp_path: Path) -> NodeServer:
    """One active dev node with client, worker and admin tokens (auth on)."""
    return await nodes(single_node_config(tmp_path / "node"))


@pytest.fixture
def api(http: HttpFactory, node: NodeServer) -> HttpApi:
    return http(node)


@pytest.fixture
async def open_node(nodes: NodeFactory, tmp_path: Path) -> NodeServer:
    """One active dev node without tokens (auth off, as `dex-ha dev` runs by default)."""
    return await nodes(single_node_config(tmp_path / "open-node", auth=False))


@pytest.fixture
def open_api(http: HttpFactory, open_node: NodeServer) -> HttpApi:
    return http(open_node, auth=False)
