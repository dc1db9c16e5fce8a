"""The agent of a Worker process running AnthropicModel, for tests that SIGKILL it while
the model streams (started with harness.worker_process.start_worker):

    python -m harness.worker_process tests.models.anthropic_worker_proc --urls URL --agent NAME --ledger FILE

The model talks to ANTHROPIC_BASE_URL (the test's fake Anthropic API) with ANTHROPIC_API_KEY.
Each model call is written to the ledger (tests/crash/ledger.py) when it starts and when it
returns, with this process's pid, so the test sees from outside which process ran what.
"""

from __future__ import annotations

import argparse

from dex_ha.models.anthropic import AnthropicModel
from dex_ha.worker import Agent, DeltaSink, ModelRequest, ModelResponse
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", required=True)
    parser.add_argument("--ledger", required=True)


def agents(args: argparse.Namespace) -> list[Agent]:
    return [Agent(args.agent, model=LedgerAnthropicModel(Ledger(args.ledger), args.agent))]
