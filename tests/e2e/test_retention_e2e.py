"""Retention and the one-time rewrite of an older data directory, on a real `dex-ha dev`.

A data directory written before deletions existed (its database without auto-vacuum) is
rewritten once when the node starts, keeping every session. With `DEX_HA_RETENTION_DAYS`
set to two seconds, the node then deletes the ended session past it and keeps the one whose
turn still runs.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dex_ha.client import DexClient, DexError
from harness.dev_process import DevProcess
from harness.waiting import eventually

TWO_SECONDS_IN_DAYS = str(2 / 86_400)


def auto_vacuum(state_db: Path) -> int:
    conn = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True)
    try:
        mode: int = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
        return mode
    finally:
        conn.close()


def as_an_earlier_version_wrote_it(state_db: Path) -> None:
    conn = sqlite3.connect(state_db, isolation_level=None)
    try:
        conn.execute("PRAGMA auto_vacuum=NONE")
        conn.execute("VACUUM")
    finally:
        conn.close()
    assert auto_vacuum(state_db) == 0


async def exists(client: DexClient, session_id: str) -> bool:
    try:
        await client.get_session(session_id)
    except DexError as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.mark.timeout(120)
async def test_an_older_data_dir_is_rewritten_once_and_retention_deletes_only_ended_sessions(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "dev.log"
    first = DevProcess(data, log, relaxed=True)
    first.start()
    try:
        await first.wait_ready()
        async with DexClient(first.url) as client:
            await client.create_session("helper", session_id="ended")
            await client.create_session("helper", session_id="running")
            await client.send_message("running", "hello")  # no Worker: the turn runs on
    finally:
        assert first.stop() == 0, first.log_tail()
    as_an_earlier_version_wrote_it(data / "state.db")

    env = {"DEX_HA_RETENTION_DAYS": TWO_SECONDS_IN_DAYS, "DEX_HA_RETENTION_CHECK_INTERVAL_MS": "200"}
    second = DevProcess(data, log, relaxed=True, extra_env=env)
    second.port = first.port
    second.url = first.url
    second.start()
    try:
        await second.wait_ready()
        assert "rewriting the database once so that deleted sessions free disk space" in log.read_text()
        assert auto_vacuum(data / "state.db") == 2
        async with DexClient(second.url) as client:
            await eventually(lambda: _gone(client, "ended"), "retention to delete the ended session", deadline_s=30)
            assert await exists(client, "running")
        assert "retention: deleted 1 ended sessions" in log.read_text()
    finally:
        assert second.stop() == 0, second.log_tail()


async def _gone(client: DexClient, session_id: str) -> bool:
    return not await exists(client, session_id)
