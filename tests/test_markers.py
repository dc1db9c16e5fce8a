"""The `process` marker (tests/conftest.py, tests/process_marker.py): every test that starts
a real process carries it, so `pytest -m "not process"` is a fast loop without one."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.process_marker import REPO, module_starts_processes, symbol_starts_processes

# What a test module imports to start a process, written out here rather than derived by
# tests/process_marker.py, so that this test checks the marker's analysis and not itself.
PROCESS_IMPORTS = {
    "subprocess",
    "multiprocessing",
    "playwright.async_api",
    "dex_ha.cli.cluster",
    "dex_ha.local_cluster",
    "harness.processes",
    "harness.dev_process",
    "harness.cluster_process",
    "harness.worker_process",
    "harness.haproxy_process",
    "harness.prometheus_process",
    "harness.proxied_cluster",
    "harness.kv_cluster",
    "harness.typescript_sdk",
    "tests.crash.columns",
}


def direct_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_no_test_outside_the_process_marker_imports_a_process_starting_helper() -> None:
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not process"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    files = {line.split("::")[0] for line in collected.stdout.splitlines() if "::" in line}
    unmarked = {f: sorted(direct_imports(REPO / f) & PROCESS_IMPORTS) for f in files}
    assert {f: found for f, found in unmarked.items() if found} == {}
    assert "tests/raft/test_core.py" in files, "the fast loop lost the pure Raft core tests"
    summary = collected.stdout.strip().splitlines()[-1]
    assert "deselected" in summary, f"no test was marked `process`: {summary}"


def test_modules_that_start_processes_are_found_through_what_they_import() -> None:
    assert module_starts_processes("tests.e2e.test_stream_after_kill")  # harness.worker_process
    assert module_starts_processes("tests.crash.test_matrix")  # tests.crash helpers start Workers
    assert not module_starts_processes("tests.raft.test_core")


def test_test_helpers_are_followed_by_name_and_fixtures_count() -> None:
    assert symbol_starts_processes("tests.e2e.conftest", "cluster")  # a fixture that starts a cluster
    assert not symbol_starts_processes("tests.e2e.conftest", "running")  # same module, an in-process Worker
    assert symbol_starts_processes("tests.sdk_typescript.conftest", "dev")  # through harness.dev_process


def test_a_harness_module_that_starts_processes_counts_whole() -> None:
    # It imports only the launcher's option parsing, but from a module that starts Workers.
    assert module_starts_processes("tests.support.test_worker_process")
    assert not module_starts_processes("tests.support.test_waiting")  # harness.waiting starts nothing
