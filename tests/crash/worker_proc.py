"""The agent of a Worker process for the crash cells (and the soak and robustness suites),
started with harness.worker_process.start_worker (by `WorkerProcess` in columns.py): the
real Worker SDK running the agent a cell key names (tests/crash/rows.py: a row, a variant or
a case; or an agent of agents.OTHER_AGENTS), writing its side effects to the ledger.

    python -m harness.worker_process tests.crash.worker_proc --urls URL[,URL...] \
        --ledger FILE --row R05 --agent NAME --column worker_kill [--api-url URL --work-dir DIR] \
        [the launcher's options: --token T --heartbeat-interval-s S --max-concurrency N ...]

WorkerProcess gives it the launcher's options CRASH_WORKER_OPTIONS (columns.py).

`--api-url` and `--work-dir` are for the R21 agent (the Claude Agent SDK coder): the fake
Anthropic API it calls and the working directory of its Claude Code CLI, which dies with
this process (dex_ha.adapters.claude_launcher).

DEX_HA_FAILPOINTS in the process's environment arms the Worker's failpoints
(dex_ha.worker.runner.WORKER_FAILPOINTS): the process then exits with code 99 at that moment.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dex_ha.worker import Agent
from tests.crash.agents import OTHER_AGENTS, AgentBuilder, Kit
from tests.crash.ledger import Ledger
from tests.crash.rows import CELL_RUNS

AGENTS: dict[str, AgentBuilder] = {**{key: run.agent for key, run in CELL_RUNS.items()}, **OTHER_AGENTS}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--row", required=True, choices=sorted(AGENTS), help="the cell key that names the agent")
    parser.add_argument("--agent", required=True, help="the agent name (one per cell)")
    parser.add_argument("--column", required=True)
    parser.add_argument("--api-url", default="", help="R21: the fake Anthropic API")
    parser.add_argument("--work-dir", type=Path, default=None, help="R21: the CLI's working directory")


def agents(args: argparse.Namespace) -> list[Agent]:
    kit = Kit(Ledger(args.ledger), args.column, api_url=args.api_url, work_dir=args.work_dir)
    return [AGENTS[args.row](kit, args.agent)]
