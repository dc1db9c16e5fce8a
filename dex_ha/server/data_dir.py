"""A node's data directory is private to the node: 0700, and its files 0600.

It holds the state (sessions, message texts, tool results), the Raft log and snapshots:
anyone who can read it reads every session, and anyone who can write it can change what
the node serves. So, as PostgreSQL does:

- `private_files()`: what the process creates meanwhile is private (umask 077): SQLite's
  database, WAL and shared-memory files, the Raft log's segments, snapshots, restored files.
- `open_data_dir()` creates the directory 0700, refuses one that its group or others may
  write (DataDirNotPrivate, naming the path, its mode and the chmod to run), and takes the
  group's and others' access away from an existing directory and what is in it (a data
  directory of an earlier version was 0755 with 0644 files), logging what it changed.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dex_ha.server.config import ConfigError

log = logging.getLogger("dex_ha.server")

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
GROUP_OR_OTHERS = 0o077
WRITABLE_BY_GROUP_OR_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class DataDirNotPrivate(ConfigError):
    """The data directory may be written by users other than the node's."""


@contextmanager
def private_files() -> Iterator[None]:
    """Files and directories the process creates meanwhile are its user's only (umask 077).
    The umask is the process's: only a command (a node, a restore) sets it, for its run."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def open_data_dir(path: Path) -> None:
    """Create `path` (0700), or check and tighten an existing one (see the module docstring)."""
    if not path.exists():
        path.mkdir(mode=DIR_MODE, parents=True)
        path.chmod(DIR_MODE)  # mkdir's mode is filtered by the umask; this is not
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & WRITABLE_BY_GROUP_OR_OTHERS:
        raise DataDirNotPrivate(
            f"data_dir: {path} has mode {mode:04o}: users other than its owner may change what the node "
            f"stores. A data directory must be private to the node: run `chmod 700 {path}`, and start again"
        )
    tightened = _tighten(path)
    if tightened:
        log.warning(
            "data_dir %s: took the group's and others' access away from %d files and directories "
            "(a data directory is private to the node: 0700, files 0600); first: %s",
            path,
            len(tightened),
            ", ".join(tightened[:3]),
        )


def _tighten(root: Path) -> list[str]:
    """chmod go-rwx on `root` and everything under it that has it; what was changed."""
    changed = []
    for path in [root, *root.rglob("*")]:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode) or not stat.S_IMODE(info.st_mode) & GROUP_OR_OTHERS:
            continue
        mode = stat.S_IMODE(info.st_mode)
        try:
            path.chmod(mode & ~GROUP_OR_OTHERS)
        except PermissionError:  # not ours: say so, and leave it
            log.warning("data_dir: cannot make %s private (mode %04o, owner uid %d)", path, mode, info.st_uid)
            continue
        changed.append(f"{path} ({mode:04o})")
    return changed
