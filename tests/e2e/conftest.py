"""Fixtures and helpers shared by the end-to-end tests (real processes)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, TypeVar

import pytest

from tests.e2e.cluster_process import LocalCluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """Three nodes from `dex-ha cluster up` (relaxed durability), stopped by pid afterwards."""
    local = LocalCluster(tmp_path / "cluster")
    try:
        local.up()
        yield local
    finally:
        local.down()


class Runnable(Protocol):
    async def run(self) -> None: ...

    async def stop(self) -> None: ...


R = TypeVar("R", bound=Runnable)


@contextlib.asynccontextmanager
async def running(worker: R) -> AsyncIterator[R]:
    """Run `worker` (a Worker, or anything with run() and stop()) for the body of the block;
    stop it (a Worker's drain) and its task afterwards."""
    run = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        await worker.stop()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


async def eventually(check: Callable[[], Any | Awaitable[Any]], what: str, deadline_s: float = 30.0,
                     interval_s: float = 0.05) -> Any:
    """Poll `check()` (a plain or an async function) until it returns something truthy;
    fail after the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what}")
        await asyncio.sleep(interval_s)
