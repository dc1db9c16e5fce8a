"""A Worker on the channel that gets SIGKILL is noticed at once: its channel closes, the
attempt fails after the grace period (1 s by default) and the step's next attempt starts
on another Worker, far sooner than the heartbeat timeout (30 s, left at its default here).

Real processes: `dex-ha dev`, two Worker processes (tests/e2e/streaming_worker.py, SDK
defaults: the channel) whose model streams, then waits forever. The one that holds the
attempt is killed; the time from the kill to the next attempt's `attempt_started` event,
as the client sees it, is measured. The bound here is generous (a shared, loaded machine);
bench/steps_bench.py prints the figure itself.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from dex_ha.client import DexClient, SessionEvent
from harness.dev_process import DevProcess
from harness.waiting import eventually
from tests.e2e.test_stream_after_kill import DEADLINE_S, LOST_TEXT, sigkill, start_streaming_worker

AGENT = "streamer"
KILL_TO_NEXT_ATTEMPT_BOUND_S = 5.0  # the heartbeat timeout is 30 s: only the channel makes this


async def collect(client: DexClient, session_id: str, raw: list[tuple[float, SessionEvent]]) -> None:
    async for event in client.events(session_id):
        raw.append((time.monotonic(), event))


async def test_a_killed_channel_workers_step_starts_again_on_the_other_worker_within_seconds(tmp_path: Path) -> None:
    dev = DevProcess(tmp_path / "data", tmp_path / "dev.log", relaxed=True)
    dev.start()
    workers = []
    try:
        await dev.wait_ready()
        async with DexClient(dev.url) as client:
            sid = (await client.create_session(AGENT)).session_id
            raw: list[tuple[float, SessionEvent]] = []
            reader = asyncio.create_task(collect(client, sid, raw))
            workers = [start_streaming_worker(dev.url) for _ in range(2)]
            await client.send_message(sid, "hello")

            def started(attempt: int) -> list[tuple[float, SessionEvent]]:
                return [(t, e) for t, e in raw if e.type == "attempt_started" and e.attempt == attempt]

            await eventually(lambda: any(e.type == "delta" for _, e in raw), "attempt 1 streaming", DEADLINE_S)
            [(_, first)] = started(1)
            holder = next(w for w in workers if f"-{w.pid}-" in first.data["worker_id"])
            killed_at = time.monotonic()
            sigkill(holder)
            await eventually(lambda: bool(started(2)), "attempt 2 to start", DEADLINE_S)
            [(seen_at, second)] = started(2)
            reader.cancel()
            took_s = seen_at - killed_at
            assert second.data["worker_id"] != first.data["worker_id"]
            print(f"kill -> next attempt started: {took_s:.2f} s")
            assert took_s <= KILL_TO_NEXT_ATTEMPT_BOUND_S, f"kill -> next attempt took {took_s:.2f} s"
            failed = next(e for _, e in raw if e.type == "attempt_failed")
            assert failed.attempt == 1 and LOST_TEXT  # attempt 1 failed as a lost Worker does
    finally:
        for worker in workers:
            sigkill(worker)
        assert dev.stop() == 0, dev.log_tail()
