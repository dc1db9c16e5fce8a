"""The TypeScript SDK (sdk/typescript) for the tests that run it: installing its packages
(`npm ci` from the committed lockfile), building it (`npm run build`) and running npm in it;
the same for the TypeScript example (examples/typescript), which links the SDK.

`npm ci` runs only when node_modules is missing or the lockfile changed since the last one
(its hash is kept in node_modules), so a test run on a warm checkout costs a build only."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from harness.processes import stop

REPO = Path(__file__).resolve().parents[1]
SDK_DIR = REPO / "sdk" / "typescript"
BUILD_DIR = SDK_DIR / "dist"
CRASH_WORKER = BUILD_DIR / "test" / "crash" / "worker_proc.js"
EXAMPLE_DIR = REPO / "examples" / "typescript"
NPM_TIMEOUT_S = 300.0
MIN_NODE_MAJOR = 20
LOCKFILE = SDK_DIR / "package-lock.json"
# Where the hash of the lockfile that node_modules was installed from is kept (in node_modules).
INSTALLED_LOCK_HASH_NAME = ".dex-ha-lock-sha256"
# Where scripts/install-node puts Node from the npm registry (the `node` package's binary)
# when the machine's node is older than MIN_NODE_MAJOR (Debian bookworm's nodejs is 18).
CACHED_NODE_BIN = REPO / ".cache" / "node" / "node_modules" / ".bin"


def node_missing() -> str | None:
    """Why the TypeScript tests cannot run here (None when they can). First puts the Node
    that scripts/install-node fetched on PATH when the machine's is missing or too old."""
    use_cached_node()
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are not installed (scripts/test installs them with apt-get when it can)"
    version = _node_version("node")
    if _major(version) < MIN_NODE_MAJOR:
        return (
            f"the TypeScript SDK needs Node >= {MIN_NODE_MAJOR}; this machine has {version or 'an unknown node'} "
            "(scripts/install-node fetches a newer one from the npm registry)"
        )
    return None


def use_cached_node() -> None:
    """Put CACHED_NODE_BIN first on this process's PATH (which the node and npm processes the
    tests start inherit) when the node on PATH is missing or older than MIN_NODE_MAJOR and
    scripts/install-node has put a newer one there."""
    if _major(_node_version("node")) >= MIN_NODE_MAJOR:
        return
    cached = CACHED_NODE_BIN / "node"
    if cached.exists() and _major(_node_version(str(cached))) >= MIN_NODE_MAJOR:
        os.environ["PATH"] = f"{CACHED_NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


def _node_version(node: str) -> str:
    """`node --version` ("v22.23.3"), or "" when there is no such node."""
    if shutil.which(node) is None:
        return ""
    return subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout.strip()


def _major(version: str) -> int:
    major = version.lstrip("v").split(".", 1)[0]
    return int(major) if major.isdigit() else 0


class NpmFailed(RuntimeError):
    """An npm command failed; the message holds its output."""


def run_npm(*args: str, cwd: Path = SDK_DIR) -> str:
    """Run `npm ARGS` in `cwd` (sdk/typescript); its output, or NpmFailed with the output."""
    env = {**os.environ, "DEX_HA_PYTHON": sys.executable}  # the unit tests compare with dex_ha
    command = ["npm", *args]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=NPM_TIMEOUT_S, env=env, check=False)
    output = f"$ {' '.join(command)}  (in {cwd})\n{done.stdout}\n{done.stderr}"
    if done.returncode != 0:
        raise NpmFailed(f"{' '.join(command)} exited with {done.returncode}:\n{output}")
    return output


def install_packages(directory: Path = SDK_DIR) -> None:
    """`npm ci` in `directory` when its node_modules is missing or was installed from
    another lockfile."""
    wanted = hashlib.sha256((directory / "package-lock.json").read_bytes()).hexdigest()
    installed = directory / "node_modules" / INSTALLED_LOCK_HASH_NAME
    if installed.exists() and installed.read_text() == wanted:
        return
    run_npm("ci", "--no-audit", "--no-fund", cwd=directory)
    installed.write_text(wanted)


def _newest_source() -> float:
    sources = [*SDK_DIR.glob("src/**/*.ts"), *SDK_DIR.glob("test/**/*.ts"), SDK_DIR / "tsconfig.json", LOCKFILE]
    return max(path.stat().st_mtime for path in sources)


def ensure_built() -> None:
    """Install the packages if needed, and build when a source is newer than the build."""
    install_packages()
    if CRASH_WORKER.exists() and CRASH_WORKER.stat().st_mtime >= _newest_source():
        return
    run_npm("run", "build")
    CRASH_WORKER.touch()  # tsc leaves an unchanged output file's time alone


def start_node_program(script: str, args: list[str], log: Path, stdout: int | None = None) -> subprocess.Popen[bytes]:
    """`node dist/test/e2e/<script>.js ARGS` of the built SDK, its stderr (and stdout
    unless piped) to `log`."""
    with open(log, "wb") as sink:  # the child keeps its own copy of the file
        return subprocess.Popen(
            ["node", str(BUILD_DIR / "test" / "e2e" / f"{script}.js"), *args],
            stdout=sink if stdout is None else stdout,
            stderr=sink,
        )


@contextlib.contextmanager
def running_node_program(script: str, args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`start_node_program` while inside, stopped by pid when left (a TypeScript Worker, say)."""
    proc = start_node_program(script, args, log)
    try:
        yield proc
    finally:
        stop(proc, timeout=10)
