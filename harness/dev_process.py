"""`dex-ha dev` as a real child process for end-to-end tests: free port, own data dir,
a deadline on every wait, stopped by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from harness.ports import free_ports
from harness.processes import stop
from harness.readiness import wait_ready


class DevProcess:
    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        *,
        extra_env: dict[str, str] | None = None,
        relaxed: bool = False,
        log_json: bool = False,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        """`preexec_fn` runs in the child before `dex-ha dev` starts (e.g. to set a resource limit)."""
        self.data_dir = data_dir
        self.relaxed = relaxed  # `dex-ha dev --relaxed`: no fsync
        self.log_json = log_json  # `dex-ha dev --log-json`: one JSON object per log line
        self.log_path = log_path
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = extra_env or {}
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **self.extra_env}
        command = [
            sys.executable,
            "-m",
            "dex_ha.cli",
            "dev",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            *(["--relaxed"] if self.relaxed else []),
            *(["--log-json"] if self.log_json else []),
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=self.preexec_fn
            )

    async def wait_ready(self, deadline_s: float = 20.0) -> None:
        def still_running() -> None:
            assert self.proc is not None and self.proc.poll() is None, "the process is not running"

        try:
            await wait_ready([self.url], deadline_s, still_running=still_running)
        except AssertionError as exc:
            raise AssertionError(f"dex-ha dev not ready: {exc}\n{self.log_tail()}") from None

    def kill(self) -> None:
        """SIGKILL: the crash the tests are about."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        """SIGTERM (graceful stop), then SIGKILL after a deadline; the exit code."""
        return None if self.proc is None else stop(self.proc, timeout=15)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


@contextlib.asynccontextmanager
async def running_dev(
    directory: Path, *, relaxed: bool = True, extra_env: dict[str, str] | None = None
) -> AsyncIterator[DevProcess]:
    """A `dex-ha dev` node with its data and log under `directory`, ready when entered,
    stopped by pid when left (the tests' fixtures are this, with their own options). A node
    that does not exit 0 on SIGTERM fails the test that used it: a graceful stop is part of
    what every such test runs."""
    node = DevProcess(directory / "data", directory / "dev.log", relaxed=relaxed, extra_env=extra_env)
    node.start()
    try:
        await node.wait_ready()
        yield node
    finally:
        exit_code = node.stop()
    assert exit_code == 0, f"dex-ha dev exited {exit_code} on SIGTERM:\n{node.log_tail()}"
