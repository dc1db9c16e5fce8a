"""A full disk is an alarm, not a crash loop.

A real `dex-ha dev` node keeps its data directory on a small tmpfs (mounted here: the
tests run as root, as CI does); a ballast file fills it. Before: the node exited 70 on the
failed write, restarted, failed again; clients got 503 "not the active node" pointing at
the node itself. Now: the same process lives on, answers writes 503 `no_space` naming the
path and the free bytes, keeps answering /livez, /metrics and /v1/cluster (alarm, metric),
and writes again by itself once the ballast is deleted, with nothing acknowledged lost.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.dev_process import DevProcess
from harness.small_disk import fill, mount_tmpfs, unmount

TMPFS_BYTES = 8 << 20
DEADLINE_S = 20.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MB tmpfs at tmp_path/disk, unmounted afterwards."""
    mount_point = tmp_path / "disk"
    reason = mount_tmpfs(mount_point, TMPFS_BYTES)
    if reason is not None:
        pytest.skip(reason)
    try:
        yield mount_point
    finally:
        unmount(mount_point)


async def create(session: aiohttp.ClientSession, url: str, session_id: str) -> tuple[int, dict]:
    async with session.post(url + "/v1/sessions", json={"agent": "a", "session_id": session_id}) as r:
        return r.status, await r.json()


async def test_a_full_disk_refuses_writes_with_no_space_and_resumes_when_space_is_freed(small_disk: Path, tmp_path):
    dev = DevProcess(small_disk / "data", tmp_path / "dev.log")
    dev.start()
    try:
        await dev.wait_ready()
        assert dev.proc is not None
        pid = dev.proc.pid
        timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            acknowledged = []
            for i in range(5):
                status, _ = await create(http, dev.url, f"before-{i}")
                assert status == 201
                acknowledged.append(f"before-{i}")
            ballast = small_disk / "ballast"
            fill(ballast)
            refused = None
            for i in range(400):  # a write needs a new page of the log or of SQLite's WAL soon
                status, body = await create(http, dev.url, f"during-{i}")
                if status == 201:
                    acknowledged.append(f"during-{i}")
                    continue
                refused = (status, body)
                break
            assert refused is not None, f"the disk never filled\n{dev.log_tail()}"
            status, body = refused
            assert status == 503, body
            assert body["error"] == "no_space", body
            assert str(small_disk / "data") in body["message"] and "bytes free" in body["message"], body
            assert "resumes by itself" in body["message"], body
            assert body.get("leader_url") is None, body  # never pointed back at itself

            # Still full: more writes are refused at once, the process stays up and answers.
            status, body = await create(http, dev.url, "refused-again")
            assert (status, body["error"]) == (503, "no_space"), body
            async with http.get(dev.url + "/livez") as r:
                assert r.status == 200
            async with http.get(dev.url + "/metrics") as r:
                assert "dex_disk_full 1.0" in await r.text()
            async with http.get(dev.url + "/v1/cluster") as r:
                alarms = (await r.json())["alarms"]
            assert [a["alarm"] for a in alarms] == ["no_space"], alarms
            assert dev.proc.poll() is None and dev.proc.pid == pid, dev.log_tail()

            ballast.unlink()  # space is freed: the node writes again by itself
            deadline = time.monotonic() + DEADLINE_S
            while True:
                status, body = await create(http, dev.url, "after")
                if status == 201:
                    break
                assert time.monotonic() < deadline, f"never wrote again: {body}\n{dev.log_tail()}"
            assert dev.proc.poll() is None and dev.proc.pid == pid, "the node restarted"
            async with http.get(dev.url + "/metrics") as r:
                assert "dex_disk_full 0.0" in await r.text()
            async with http.get(dev.url + "/v1/sessions?limit=1000") as r:
                ids = {s["session_id"] for s in (await r.json())["sessions"]}
            assert set(acknowledged) <= ids, set(acknowledged) - ids
        log = dev.log_path.read_text()
        assert "the Raft loop stopped" not in log and "cannot rollback" not in log, dev.log_tail()
        assert log.count("is full") >= 1 and "disk space is back" in log, dev.log_tail()
    finally:
        dev.stop()
    # Restarted on the same data, every acknowledged session is there.
    again = DevProcess(small_disk / "data", tmp_path / "dev2.log")
    again.start()
    try:
        await again.wait_ready()
        async with aiohttp.ClientSession() as http:
            async with http.get(again.url + "/v1/sessions?limit=1000") as r:
                ids = {s["session_id"] for s in (await r.json())["sessions"]}
        assert set(acknowledged) | {"after"} <= ids
    finally:
        again.stop()
