"""Worker() without URLs or a token reads what `source tokens.env` sets: DEX_HA_URLS and
DEX_HA_WORKER_TOKEN, else DEX_HA_TOKEN. Checked on the wire, against a small recording server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from dex_ha.worker import Agent, ScriptedModel, Worker
from harness.local_app import start_local_app
from harness.waiting import eventually
from tests.e2e.conftest import running


class RecordingServer:
    """Answers registration and (empty) polls, and records the Authorization header of each."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_put("/v1/agents/{name}", self._answer)
        app.router.add_post("/v1/worker/poll", self._answer)
        self._runner, self.url = await start_local_app(app, shutdown_timeout=0.1)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.Response:
        self.authorizations.append(request.headers.get("Authorization"))
        if request.path.endswith("/poll"):
            await asyncio.sleep(0.05)  # a short long poll: no task
            return web.json_response({"tasks": []})
        return web.json_response({"name": request.match_info["name"]})


@pytest.fixture
async def server() -> AsyncIterator[RecordingServer]:
    recording = RecordingServer()
    await recording.start()
    yield recording
    await recording.stop()


@pytest.fixture(autouse=True)
def no_dex_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DEX_HA_URLS", "DEX_HA_TOKEN", "DEX_HA_CLIENT_TOKEN", "DEX_HA_WORKER_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def agent() -> Agent:
    return Agent("support", model=ScriptedModel([{"content": "hi"}]))


async def tokens_seen(server: RecordingServer, worker: Worker) -> set[str | None]:
    async with running(worker):
        await eventually(lambda: len(server.authorizations) >= 2, "a registration and a poll", deadline_s=5)
    return set(server.authorizations)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "DEX_HA_WORKER_TOKEN": "worker-token",
                "DEX_HA_TOKEN": "admin-token",
                "DEX_HA_CLIENT_TOKEN": "client-token",
            },
            "Bearer worker-token",
        ),
        ({"DEX_HA_TOKEN": "admin-token"}, "Bearer admin-token"),
        ({}, None),
    ],
)
async def test_no_arguments_read_dex_ha_urls_and_the_worker_token(
    server: RecordingServer, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str | None
) -> None:
    monkeypatch.setenv("DEX_HA_URLS", f"http://127.0.0.1:1,{server.url}")  # the first has nothing behind it
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert await tokens_seen(server, Worker(agents=[agent()], poll_wait_ms=50)) == {expected}


async def test_arguments_win_over_the_environment(server: RecordingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEX_HA_URLS", "http://127.0.0.1:1")
    monkeypatch.setenv("DEX_HA_WORKER_TOKEN", "env-token")
    worker = Worker(server.url, token="given-token", agents=[agent()], poll_wait_ms=50)
    assert await tokens_seen(server, worker) == {"Bearer given-token"}


def test_a_malformed_url_fails_when_the_worker_is_made() -> None:
    with pytest.raises(ValueError, match=r"urls\[1\] has a port that is not a number"):
        Worker("http://127.0.0.1:8801,http://127.0.0.1:port", agents=[agent()])
