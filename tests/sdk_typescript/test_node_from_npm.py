"""Node >= 20 on a machine whose own node is older (Debian bookworm's is 18): scripts/install-node
fetches one from the npm registry into .cache/node, and the TypeScript tests find it there.
These checks use stand-in `node` scripts that print a version: no network, no real install."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import typescript_sdk


def stand_in(directory: Path, name: str, output: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / name
    script.write_text(f"#!/bin/sh\necho {output}\n")
    script.chmod(0o755)


@pytest.fixture
def old_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH whose node is Node 18 (with an npm), and an empty node cache; the cache dir."""
    system = tmp_path / "system-bin"
    stand_in(system, "node", "v18.19.0")
    stand_in(system, "npm", "9.2.0")
    monkeypatch.setenv("PATH", f"{system}{os.pathsep}/bin")
    cache = tmp_path / "cache-bin"
    monkeypatch.setattr(typescript_sdk, "CACHED_NODE_BIN", cache)
    return cache


def test_an_old_node_without_the_cache_skips_with_the_reason(old_node: Path) -> None:
    reason = typescript_sdk.node_missing()
    assert reason is not None and "needs Node >= 20" in reason and "v18.19.0" in reason
    assert "scripts/install-node" in reason


def test_an_old_node_with_the_cached_one_puts_the_cache_first_on_path(old_node: Path) -> None:
    stand_in(old_node, "node", "v22.23.3")
    assert typescript_sdk.node_missing() is None
    assert os.environ["PATH"].split(os.pathsep)[0] == str(old_node)
    typescript_sdk.node_missing()  # a second call does not add it again
    assert os.environ["PATH"].split(os.pathsep).count(str(old_node)) == 1


def test_a_new_enough_node_on_path_is_used_as_it_is(
    old_node: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in(old_node, "node", "v22.23.3")
    system = tmp_path / "new-bin"
    stand_in(system, "node", "v20.20.2")
    stand_in(system, "npm", "10.8.2")
    monkeypatch.setenv("PATH", f"{system}{os.pathsep}/bin")
    assert typescript_sdk.node_missing() is None
    assert str(old_node) not in os.environ["PATH"]
