"""Stopping the processes a test or bench started: by pid, with deadlines."""

from __future__ import annotations

import subprocess
from typing import Any


def stop(proc: subprocess.Popen[Any], timeout: float = 20.0) -> int:
    """SIGTERM by pid, wait (deadline), SIGKILL if it did not stop; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        wait_or_kill(proc, timeout)
    return proc.returncode


def wait_or_kill(proc: subprocess.Popen[Any], timeout: float) -> bool:
    """Wait until `proc` exits or the deadline passes, then SIGKILL it if it still runs.
    True when it had to be killed (a stop that did not finish in time is worth reporting)."""
    try:
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        return True


def pid_alive(pid: int) -> bool:
    """The process `pid` exists and is not a zombie (an exited child not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False
