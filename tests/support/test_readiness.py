"""The one readiness wait (harness/readiness.py): it returns the first node whose /readyz
answers 200, fails at its deadline naming the URLs, and stops at once when the node's
process is gone."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from harness.ports import free_ports
from harness.readiness import wait_ready


async def serve_readyz(status: int) -> AsyncIterator[str]:
    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({}, status=status)

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_ports(1)[0]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def ready_url() -> AsyncIterator[str]:
    async for url in serve_readyz(200):
        yield url


@pytest.fixture
async def standby_url() -> AsyncIterator[str]:
    async for url in serve_readyz(503):
        yield url


async def test_returns_the_node_that_answers_200(ready_url: str, standby_url: str) -> None:
    nobody = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    assert await wait_ready([nobody, standby_url, ready_url], deadline_s=5) == ready_url


async def test_fails_at_the_deadline_naming_the_urls(standby_url: str) -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=f"/readyz 200 from one of {standby_url}"):
        await wait_ready([standby_url], deadline_s=0.2)
    assert time.monotonic() - started < 5.0


async def test_stops_at_once_when_the_process_is_gone(standby_url: str) -> None:
    def still_running() -> None:
        raise AssertionError("the process exited")

    started = time.monotonic()
    with pytest.raises(AssertionError, match="the process exited"):
        await wait_ready([standby_url], deadline_s=30, still_running=still_running)
    assert time.monotonic() - started < 5.0
