"""A Worker running AnthropicModel in a process of its own, for tests that SIGKILL it while
the model streams.

    python -m tests.models.anthropic_worker_proc --url URL --agent NAME --ledger FILE

The model talks to ANTHROPIC_BASE_URL (the test's fake Anthropic API) with ANTHROPIC_API_KEY.
Each model call is written to the ledger (tests/crash/ledger.py) when it starts and when it
returns, with this process's pid, so the test sees from outside which process ran what.
It runs until SIGTERM (a drain) or SIGKILL (the crash).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from dex_ha.models.anthropic import AnthropicModel
from dex_ha.worker import Agent, DeltaSink, ModelRequest, ModelResponse, Worker
from tests.crash.ledger import Ledger

MODEL_NAME = "claude-test"


class LedgerAnthropicModel(AnthropicModel):
    """AnthropicModel that writes each respond() to the ledger: `started`, then `finished`."""

    def __init__(self, ledger: Ledger, agent: str) -> None:
        super().__init__(MODEL_NAME, system="You answer briefly.", max_tokens=256)
        self.ledger = ledger
        self.agent = agent

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        self.ledger.record("model", self.agent, "started", data={"history": request.history})
        response = await super().respond(request, stream)
        self.ledger.record("model", self.agent, "finished", data={"content": response.content})
        return response


async def run(args: argparse.Namespace) -> None:
    model = LedgerAnthropicModel(Ledger(args.ledger), args.agent)
    worker = Worker(
        args.url, agents=[Agent(args.agent, model=model)], poll_wait_ms=1_000, drain_timeout_s=1.0, backoff_max_s=0.2
    )
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop()))
    await worker.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--ledger", required=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
