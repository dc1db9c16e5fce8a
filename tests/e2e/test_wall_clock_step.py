"""Deadlines from elapsed time: a step of the active node's wall clock changes no outcome.

A real `dex-ha dev` process reads its wall clock through libfaketime (harness/wall_clock.py),
stepped by an hour either way while it runs; its monotonic clock stays real. Every command's
`at` (which the engine compares with deadlines, retry windows and timers) comes from the
node's ActiveClock: the wall clock read at takeover plus monotonic time since. Before, `at`
was read from the wall clock at each command, so a +1 h step put every running attempt past
its start_to_close deadline (a heartbeating `write` tool became outcome_unknown).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from harness.dev_process import DevProcess
from harness.wall_clock import SteppableWallClock, unavailable_reason

HOUR_S = 3600

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")


def test_the_steppable_clock_steps_only_the_wall_clock(tmp_path: Path):
    clock = SteppableWallClock(tmp_path / "offset")
    clock.step(HOUR_S)
    probe = "import time; print(time.time(), time.clock_gettime(time.CLOCK_BOOTTIME))"
    before_wall, before_boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
    out = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, **clock.env()}, capture_output=True, text=True, check=True
    )
    wall, boot = map(float, out.stdout.split())
    assert HOUR_S - 60 < wall - before_wall < HOUR_S + 60
    assert 0 <= boot - before_boot < 60


async def created_at(http: aiohttp.ClientSession, url: str, session_id: str) -> int:
    async with http.post(url + "/v1/sessions", json={"agent": "a", "session_id": session_id}) as r:
        assert r.status == 201, await r.text()
    async with http.get(f"{url}/v1/sessions/{session_id}") as r:
        body = await r.json()
    return int(body.get("created_at") or body["session"]["created_at"])


async def test_commands_on_the_active_node_follow_elapsed_time_across_wall_clock_steps(tmp_path: Path):
    clock = SteppableWallClock(tmp_path / "offset")
    dev = DevProcess(tmp_path / "data", tmp_path / "dev.log", extra_env=clock.env())
    dev.start()
    try:
        await dev.wait_ready()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            first = await created_at(http, dev.url, "s1")
            clock.step(HOUR_S)
            ahead = await created_at(http, dev.url, "s2")
            clock.step(-2 * HOUR_S)
            behind = await created_at(http, dev.url, "s3")
        assert 0 <= ahead - first < 60_000, (first, ahead)
        assert 0 <= behind - ahead < 60_000, (ahead, behind)
    finally:
        dev.stop()
