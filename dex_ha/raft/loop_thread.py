"""An asyncio event loop on a thread of its own, started and stopped from another loop.

The Raft node runs on one (raft/threaded.py), so that load on the HTTP side cannot delay
its ticks; the server's probe listener on another (server/probes.py). The loop uses uvloop
when it is installed, as the process's main loop does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """`start(setup)` runs `setup()` on a new thread's loop and returns once it is done
    (raising what it raised); the loop then runs until `stop()`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def start(self, setup: Callable[[], Coroutine[Any, Any, None]]) -> None:
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(setup, started), name=self.name, daemon=True)
        self._thread.start()
        await asyncio.wrap_future(started)

    def _run(self, setup: Callable[[], Coroutine[Any, Any, None]], started: concurrent.futures.Future[None]) -> None:
        loop = self.loop = _new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(setup())
        except BaseException as exc:
            started.set_exception(exc)
            loop.close()
            return
        started.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    @property
    def running(self) -> bool:
        return self.loop is not None and self._thread is not None and not self.loop.is_closed()

    async def run(self, coro: Awaitable[T]) -> T:
        """Run `coro` on this thread's loop; its result or exception comes back here."""
        assert self.loop is not None, "the loop thread is not started"
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))  # type: ignore[arg-type]

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call `fn(*args)` on this thread's loop (for code that must not run elsewhere)."""

        async def call() -> T:
            return fn(*args)

        return await self.run(call())

    async def stop(self, teardown: Coroutine[Any, Any, None] | None = None) -> None:
        """Run `teardown` on the loop (if given), then stop the loop and join the thread."""
        if not self.running:
            if teardown is not None:
                teardown.close()
            return
        assert self.loop is not None and self._thread is not None
        try:
            if teardown is not None:
                await self.run(teardown)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self._thread.join)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
