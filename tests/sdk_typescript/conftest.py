"""Fixtures of the TypeScript SDK tests: the SDK built once per module, a `dex-ha dev` node."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness.dev_process import DevProcess, running_dev
from harness.typescript_sdk import ensure_built


@pytest.fixture(scope="module")
def built() -> None:
    ensure_built()


@pytest.fixture
async def dev(tmp_path: Path, built: None) -> AsyncIterator[DevProcess]:
    async with running_dev(tmp_path) as node:
        yield node
