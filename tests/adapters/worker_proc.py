"""A Worker running one framework agent (tests/adapters/framework_agents.py) as its own OS
process, for the Worker-kill cells of the adapters.

    python -m tests.adapters.worker_proc --framework openai_agents|pydantic_ai --url URL \
        --agent NAME --base-url FAKE_URL --ledger FILE [--hang TOOL]

Its model is the framework's own OpenAI model on the fake OpenAI server at FAKE_URL; its
tools write their runs to the ledger, and `--hang TOOL` makes that tool hang on attempt 1
(heartbeating) until the process is killed. It runs until SIGTERM (a drain) or SIGKILL.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from dex_ha.worker import Worker
from tests.adapters.framework_agents import FRAMEWORKS, ToolKit, build, warm_up
from tests.crash.ledger import Ledger

POLL_WAIT_MS = 1_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", required=True, choices=FRAMEWORKS)
    parser.add_argument("--url", required=True, help="the dex-ha node URL")
    parser.add_argument("--agent", required=True)
    parser.add_argument("--base-url", required=True, help="the fake OpenAI server, ending in /v1")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--hang", default=None, help="the tool that hangs on its first attempt")
    return parser.parse_args()


async def run(args: argparse.Namespace) -> None:
    await warm_up(args.framework, Path(args.ledger).with_suffix(".warm-up"))
    agent = build(args.framework, args.agent, args.base_url, ToolKit(Ledger(args.ledger), args.hang))
    worker = Worker(args.url, agents=[agent], poll_wait_ms=POLL_WAIT_MS, drain_timeout_s=1.0, backoff_max_s=0.2)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop()))
    await worker.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")
    asyncio.run(run(parse_args()))
