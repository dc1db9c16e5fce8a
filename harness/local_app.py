"""An aiohttp app served in this process on 127.0.0.1, at a port the OS picks: the fakes
and stubs tests put in front of an SDK (fake model APIs, fake dex-ha servers)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


async def start_local_app(app: web.Application, *, shutdown_timeout: float = 60.0) -> tuple[web.AppRunner, str]:
    """Serve `app`; the runner (its `cleanup()` stops the app) and the app's base URL.
    `shutdown_timeout`: how long a stop waits for running handlers (streams, say)."""
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()  # port 0: the OS picks a free one
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def local_app(app: web.Application, *, shutdown_timeout: float = 60.0) -> AsyncIterator[str]:
    """`start_local_app` as a context: the base URL while inside, stopped when left."""
    runner, url = await start_local_app(app, shutdown_timeout=shutdown_timeout)
    try:
        yield url
    finally:
        await runner.cleanup()
