"""A Worker process for the R21 cells: the Claude Agent SDK coder agent
(tests/support/claude_segment.py) against a fake Anthropic API, writing its deferred tool's
runs to the ledger and its inline Bash runs to `inline.log` in the work directory.

    python -m tests.crash.r21_worker --urls URL[,URL...] --ledger FILE --agent NAME \
        --api-url URL --work-dir DIR [--token T]

It runs until SIGTERM (a drain) or SIGKILL (the crash); the Claude Code CLI it starts dies
with it (dex_ha.adapters.claude_launcher).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from dex_ha.worker import Worker
from tests.crash.worker_proc import BACKOFF_MAX_S, POLL_WAIT_MS
from tests.support.claude_segment import coder_agent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", required=True, help="comma-separated node URLs")
    parser.add_argument("--token", default=None)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--api-url", required=True, help="the fake Anthropic API")
    parser.add_argument("--work-dir", required=True, help="the CLI's working directory")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    agent = coder_agent(args.agent, api_url=args.api_url, work_dir=Path(args.work_dir), ledger_path=Path(args.ledger))
    worker = Worker(
        args.urls.split(","),
        args.token,
        agents=[agent],
        poll_wait_ms=POLL_WAIT_MS,
        drain_timeout_s=1.0,
        backoff_max_s=BACKOFF_MAX_S,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop()))
    await worker.run()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")
    asyncio.run(run(parse_args()))


if __name__ == "__main__":
    main()
