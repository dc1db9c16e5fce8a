"""A Worker running OpenAIModel as its own OS process, for tests that SIGKILL it mid-stream.

    python -m tests.models.openai_worker_proc --url URL --agent NAME --base-url FAKE_URL \
        --ledger FILE [--api responses|chat]

Its model is OpenAIModel against the fake OpenAI server at FAKE_URL; each model call is
written to the ledger (tests/crash/ledger.py) before it is made, with what the model saw,
so a test can tell from outside the server which process called the model with what.
It runs until SIGTERM (a drain) or SIGKILL (the crash).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from dex_ha.models.openai import OpenAIModel
from dex_ha.worker import Agent, DeltaSink, ModelRequest, ModelResponse, Worker
from tests.crash.ledger import Ledger

POLL_WAIT_MS = 1_000


class LedgeredModel:
    """OpenAIModel, with each call recorded in the ledger first (kind "model")."""

    def __init__(self, model: OpenAIModel, ledger: Ledger, agent: str) -> None:
        self.model, self.ledger, self.agent = model, ledger, agent

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        self.ledger.record(
            "model", self.agent, "started", data={"history": request.history, "summary": request.summary}
        )
        return await self.model.respond(request, stream)

    async def summarize(self, history: list, summary: str | None) -> str:
        self.ledger.record("summary", self.agent, "asked", data={"history": history, "summary": summary})
        return await self.model.summarize(history, summary)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the dex-ha node URL")
    parser.add_argument("--agent", required=True)
    parser.add_argument("--base-url", required=True, help="the fake OpenAI server, ending in /v1")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--api", default="responses", choices=("responses", "chat"))
    return parser.parse_args()


async def run(args: argparse.Namespace) -> None:
    model = OpenAIModel("gpt-test", api=args.api, api_key="sk-test", base_url=args.base_url)
    agent = Agent(args.agent, model=LedgeredModel(model, Ledger(args.ledger), args.agent))
    worker = Worker(args.url, agents=[agent], poll_wait_ms=POLL_WAIT_MS, drain_timeout_s=1.0)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop()))
    try:
        await worker.run()
    finally:
        await model.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")
    asyncio.run(run(parse_args()))
