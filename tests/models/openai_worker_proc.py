"""The agent of a Worker process running OpenAIModel, for tests that SIGKILL it mid-stream
(started with harness.worker_process.start_worker):

    python -m harness.worker_process tests.models.openai_worker_proc --urls URL --agent NAME \
        --base-url FAKE_URL --ledger FILE [--api responses|chat]

Its model is OpenAIModel against the fake OpenAI server at FAKE_URL; each model call is
written to the ledger (tests/crash/ledger.py) before it is made, with what the model saw,
so a test can tell from outside the server which process called the model with what.
"""

from __future__ import annotations

import argparse

from dex_ha.models.openai import OpenAIModel
from dex_ha.worker import Agent, DeltaSink, ModelRequest, ModelResponse
from tests.crash.ledger import Ledger


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

    async def aclose(self) -> None:
        await self.model.aclose()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", required=True)
    parser.add_argument("--base-url", required=True, help="the fake OpenAI server, ending in /v1")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--api", default="responses", choices=("responses", "chat"))


def agents(args: argparse.Namespace) -> list[Agent]:
    model = OpenAIModel("gpt-test", api=args.api, api_key="sk-test", base_url=args.base_url)
    return [Agent(args.agent, model=LedgeredModel(model, Ledger(args.ledger), args.agent))]
