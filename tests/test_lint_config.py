"""The import contracts in pyproject.toml ([tool.importlinter]) hold, so that pytest alone
catches an import against the layers (raft below everything, the engine's modules in their
order, worker and client away from the server) even where scripts/test's lint step is off.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def lint_imports_command() -> str:
    """The lint-imports installed beside this Python (the `[dev]` extra), else the one on PATH."""
    beside = Path(sys.executable).parent / "lint-imports"
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    assert found, "lint-imports is missing: pip install -e '.[dev]' installs import-linter"
    return found


def test_the_import_contracts_hold() -> None:
    # lint-imports puts its working directory first on sys.path, so it reads this checkout's
    # dex_ha (not an installed copy); --no-cache leaves no cache behind and reads no stale one.
    run = subprocess.run([lint_imports_command(), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"an import contract is broken:\n{run.stdout}\n{run.stderr}"
