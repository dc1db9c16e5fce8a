"""A log write that finds the disk full is cut back and raises DiskFullError; the log stays
usable and the same write goes through once there is space (before: the log was marked
failed and the node exited 70 on every restart while the disk stayed full)."""

from __future__ import annotations

import errno
import os

import pytest

from dex_ha.diskspace import DiskFullError
from dex_ha.raft import storage as storage_module
from dex_ha.raft.storage import RaftStorage
from dex_ha.raft.types import Entry, HardState


def test_a_write_without_space_is_cut_back_and_the_log_goes_on(tmp_path, monkeypatch):
    log = RaftStorage.open(tmp_path / "raft")
    log.save(HardState(term=1, vote="a", commit=0), [Entry(index=1, term=1, data=b"one")])
    real_write = os.write

    def half_then_enospc(fd: int, data) -> int:  # part of the record reaches the file first
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage_module.os, "write", half_then_enospc)
    with pytest.raises(DiskFullError):
        log.save(None, [Entry(index=2, term=1, data=b"two" * 100)])
    monkeypatch.setattr(storage_module.os, "write", real_write)
    log.save(None, [Entry(index=2, term=1, data=b"two")])  # space is back: the same write
    log.close()
    reopened = RaftStorage.open(tmp_path / "raft")
    _, _, entries = reopened.initial_state()
    assert [(e.index, e.data) for e in entries] == [(1, b"one"), (2, b"two")]
    reopened.close()
