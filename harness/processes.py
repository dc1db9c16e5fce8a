"""Stopping the processes a test or bench started: by pid, with deadlines."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

# The checkout these harnesses belong to: a child process started from it runs its code.
REPO_ROOT = Path(__file__).resolve().parent.parent


def env_with_checkout() -> dict[str, str]:
    """This environment with this checkout first on PYTHONPATH: the child runs the code under test."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


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
