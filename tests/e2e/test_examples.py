"""The README's quick start really runs: examples/quickstart.py against `dex-ha dev`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.dev_process import DevProcess

REPO = Path(__file__).resolve().parents[2]


async def test_quickstart_runs_to_the_answer(tmp_path: Path) -> None:
    server = DevProcess(tmp_path / "data", tmp_path / "dev.log")
    server.start()
    try:
        await server.wait_ready()
        done = subprocess.run(
            [sys.executable, str(REPO / "examples" / "quickstart.py"), server.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("approval_requested" in line for line in lines)
    assert any("delta" in line for line in lines)
    assert lines[-1] == "answer: Done: order A17 is refunded."
