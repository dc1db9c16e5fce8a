"""Stopping the processes a test started: by pid, with deadlines."""

from __future__ import annotations

import subprocess


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    """SIGTERM by pid, wait (deadline), SIGKILL if it did not stop; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode
