"""Helpers for the `dex-ha` command tests: run the command, find free ports, poll with deadlines.

Every process a test starts is stopped by its pid; every wait has a deadline.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without DEX_HA_* variables (a developer's settings must not leak in), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEX_HA_")}
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`python -m dex_ha.cli ARGS` to completion (deadline: `timeout`), output captured."""
    return subprocess.run([sys.executable, "-m", "dex_ha.cli", *args], capture_output=True, text=True, check=False,
                          env=env if env is not None else clean_env(), timeout=timeout, stdin=subprocess.DEVNULL)


def start_cli(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`python -m dex_ha.cli ARGS` in the background, stdout and stderr to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "dex_ha.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env if env is not None else clean_env())


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


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports, held together while asking."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port_range(count: int, attempts: int = 200) -> int:
    """The first port of `count` consecutive free loopback ports (`cluster up` uses base + i)."""
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(20_000, 60_000)
        if all(_bindable(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


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


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy; AssertionError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)


def pid_gone(pid: int) -> bool:
    """True once `pid` no longer exists (os.kill(pid, 0) raises ProcessLookupError)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
