"""The agent of a Worker process running one framework agent
(tests/adapters/framework_agents.py), for the Worker-kill cells of the adapters (started
with harness.worker_process.start_worker):

    python -m harness.worker_process tests.adapters.worker_proc --urls URL --framework \
        openai_agents|pydantic_ai --agent NAME --base-url FAKE_URL --ledger FILE [--hang TOOL]

Its model is the framework's own OpenAI model on the fake OpenAI server at FAKE_URL; its
tools write their runs to the ledger, and `--hang TOOL` makes that tool hang on attempt 1
(heartbeating) until the process is killed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dex_ha.worker import Agent
from tests.adapters.framework_agents import FRAMEWORKS, ToolKit, build, warm_up
from tests.crash.ledger import Ledger


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--framework", required=True, choices=FRAMEWORKS)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--base-url", required=True, help="the fake OpenAI server, ending in /v1")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--hang", default=None, help="the tool that hangs on its first attempt")


async def agents(args: argparse.Namespace) -> list[Agent]:
    await warm_up(args.framework, Path(args.ledger).with_suffix(".warm-up"))
    return [build(args.framework, args.agent, args.base_url, ToolKit(Ledger(args.ledger), args.hang))]
