"""The TypeScript SDK (sdk/typescript) for the tests that run it as real processes: where its
build is, and building it when its sources are newer than the build (the README's test
command builds it first; this keeps a single test file runnable on its own)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SDK_DIR = REPO / "sdk" / "typescript"
BUILD_DIR = SDK_DIR / "dist"
CRASH_WORKER = BUILD_DIR / "test" / "crash" / "worker_proc.js"
BUILD_TIMEOUT_S = 300.0


def node_missing() -> str | None:
    """Why the TypeScript tests cannot run here (None when they can)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are not installed (scripts/test installs them with apt-get when it can)"
    return None


def _newest_source() -> float:
    sources = [*SDK_DIR.glob("src/**/*.ts"), *SDK_DIR.glob("test/**/*.ts"), SDK_DIR / "package-lock.json"]
    return max(path.stat().st_mtime for path in sources)


def ensure_built() -> None:
    """`npm ci` when node_modules is missing, `npm run build` when a source is newer than the build."""
    if (SDK_DIR / "node_modules").is_dir() and CRASH_WORKER.exists():
        if CRASH_WORKER.stat().st_mtime >= _newest_source():
            return
    steps = [["npm", "ci", "--no-audit", "--no-fund"]] if not (SDK_DIR / "node_modules").is_dir() else []
    for command in [*steps, ["npm", "run", "build"]]:
        done = subprocess.run(command, cwd=SDK_DIR, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} in {SDK_DIR} failed:\n{done.stdout}\n{done.stderr}")
    CRASH_WORKER.touch()  # tsc leaves an unchanged output file's time alone
