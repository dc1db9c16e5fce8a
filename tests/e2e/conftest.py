"""Fixtures and helpers shared by the end-to-end tests (real processes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from harness.cluster_process import LocalCluster, cluster_up
from harness.waiting import eventually  # noqa: F401  (the one polling helper; tests written against this name keep working)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """Three nodes from `dex-ha cluster up` (relaxed durability), stopped by pid afterwards."""
    with cluster_up(tmp_path / "cluster") as local:
        yield local


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
