"""The agent of a Worker process for tests that SIGKILL it mid-stream (started with
harness.worker_process.start_worker):

    python -m harness.worker_process tests.e2e.streaming_worker --urls URL --agent AGENT --text TEXT

AGENT whose model streams TEXT word by word and then waits forever: a test kills
this process once it saw the words arrive, so the kill lands while the model streams.
"""

from __future__ import annotations

import argparse
import asyncio

from dex_ha.worker import Agent, DeltaSink, ModelRequest, ModelResponse


class StreamThenWait:
    """A model that streams its text, then never answers (the test kills its process)."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        for word in self.text.split(" "):
            stream.send_text(word + " ")
            await asyncio.sleep(0.01)
        await asyncio.Event().wait()  # nothing ever sets it
        raise AssertionError("unreachable")

    async def summarize(self, history: list, summary: str | None) -> str:
        return "unused"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", required=True)
    parser.add_argument("--text", required=True, help="what the model streams before it waits")


def agents(args: argparse.Namespace) -> list[Agent]:
    return [Agent(args.agent, model=StreamThenWait(args.text))]
