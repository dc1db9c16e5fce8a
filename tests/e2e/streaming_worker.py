"""A Worker in a process of its own, for tests that SIGKILL it mid-stream.

    python tests/e2e/streaming_worker.py URL AGENT TEXT

It runs AGENT, whose model streams TEXT word by word and then waits forever: a test kills
this process once it saw the words arrive, so the kill lands while the model streams.
"""

from __future__ import annotations

import asyncio
import sys

from dex_ha.worker import Agent, DeltaSink, ModelRequest, ModelResponse, Worker


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


async def main(url: str, agent_name: str, text: str) -> None:
    worker = Worker(
        url, agents=[Agent(agent_name, model=StreamThenWait(text))], poll_wait_ms=1_000, drain_timeout_s=0.1
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
