"""A Worker as its own OS process, for the crash cells: the real Worker SDK running the
row's agent (tests/crash/agents.py), writing its side effects to the ledger.

    python -m tests.crash.worker_proc --urls URL[,URL...] --ledger FILE --row R05 \
        --agent NAME --column worker_kill [--token T] [--heartbeat-interval S] [--max-concurrency N]

It runs until SIGTERM (a drain) or SIGKILL (the crash). DEX_HA_FAILPOINTS arms the
Worker's failpoints (dex_ha.worker.runner.WORKER_FAILPOINTS): the process then exits with
code 99 at that moment.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from dex_ha.worker import Worker
from tests.crash.agents import AGENTS, Kit
from tests.crash.ledger import Ledger

POLL_WAIT_MS = 1_000
BACKOFF_MAX_S = 0.2  # reconnect fast after a server restart or a takeover


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", required=True, help="comma-separated node URLs")
    parser.add_argument("--token", default=None)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--row", required=True, choices=sorted(AGENTS))
    parser.add_argument("--agent", required=True, help="the agent name (one per cell)")
    parser.add_argument("--column", required=True)
    parser.add_argument("--heartbeat-interval", type=float, default=None)
    parser.add_argument("--max-concurrency", type=int, default=None)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    kit = Kit(Ledger(args.ledger), args.column)
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
