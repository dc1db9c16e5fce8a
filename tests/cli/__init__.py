"""Helpers for the `dex-ha` command tests: run the command, find free ports, poll with deadlines.

Every process a test starts is stopped by its pid; every wait has a deadline.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from harness.ports import free_port_range, free_ports  # noqa: F401  (the tests import them from here)
from harness.processes import stop  # noqa: F401
from harness.waiting import eventually_sync

T = TypeVar("T")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without DEX_HA_* variables (a developer's settings must not leak in), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEX_HA_")}
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`python -m dex_ha.cli ARGS` to completion (deadline: `timeout`), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "dex_ha.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env if env is not None else clean_env(),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def start_cli(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`python -m dex_ha.cli ARGS` in the background, stdout and stderr to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dex_ha.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env if env is not None else clean_env(),
        )


def http_status(url: str, token: str | None = None, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def wait_until(condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy; AssertionError naming `what` at the deadline."""
    value: T = eventually_sync(condition, what, deadline_s=timeout, interval_s=interval)
    return value


def pid_gone(pid: int) -> bool:
    """True once `pid` no longer exists (os.kill(pid, 0) raises ProcessLookupError)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
