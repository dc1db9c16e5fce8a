"""The Worker process of bench/steps_bench.py: one Python Worker, in its own process.

It runs the bench agent (a scripted model that calls one no-op `read` tool and then
answers, so a turn is RunModel, CallTool, RunModel) with `max_concurrency` slots, and
writes one line to stdout for every result the server accepted (committed):

    ready <pid>                                   the agent is registered; tasks may come
    c <session_id> <kind> <monotonic_ns> <ok>     one step completed (ok=1) or failed (ok=0);
                                                  written when accepted, flushed within 50 ms
    end <completed>                               after SIGTERM/SIGINT, before it exits

`monotonic_ns` is CLOCK_MONOTONIC, the same clock in every process of the machine, so the
bench can put the lines on its own timeline. It stops (drain, then exit 0) on SIGTERM.

    python bench/steps_worker.py --url http://127.0.0.1:8801 --agent bench-c16 --max-concurrency 16 \\
        --turns-per-session 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from typing import Any, TextIO
from urllib.parse import quote

from dex_ha.client import Connection
from dex_ha.worker import (
    Agent,
    ModelRequest,
    ScriptedModel,
    ToolContext,
    Worker,
    WorkerTask,
)

# The name of the bench's no-op tool ("read" effect: safe to repeat, not inline).
TOOL_NAME = "read"
STOP_DRAIN_S = 5.0


def bench_script(request: ModelRequest) -> dict[str, Any]:
    """After a tool result: answer (the turn ends). Otherwise: call the tool once.

    It looks only at the last history item, so every turn of a session does the same
    three steps however long the history is. The answer has no text on purpose: text is
    streamed as deltas, which costs an extra heartbeat request, and this bench measures
    steps, not streaming.
    """
    last = request.history[-1] if request.history else None
    if isinstance(last, dict) and last.get("type") == "tool_result":
        return {"content": "", "tool_calls": []}
    return {"content": "", "tool_calls": [{"name": TOOL_NAME, "arguments": {"key": "k"}}]}


class Hang:
    """A model that never answers (--hang): the bench SIGKILLs the Worker that holds its step."""

    async def respond(self, request: ModelRequest, stream: Any) -> Any:
        await asyncio.Event().wait()  # nothing ever sets it

    async def summarize(self, history: list[Any], summary: str | None) -> str:
        return ""


def bench_agent(name: str, hang: bool = False) -> Agent:
    """The bench agent: the scripted model and one no-op `read` tool."""
    agent = Agent(name, model=Hang() if hang else ScriptedModel(bench_script))

    @agent.tool(effect="read", name=TOOL_NAME)
    async def read_value(ctx: ToolContext, key: str) -> dict[str, str]:
        """Return the key: no I/O, so the step costs only the SDK and the server."""
        return {"key": key}

    return agent


class CompletionLog:
    """Writes the protocol lines. A write to the pipe costs ~0.1 ms on this VM (it wakes
    the bench), which would sit inside every step at concurrency 1; so lines are flushed
    every FLUSH_INTERVAL_S, except the one that ends a session, which the bench is
    waiting for to start the next session (flushed at once)."""

    FLUSH_INTERVAL_S = 0.05

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._flush_timer: asyncio.TimerHandle | None = None

    def line(self, text: str, *, urgent: bool = True) -> None:
        self._out.write(text + "\n")
        if urgent:
            self.flush()
        elif self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(self.FLUSH_INTERVAL_S, self.flush)

    def completion(self, session_id: str, kind: str, ok: bool, *, ends_session: bool) -> None:
        self.line(f"c {session_id} {kind} {time.monotonic_ns()} {int(ok)}", urgent=ends_session)

    def flush(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._out.flush()


class ReportingWorker(Worker):
    """A Worker that reports each result the server accepted, at the moment it did (the
    server answers `complete` only after the commit), through the SDK's `on_result`."""

    def __init__(self, *args: Any, completions: CompletionLog, turns_per_session: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_result = self._report
        self._completions = completions
        self._turns_per_session = turns_per_session

    def _report(self, task: WorkerTask, outcome: Any) -> None:
        self._completions.completion(
            task.session_id, task.kind, not outcome.failed, ends_session=self._ends_session(task, outcome)
        )

    def _ends_session(self, task: WorkerTask, outcome: Any) -> bool:
        """The answer (no tool call) of the session's last turn: the bench starts the next
        session when it sees this line."""
        if task.kind != "RunModel" or outcome.failed or outcome.result.get("tool_calls"):
            return False
        history = task.input.get("history") or []
        return sum(1 for item in history if item.get("type") == "user") >= self._turns_per_session


async def register(urls: list[str], token: str | None, agent: Agent) -> None:
    """Register the agent before saying ready, so no session starts before its tools are
    known. The Worker registers it again when it starts (the same definition: a no-op)."""
    conn = Connection(urls, token, give_up_after_s=30.0)
    try:
        await conn.request("PUT", f"/v1/agents/{quote(agent.name, safe='')}", agent.definition())
    finally:
        await conn.close()


async def run(args: argparse.Namespace) -> int:
    agent = bench_agent(args.agent, hang=args.hang)
    completions = CompletionLog(sys.stdout)
    await register(args.url, args.token, agent)
    worker = ReportingWorker(
        args.url,
        args.token,
        agents=[agent],
        max_concurrency=args.max_concurrency,
        poll_wait_ms=args.poll_wait_ms,
        completions=completions,
        turns_per_session=args.turns_per_session,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = asyncio.create_task(worker.run())
    completions.line(f"ready {os.getpid()}")
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    await worker.stop(drain_timeout_s=STOP_DRAIN_S)
    await runner  # raises if the Worker failed (a refused registration): exit non-zero
    stopper.cancel()
    completions.line(f"end {worker.completed}")
    return 0


def use_uvloop() -> None:
    """Like the server: uvloop when installed (the SDK works on either loop)."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", action="append", required=True, help="a node URL (repeat for a cluster)")
    parser.add_argument("--agent", required=True, help="the agent name to register and serve")
    parser.add_argument("--max-concurrency", type=int, required=True, help="task slots of the Worker")
    parser.add_argument(
        "--token",
        default=os.environ.get("DEX_HA_WORKER_TOKEN"),
        help="worker-role token (default: $DEX_HA_WORKER_TOKEN; none for dex-ha dev)",
    )
    parser.add_argument(
        "--turns-per-session",
        type=int,
        required=True,
        help="turns the bench queues per session (the last one's answer is flushed at once)",
    )
    parser.add_argument("--poll-wait-ms", type=int, default=5_000, help="long-poll wait of the Worker")
    parser.add_argument("--hang", action="store_true", help="the model never answers (the Worker-kill timing)")
    args = parser.parse_args(argv)
    if args.max_concurrency < 1:
        parser.error("--max-concurrency must be at least 1")
    use_uvloop()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
