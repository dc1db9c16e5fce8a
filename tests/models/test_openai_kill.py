"""Crash-matrix row R02 with OpenAIModel: a Worker process gets SIGKILL while the model's
answer streams; a new Worker process runs attempt 2; a client keeping its text with
StreamText ends with attempt 2's text only.

Real processes: `dex-ha dev` (a 2 s heartbeat timeout, so the killed Worker's attempt fails
in about 2 s) and two Worker processes (tests/models/openai_worker_proc.py) in turn. The
fake OpenAI server runs in this process: attempt 1's stream stalls after three words, so
the kill lands mid-stream. Evidence from outside the server: the fake's request log, the
ledger the Worker processes write, the client's event stream.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from dex_ha.client import DexClient, SessionEvent, StreamText
from harness.dev_process import DevProcess
from harness.fake_models.openai_api import FakeOpenAI, Reply
from harness.processes import REPO_ROOT
from harness.waiting import eventually
from harness.worker_process import start_worker
from tests.crash.columns import WORKER_KILL_HEARTBEAT_TIMEOUT_MS
from tests.crash.ledger import Ledger
from tests.e2e.test_stream_after_kill import follow, sigkill, texts_of

AGENT = "streamer"
LOST_TEXT = "attempt one starts to answer and is cut off"
FINAL_TEXT = "attempt two gives the whole answer"
DEADLINE_S = 30.0


def start_openai_worker(dev: DevProcess, fake: FakeOpenAI, ledger: Path, log: Path) -> subprocess.Popen[bytes]:
    args = ["--agent", AGENT, "--base-url", fake.base_url, "--ledger", str(ledger)]
    return start_worker("tests.models.openai_worker_proc", dev.url, args, log=log, cwd=REPO_ROOT)


async def test_r02_a_worker_killed_mid_stream(tmp_path: Path) -> None:
    dev = DevProcess(
        tmp_path / "data",
        tmp_path / "dev.log",
        relaxed=True,
        extra_env={"DEX_HA_HEARTBEAT_TIMEOUT_MS": str(WORKER_KILL_HEARTBEAT_TIMEOUT_MS)},
    )
    ledger_path, log = tmp_path / "ledger.sqlite", tmp_path / "workers.log"
    workers: list[subprocess.Popen[bytes]] = []
    dev.start()
    try:
        async with FakeOpenAI() as fake, DexClient(dev.url) as client:
            fake.queue(Reply(LOST_TEXT, stall_after=3, delta_delay_s=0.01), Reply(FINAL_TEXT, delta_delay_s=0.01))
            await dev.wait_ready()
            sid = (await client.create_session(AGENT)).session_id
            raw: list[SessionEvent] = []
            stream = StreamText()
            reader = asyncio.create_task(follow(client, sid, raw, stream))
            await client.send_message(sid, "hello")
            workers.append(start_openai_worker(dev, fake, ledger_path, log))

            # Attempt 1's first three words reached the client; the model API hangs after them.
            await fake.wait_stalled(DEADLINE_S)
            await eventually(lambda: len(texts_of(raw, 1).split()) == 3, "attempt 1's deltas", DEADLINE_S)
            [step_id] = {e.step_id for e in raw if e.type == "delta"}
            assert step_id is not None  # a delta names its step
            assert stream.text(step_id) == "attempt one starts "
            sigkill(workers[0])
            await eventually(lambda: any(e.type == "attempt_failed" for e in raw), "attempt 1 failing", DEADLINE_S)
            assert stream.text(step_id) == ""  # the failed attempt's text is dropped

            workers.append(start_openai_worker(dev, fake, ledger_path, log))
            await asyncio.wait_for(reader, DEADLINE_S)

            failed = next(e for e in raw if e.type == "attempt_failed")
            assert (failed.step_id, failed.attempt) == (step_id, 1)
            assert texts_of(raw, 1) == "attempt one starts " and texts_of(raw, 2) == FINAL_TEXT
            assert stream.text(step_id) == FINAL_TEXT and stream.attempt(step_id) == 2
            snapshot = await client.get_session(sid)
            assert [h["content"] for h in snapshot.history if h["type"] == "assistant"] == [FINAL_TEXT]

            # The model API got the same request twice, once from each Worker process.
            first, second = fake.requests
            assert first.body == second.body
            ledger = Ledger(ledger_path)
            calls = ledger.runs("model", AGENT, "started")
            ledger.close()
            assert [run.pid for run in calls] == [workers[0].pid, workers[1].pid]
            assert calls[0].data == calls[1].data
    finally:
        for worker in workers:
            sigkill(worker)
        assert dev.stop() == 0, dev.log_tail()
