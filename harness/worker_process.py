"""One Worker as an OS process of its own, for tests that SIGKILL it or drain it.

The child (this module's `__main__`) holds what every such process shares: argument
parsing, logging with the pid on each line, the Worker and its connection options, a drain
on SIGTERM, running until the Worker stops (SIGKILL is the crash), closing the models.

    python -m harness.worker_process AGENTS --urls URL[,URL...] [--token T] \
        [--poll-wait-ms N] [--drain-timeout-s S] [--backoff-max-s S] \
        [--heartbeat-interval-s S] [--max-concurrency N] [AGENTS' own options]

AGENTS names the module that holds the agent-specific part, by dotted name or by the path of
its .py file. It defines

    def agents(args: argparse.Namespace) -> list[Agent] | Awaitable[list[Agent]]
    def add_arguments(parser: argparse.ArgumentParser) -> None     # optional: its own options

The parent starts one with `start_worker(...)`, which returns the process (`Popen`: stop it
by pid with harness.processes.stop, or SIGKILL it). An AGENTS path (a .py file) runs this
file by its path too, with nothing from this checkout on the path but what `env` names: so
a test can run the Worker of an earlier release (harness.releases.release_env); such a
child imports only the standard library and `dex_ha.worker`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import inspect
import logging
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Any

LOG_FORMAT = "%(asctime)s %(process)d %(name)s %(message)s"


@dataclass(frozen=True)
class WorkerOptions:
    """The Worker's connection options a test process sets; None leaves the SDK's default."""

    token: str | None = None
    poll_wait_ms: int = 1_000  # short polls: a drained or restarted node is noticed fast
    drain_timeout_s: float = 1.0
    backoff_max_s: float | None = None  # reconnect delay cap after a node restart
    heartbeat_interval_s: float | None = None
    max_concurrency: int | None = None

    def flags(self) -> list[str]:
        """The command-line flags that give these options to the child."""
        flags = ["--poll-wait-ms", str(self.poll_wait_ms), "--drain-timeout-s", str(self.drain_timeout_s)]
        for name in ("token", "backoff_max_s", "heartbeat_interval_s", "max_concurrency"):
            value = getattr(self, name)
            if value is not None:
                flags += [f"--{name.replace('_', '-')}", str(value)]
        return flags

    def worker_kwargs(self) -> dict[str, Any]:
        """The Worker's keyword arguments: the options that are set, so that an earlier
        release's Worker, which may lack some, is given only what the test asked for."""
        kwargs = {name: getattr(self, name) for name in ("token", "poll_wait_ms", "drain_timeout_s")}
        for name in ("backoff_max_s", "heartbeat_interval_s", "max_concurrency"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs


# ---------------------------------------------------------------- the parent's side


def start_worker(
    agents: str,
    urls: str | Sequence[str],
    args: Sequence[str] = (),
    *,
    options: WorkerOptions = WorkerOptions(),
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start a Worker process running the agents of the module `agents` (see the module doc)
    on `urls`, with the module's own `args`; its output goes to `log` (appended; none
    without). `env` defaults to this one with this checkout first on PYTHONPATH."""
    # Imported here, on the parent's side only: a child run by its path (an earlier release's
    # Worker) must import nothing of this checkout but this file (see the module doc).
    from harness.processes import env_with_checkout

    url_list = ",".join([urls] if isinstance(urls, str) else urls)
    by_path = agents.endswith(".py")
    launcher = [str(Path(__file__).resolve())] if by_path else ["-m", __name__]
    command = [sys.executable, *launcher, agents, "--urls", url_list, *options.flags(), *args]
    child_env = dict(env) if env is not None else env_with_checkout()
    if log is None:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env, cwd=cwd)
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=child_env, cwd=cwd)


# ---------------------------------------------------------------- the child's side


def load_agents_module(name: str) -> ModuleType:
    """The agents module, by dotted name or by the path of its .py file."""
    if not name.endswith(".py"):
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(Path(name).stem, name)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the agents module {name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv: Sequence[str]) -> tuple[ModuleType, argparse.Namespace, WorkerOptions]:
    head = argparse.ArgumentParser(add_help=False)
    head.add_argument("agents")
    module = load_agents_module(head.parse_known_args(argv)[0].agents)
    parser = argparse.ArgumentParser(description=(module.__doc__ or "A Worker process.").splitlines()[0])
    parser.add_argument("agents", help="the module that defines agents(args), by dotted name or .py path")
    parser.add_argument("--urls", required=True, help="comma-separated node URLs")
    parser.add_argument("--token", default=None)
    parser.add_argument("--poll-wait-ms", type=int, default=WorkerOptions.poll_wait_ms)
    parser.add_argument("--drain-timeout-s", type=float, default=WorkerOptions.drain_timeout_s)
    parser.add_argument("--backoff-max-s", type=float, default=None)
    parser.add_argument("--heartbeat-interval-s", type=float, default=None)
    parser.add_argument("--max-concurrency", type=int, default=None)
    add_arguments = getattr(module, "add_arguments", None)
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    options = WorkerOptions(**{option.name: getattr(args, option.name) for option in fields(WorkerOptions)})
    return module, args, options


async def run(module: ModuleType, args: argparse.Namespace, options: WorkerOptions) -> None:
    """Run the module's agents until SIGTERM (a drain) or SIGKILL; then close their models."""
    from dex_ha.worker import Worker  # here: the parent's side needs none of the SDK

    agents = module.agents(args)
    if inspect.isawaitable(agents):
        agents = await agents
    worker = Worker(args.urls.split(","), agents=agents, **options.worker_kwargs())
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop()))
    try:
        await worker.run()
    finally:
        for agent in agents:
            close = getattr(agent.model, "aclose", None)
            if close is not None:
                await close()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    module, args, options = parse_args(sys.argv[1:] if argv is None else argv)
    asyncio.run(run(module, args, options))


if __name__ == "__main__":
    main()
