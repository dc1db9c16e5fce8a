"""A full disk, told apart from other write errors, in every layer that writes.

A write that fails because the file system is full (ENOSPC, or a quota: EDQUOT; SQLite's
SQLITE_FULL) is not damage: nothing was half-written that the writer cannot undo, and the
same write succeeds once space is freed. The Raft log (dex_ha.raft.storage), the engine's
SQLite database and the node loop recognise it here and wait for space instead of stopping
the node. Standard library only, below every layer (like dex_ha.failpoints).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

DISK_FULL_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT))
SQLITE_FULL = 13  # SQLite's primary result code "database or disk is full"


class DiskFullError(OSError):
    """A write found no space on `path`'s file system; nothing of it was kept."""

    def __init__(self, path: str | Path, cause: BaseException | None = None) -> None:
        super().__init__(errno.ENOSPC, f"no space left on the disk of {path} ({free_bytes_text(path)})")
        self.path = str(path)
        if cause is not None:
            self.__cause__ = cause


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or an exception it was raised from) says the disk is full."""
    seen = 0
    while exc is not None and seen < 8:  # a short chain: __cause__ / __context__ of re-raises
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        code = getattr(exc, "sqlite_errorcode", None)  # sqlite3.Error, Python 3.11+
        if isinstance(code, int) and code & 0xFF == SQLITE_FULL:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def free_bytes(path: str | Path) -> int | None:
    """Bytes free for this process on `path`'s file system (None if it cannot be told)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def free_bytes_text(path: str | Path) -> str:
    free = free_bytes(path)
    return "free space unknown" if free is None else f"{free} bytes free"
