"""The TypeScript quick start really runs: examples/typescript (which links the SDK by its
relative path) installs from its lockfile, builds with tsc, and its agent.js drives a turn
against `dex-ha dev`, as tests/e2e/test_examples.py runs the Python quick start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.dev_process import DevProcess
from harness.typescript_sdk import EXAMPLE_DIR, NpmFailed, ensure_built, install_packages, node_missing, run_npm

pytestmark = pytest.mark.skipif(node_missing() is not None, reason=str(node_missing()))


async def test_typescript_quickstart_runs_to_the_answer(tmp_path: Path) -> None:
    try:
        ensure_built()  # the example links sdk/typescript and imports its dist
        install_packages(EXAMPLE_DIR)
        run_npm("run", "build", cwd=EXAMPLE_DIR)
    except NpmFailed as failed:
        pytest.fail(str(failed), pytrace=False)
    server = DevProcess(tmp_path / "data", tmp_path / "dev.log")
    server.start()
    try:
        await server.wait_ready()
        done = subprocess.run(
            ["node", str(EXAMPLE_DIR / "dist" / "agent.js"), server.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any("approval_requested" in line for line in lines), lines
    assert any("delta" in line for line in lines), lines
    assert lines[-1] == "answer: Done: order A17 is refunded.", lines
