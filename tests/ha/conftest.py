"""Fixtures of the HA scenarios: a three-node cluster whose Raft links run through the
fault proxy (proxied_cluster.py), stopped by pid afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness.proxied_cluster import ProxiedCluster


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[ProxiedCluster]:
    cluster = ProxiedCluster(tmp_path / "cluster", drain_timeout_ms=30_000)
    try:
        await cluster.start()
        yield cluster
    finally:
        await cluster.stop()
