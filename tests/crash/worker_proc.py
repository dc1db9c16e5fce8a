"""A Worker as its own OS process, for the crash cells (and the soak and robustness suites):
the real Worker SDK running the agent a cell key names (tests/crash/rows.py: a row, a
variant or a case; or an agent of agents.OTHER_AGENTS), writing its side effects to the
ledger.

    python -m tests.crash.worker_proc --urls URL[,URL...] --ledger FILE --row R05 \
        --agent NAME --column worker_kill [--token T] [--heartbeat-interval S] [--max-concurrency N] \
        [--api-url URL --work-dir DIR]

`--api-url` and `--work-dir` are for the R21 agent (the Claude Agent SDK coder): the fake
Anthropic API it calls and the working directory of its Claude Code CLI, which dies with
this process (dex_ha.adapters.claude_launcher).

It runs until SIGTERM (a drain) or SIGKILL (the crash). DEX_HA_FAILPOINTS arms the
Worker's failpoints (dex_ha.worker.runner.WORKER_FAILPOINTS): the process then exits with
code 99 at that moment.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from dex_ha.worker import Worker
from tests.crash.agents import OTHER_AGENTS, AgentBuilder, Kit
from tests.crash.ledger import Ledger
from tests.crash.rows import CELL_RUNS

POLL_WAIT_MS = 1_000
BACKOFF_MAX_S = 0.2  # reconnect fast after a server restart or a takeover
AGENTS: dict[str, AgentBuilder] = {**{key: run.agent for key, run in CELL_RUNS.items()}, **OTHER_AGENTS}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--urls", required=True, help="comma-separated node URLs")
    parser.add_argument("--token", default=None)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--row", required=True, choices=sorted(AGENTS), help="the cell key that names the agent")
    parser.add_argument("--agent", required=True, help="the agent name (one per cell)")
    parser.add_argument("--column", required=True)
    parser.add_argument("--heartbeat-interval", type=float, default=None)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--api-url", default="", help="R21: the fake Anthropic API")
    parser.add_argument("--work-dir", type=Path, default=None, help="R21: the CLI's working directory")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    kit = Kit(Ledger(args.ledger), args.column, api_url=args.api_url, work_dir=args.work_dir)
    worker = Worker(
        args.urls.split(","),
        args.token,
        agents=[AGENTS[args.row](kit, args.agent)],
        poll_wait_ms=POLL_WAIT_MS,
        heartbeat_interval_s=args.heartbeat_interval,
        drain_timeout_s=1.0,
        backoff_max_s=BACKOFF_MAX_S,
        **({"max_concurrency": args.max_concurrency} if args.max_concurrency else {}),
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop()))
    await worker.run()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")
    asyncio.run(run(parse_args()))


if __name__ == "__main__":
    main()
