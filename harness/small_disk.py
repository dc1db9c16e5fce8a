"""A small file system for a test: a tmpfs of a given size mounted on a directory (as root,
as CI runs), and a ballast file that fills it.

    reason = mount_tmpfs(path, 8 << 20)   # None: mounted; else why it cannot be here
    filled = fill(path / "ballast")       # the disk is full now
    (path / "ballast").unlink()           # space is freed
    unmount(path)                         # or unmount_keeping_files(path): its files stay

Always unmount in a `finally` (or a fixture's teardown): a mount outlives the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

FILL_CHUNK = 64 << 10
FILL_TAIL_CHUNK = 512  # the last pages, a little at a time


def unavailable_reason() -> str | None:
    """Why no tmpfs can be mounted here (None: it can be tried)."""
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root (CI runs as root)"
    return None


def mount_tmpfs(mount_point: Path, size_bytes: int) -> str | None:
    """Mount a tmpfs of `size_bytes` on `mount_point` (made if missing); None when it is
    mounted, else why it could not be."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    mount_point.mkdir(parents=True, exist_ok=True)
    # mode=0700: a tmpfs root is 1777 by default, and a node refuses a data directory others may write to.
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else f"cannot mount a tmpfs here: {done.stderr.strip()}"


def unmount(mount_point: Path) -> None:
    """Detach the mount at once (lazily: a process that still holds a file does not stop it)."""
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def unmount_keeping_files(mount_point: Path, leave_out: tuple[str, ...] = ()) -> None:
    """Unmount, with the files (but `leave_out`) copied to the directory underneath, so a
    run's evidence stays where it was."""
    staging = mount_point.with_name(mount_point.name + ".unmounting")
    try:
        shutil.copytree(mount_point, staging, ignore=shutil.ignore_patterns(*leave_out), symlinks=True)
    finally:
        unmount(mount_point)
    shutil.copytree(staging, mount_point, dirs_exist_ok=True, symlinks=True)
    shutil.rmtree(staging)


def fill(path: Path) -> int:
    """Write zeros into `path` until its file system has no space left; the bytes written."""
    written = 0
    for chunk in (bytes(FILL_CHUNK), bytes(FILL_TAIL_CHUNK)):
        with open(path, "ab", buffering=0) as f:
            try:
                while True:
                    written += f.write(chunk)
            except OSError:
                pass
    return written
