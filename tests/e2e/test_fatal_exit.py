"""A node whose Raft loop dies must not linger as a zombie.

When an fsync of the Raft log fails (EIO), durability is unknown and the node must stop.
Before: the Raft loop task died, the process kept serving HTTP, one proposal hung for good.
Now: the process exits non-zero at once (exit code 70), so its supervisor restarts it, and
the restarted node recovers from its log.

The failure is injected with the `storage.fsync:eio` failpoint (the fsync call raises
OSError(EIO) the Nth time), in a real `dex-ha dev` process with strict durability.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from dex_ha.failpoints import FAILPOINT_ENV
from dex_ha.server.process import FATAL_EXIT_CODE
from harness.dev_process import DevProcess

EXIT_DEADLINE_S = 10.0


async def _create_sessions_until_the_node_dies(dev: DevProcess) -> float:
    """Create sessions until a request fails; returns when (monotonic) the first one did."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=EXIT_DEADLINE_S)) as session:
        for i in range(200):
            try:
                async with session.post(dev.url + "/v1/sessions", json={"agent": "a", "session_id": f"s{i}"}) as r:
                    if r.status >= 500:
                        return time.monotonic()
            except (TimeoutError, aiohttp.ClientError):
                return time.monotonic()
    raise AssertionError(f"the injected fsync failure never happened\n{dev.log_tail()}")


async def test_a_failed_fsync_makes_the_node_exit_non_zero_at_once(tmp_path: Path):
    dev = DevProcess(tmp_path / "data", tmp_path / "dev.log", extra_env={FAILPOINT_ENV: "storage.fsync:eio@30"})
    dev.start()
    try:
        await dev.wait_ready()
        failed_at = await _create_sessions_until_the_node_dies(dev)
        assert dev.proc is not None
        code = await asyncio.to_thread(dev.proc.wait, EXIT_DEADLINE_S)
        exited_after = time.monotonic() - failed_at
        assert code == FATAL_EXIT_CODE, f"exit code {code}\n{dev.log_tail()}"
        assert exited_after < EXIT_DEADLINE_S
        assert "the Raft loop stopped" in dev.log_path.read_text(), dev.log_tail()
    finally:
        dev.stop()
    # The supervisor's restart: the node recovers from its log, and every session it
    # acknowledged before the failure is there.
    restarted = DevProcess(tmp_path / "data", tmp_path / "dev2.log")
    restarted.start()
    try:
        await restarted.wait_ready()
        async with aiohttp.ClientSession() as session:
            async with session.get(restarted.url + "/v1/sessions?limit=1000") as r:
                assert r.status == 200
                ids = {s["session_id"] for s in (await r.json())["sessions"]}
        assert "s0" in ids, "a session acknowledged before the failure was lost"
    finally:
        restarted.stop()
