"""The crash cells' Worker process (tests/crash/worker_proc.py run by the Worker launcher):
what a cell asks `WorkerProcess` for is what the child's Worker and agent are built from."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

from harness.worker_process import WorkerOptions, parse_args
from tests.crash.columns import WorkerProcess


def child_of(worker: WorkerProcess) -> tuple[ModuleType, argparse.Namespace, WorkerOptions]:
    """What the child parses from the command line `worker.start()` gives the launcher."""
    return parse_args(
        ["tests.crash.worker_proc", "--urls", ",".join(worker.urls), *worker.options.flags(), *worker.agent_args]
    )


def test_the_cells_options_reach_the_child_with_the_crash_workers_own(tmp_path: Path) -> None:
    worker = WorkerProcess(
        ["http://a", "http://b"],
        "w0rker",
        ledger=tmp_path / "ledger.db",
        row="R05",
        agent="r05-worker-kill-abc",
        column="worker_kill",
        log_path=tmp_path / "worker.log",
        heartbeat_interval_s=10.0,
        max_concurrency=2,
    )
    module, args, options = child_of(worker)
    # Short polls and drain, a fast reconnect: what the crash Worker ran with before the launcher.
    assert options == WorkerOptions(
        token="w0rker",
        poll_wait_ms=1_000,
        drain_timeout_s=1.0,
        backoff_max_s=0.2,
        heartbeat_interval_s=10.0,
        max_concurrency=2,
    )
    assert args.urls.split(",") == ["http://a", "http://b"]
    [agent] = module.agents(args)
    assert agent.name == "r05-worker-kill-abc"
    assert (args.ledger, args.column) == (str(tmp_path / "ledger.db"), "worker_kill")


def test_an_option_the_cell_leaves_unset_is_not_given_to_the_worker(tmp_path: Path) -> None:
    worker = WorkerProcess(
        ["http://a"], None, ledger=tmp_path / "l.db", row="SOAK", agent="soak", column="soak", log_path=tmp_path / "w"
    )
    _, _, options = child_of(worker)
    assert options.worker_kwargs() == {
        "token": None,
        "poll_wait_ms": 1_000,
        "drain_timeout_s": 1.0,
        "backoff_max_s": 0.2,
    }
