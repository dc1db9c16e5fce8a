"""`dex-ha dev` listens on its HTTP port and nothing else.

A single voter never receives a Raft message, so it opens no Raft port: before, it listened
on an ephemeral one without authentication, and any local process could make it follow an
"intruder" leader.
"""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp

from harness.dev_process import DevProcess


def listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports `pid` listens on: its socket inodes (the /proc/<pid>/fd links) matched
    against the LISTEN rows of its network namespace's tcp and tcp6 tables."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as rows:
            next(rows)  # the header
            for row in rows:
                cols = row.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


async def test_dev_opens_no_raft_port(tmp_path: Path) -> None:
    dev = DevProcess(tmp_path / "data", tmp_path / "dev.log")
    dev.start()
    try:
        await dev.wait_ready()
        assert dev.proc is not None
        assert listening_tcp_ports(dev.proc.pid) == {dev.port}, dev.log_tail()
        async with aiohttp.ClientSession() as session:
            async with session.get(dev.url + "/v1/cluster") as resp:
                cluster = await resp.json()
        assert resp.status == 200, cluster
        assert cluster["role"] == "active" and cluster["leader_id"] == "dev"
        assert [m["id"] for m in cluster["members"]] == ["dev"]
        log = dev.log_tail(200)
        assert "no Raft listener" in log and "WITHOUT peer authentication" not in log
    finally:
        assert dev.stop() == 0, dev.log_tail()
