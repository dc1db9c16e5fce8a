"""Crash-matrix R02 seen by a client: a RunModel attempt streams some text, its Worker
gets SIGKILL mid-stream, and a new Worker runs attempt 2 with other text. The server
relayed attempt 1's deltas; a client that keeps its text with `StreamText` ends with
attempt 2's text only.

Real processes: `dex-ha dev` with a 1 s heartbeat timeout (so the kill is noticed within
about a second), the first Worker in a child process (tests/e2e/streaming_worker.py) whose
model streams, then waits forever; the second Worker in this process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

from dex_ha.client import DexClient, SessionEvent, StreamText
from dex_ha.worker import Agent, ScriptedModel, Worker
from harness.dev_process import DevProcess
from harness.waiting import eventually
from harness.worker_process import WorkerOptions, start_worker
from tests.e2e.conftest import running

AGENT = "streamer"
LOST_TEXT = "attempt one says hello and is cut off"
FINAL_TEXT = "attempt two gives the whole answer"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 30.0


def start_streaming_worker(url: str) -> subprocess.Popen[bytes]:
    args = ["--agent", AGENT, "--text", LOST_TEXT]
    return start_worker("tests.e2e.streaming_worker", url, args, options=WorkerOptions(drain_timeout_s=0.1))


def sigkill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


async def follow(client: DexClient, session_id: str, raw: list[SessionEvent], stream: StreamText) -> None:
    """Every event of the session into `raw` and `stream`, until the turn completed."""
    async for event in client.events(session_id):
        raw.append(event)
        stream.feed(event)
        if event.type == "turn_completed":
            return


def texts_of(raw: list[SessionEvent], attempt: int) -> str:
    return "".join(e.data.get("text", "") for e in raw if e.type == "delta" and e.attempt == attempt)


async def test_a_killed_attempts_text_is_dropped(tmp_path: Path) -> None:
    dev = DevProcess(
        tmp_path / "data", tmp_path / "dev.log", relaxed=True, extra_env={"DEX_HA_HEARTBEAT_TIMEOUT_MS": "1000"}
    )
    child: subprocess.Popen[bytes] | None = None
    dev.start()
    try:
        await dev.wait_ready()
        async with DexClient(dev.url) as client:
            sid = (await client.create_session(AGENT)).session_id
            raw: list[SessionEvent] = []
            stream = StreamText()
            reader = asyncio.create_task(follow(client, sid, raw, stream))
            await client.send_message(sid, "hello")
            child = start_streaming_worker(dev.url)

            # Attempt 1 streamed some words; then its Worker dies mid-stream.
            await eventually(lambda: len(texts_of(raw, 1).split()) >= 3, "attempt 1's deltas", DEADLINE_S)
            sigkill(child)
            [step_id] = {e.step_id for e in raw if e.type == "delta"}
            assert step_id is not None  # a delta names its step
            assert stream.text(step_id).strip() and LOST_TEXT.startswith(stream.text(step_id).strip())
            await eventually(lambda: any(e.type == "attempt_failed" for e in raw), "attempt 1 failing", DEADLINE_S)
            assert stream.text(step_id) == ""  # its text is gone as soon as the failure is known

            worker = Worker(
                dev.url,
                agents=[Agent(AGENT, model=ScriptedModel([{"content": FINAL_TEXT}], delta_delay_s=0.01))],
                poll_wait_ms=1_000,
                drain_timeout_s=1.0,
            )
            async with running(worker):
                await asyncio.wait_for(reader, DEADLINE_S)

            failed = next(e for e in raw if e.type == "attempt_failed")
            assert (failed.step_id, failed.attempt) == (step_id, 1)
            assert texts_of(raw, 1).strip() and texts_of(raw, 2) == FINAL_TEXT  # both were relayed...
            assert stream.text(step_id) == FINAL_TEXT and stream.attempt(step_id) == 2  # ...one is kept
            snapshot = await client.get_session(sid)
            assert [h["content"] for h in snapshot.history if h["type"] == "assistant"] == [FINAL_TEXT]
    finally:
        sigkill(child)
        assert dev.stop() == 0, dev.log_tail()
