"""A node's data directory is private (dex_ha/server/data_dir.py): created 0700, its files
0600; a directory others may write is refused, one they may read is tightened.

The repro: the data directory was 0755, and state.db and its WAL 0644 (anyone on the host
could read every session). The real-process test runs `dex-ha dev` as an operator would.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
from pathlib import Path

import pytest

from dex_ha.server.data_dir import DataDirNotPrivate, open_data_dir, private_files
from tests.cli import free_ports, http_status, run_cli, start_cli, stop, wait_until

GROUP_OR_OTHERS = 0o077


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def shared(root: Path) -> list[str]:
    """What under `root` (itself included) its group or others may use."""
    return [f"{p} {mode(p):04o}" for p in [root, *root.rglob("*")] if mode(p) & GROUP_OR_OTHERS]


@pytest.fixture
def usual_umask():
    """The umask most shells have (022): what made the files world-readable before."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_a_new_data_dir_is_0700(tmp_path: Path, usual_umask):
    data_dir = tmp_path / "a" / "data"
    open_data_dir(data_dir)
    assert mode(data_dir) == 0o700


@pytest.mark.parametrize("bad_mode", [0o775, 0o757, 0o777, 0o720, 0o702])
def test_a_data_dir_others_may_write_is_refused_naming_path_mode_and_chmod(tmp_path: Path, bad_mode: int):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(bad_mode)
    with pytest.raises(DataDirNotPrivate) as caught:
        open_data_dir(data_dir)
    message = str(caught.value)
    assert message.startswith(f"data_dir: {data_dir} has mode {bad_mode:04o}")
    assert f"chmod 700 {data_dir}" in message
    assert mode(data_dir) == bad_mode  # refused, not changed


def test_a_data_dir_others_may_read_is_tightened_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """A data directory of an earlier version: 0755, with 0644 files."""
    data_dir = tmp_path / "data"
    (data_dir / "raft").mkdir(parents=True)
    for name in ("state.db", "state.db-wal", "raft/00000001.log"):
        (data_dir / name).write_bytes(b"x")
        (data_dir / name).chmod(0o644)
    (data_dir / "raft").chmod(0o755)
    data_dir.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="dex_ha.server"):
        open_data_dir(data_dir)
    assert shared(data_dir) == []
    assert mode(data_dir / "state.db") == 0o600 and mode(data_dir / "raft") == 0o700
    assert "took the group's and others' access away from 5 files and directories" in caplog.text
    caplog.clear()
    open_data_dir(data_dir)  # private already: nothing to say
    assert caplog.text == ""


def test_private_files_sets_the_umask_for_its_run_only(tmp_path: Path, usual_umask):
    with private_files():
        (tmp_path / "inside").write_bytes(b"x")
    (tmp_path / "after").write_bytes(b"x")
    assert mode(tmp_path / "inside") == 0o600 and mode(tmp_path / "after") == 0o644


def test_dev_keeps_its_data_private(tmp_path: Path, usual_umask):
    """Every file of a running node (state.db, its WAL and shared memory, the Raft log,
    snapshots) is 0600 and every directory 0700, whatever the umask it was started with."""
    data_dir = tmp_path / "data"
    port = free_ports(1)[0]
    log = tmp_path / "dev.log"
    proc = start_cli("dev", "--data-dir", str(data_dir), "--port", str(port), "--relaxed", log=log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_status(url + "/readyz") == 200, 30, "/readyz 200")
        names = {p.name for p in data_dir.rglob("*")}
        assert {"state.db", "state.db-wal", "state.db-shm", "raft"} <= names, names
        assert shared(data_dir) == [], shared(data_dir)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        stop(proc)
    assert shared(data_dir) == []


def test_dev_refuses_a_data_dir_others_may_write_in_one_line(tmp_path: Path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o777)
    done = run_cli("dev", "--data-dir", str(data_dir), "--port", "0")
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dex-ha dev: data_dir: {data_dir} has mode 0777") and "chmod 700" in last, done.stderr
    assert "Traceback" not in done.stderr
    assert list(data_dir.iterdir()) == []  # nothing written


def test_dev_on_a_non_loopback_address_without_tokens_refuses_in_one_line(tmp_path: Path):
    done = run_cli("dev", "--data-dir", str(tmp_path / "data"), "--host", "0.0.0.0", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("dex-ha dev: http_listen: 0.0.0.0 is not a loopback address")
    assert "--insecure" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "data").exists()
