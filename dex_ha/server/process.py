"""Running a node as a process: logging, signals, and the wait until it stops.

SIGTERM (and Ctrl-C) is a graceful stop: the active node stops handing out
work, lets running attempts finish for up to `drain_timeout_ms`, hands the leadership to
the most caught-up voter, and exits. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Callable

from dex_ha.engine import NeedsUpgrade
from dex_ha.raft.identity import IdentityRefused
from dex_ha.server.config import ServerConfig
from dex_ha.server.node import NodeServer

log = logging.getLogger("dex_ha.server")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(json_logs: bool, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonLogFormatter() if json_logs else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# A node whose Raft loop died (e.g. fsync failed with EIO), or that met an entry of a newer
# state machine than it runs (it must be upgraded), exits with this code.
FATAL_EXIT_CODE = 70
# A node that must not run as configured (its peers belong to another cluster, or it lost
# its data and must be replaced): restarting it will not help (EX_CONFIG).
REFUSED_EXIT_CODE = 78


def exit_on_fatal(exc: BaseException) -> None:
    """The Raft loop died (its log may not be durable): exit now, non-zero, so that the
    supervisor (systemd, Kubernetes) restarts the node, which then recovers from its log.
    Runs on the Raft thread: the HTTP loop may be busy, and must not delay this.
    A node refused for its identity (IdentityRefused) has logged its one line already; it
    exits with REFUSED_EXIT_CODE, which a supervisor should not restart."""
    if isinstance(exc, IdentityRefused):
        logging.shutdown()
        os._exit(REFUSED_EXIT_CODE)
    if isinstance(exc, NeedsUpgrade):  # an entry of a newer release: unapplied, until this node is upgraded
        log.critical("%s (exiting with code %d)", exc, FATAL_EXIT_CODE)
        logging.shutdown()
        os._exit(FATAL_EXIT_CODE)
    log.critical("the Raft loop stopped (%s: %s): exiting with code %d", type(exc).__name__, exc, FATAL_EXIT_CODE)
    logging.shutdown()
    os._exit(FATAL_EXIT_CODE)


def raise_open_files_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard one: each HTTP client holds a descriptor, and
    the soft default (often 1024) is far below what the system lets us have. The node caps
    its HTTP connections by this limit (http_limits), so it must be read after this."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        log.info("open-files limit: %d", soft)
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("open-files limit raised from %d to %d", soft, hard)
    except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit the kernel refuses
        log.warning("open-files limit stays %d (the hard limit %d cannot be set: %s)", soft, hard, exc)


# How long a thread may hold the interpreter while another waits for it (Python's default
# is 5 ms). The Raft thread waits for it each time it wakes for a tick or a message; while the
# HTTP loop is busy, a shorter switch interval gets heartbeats out sooner.
SWITCH_INTERVAL_S = 0.001

# Tracked objects allocated (net of those freed) before the collector's youngest generation
# runs (Python's default is 700). Almost everything a request allocates is freed by reference
# counting, so the default ran a young collection every few requests and, ten of those later,
# an older one, each walking what survived: 7% of a busy node's time at 256 sessions in
# flight, 11% at 1024 (measured with gc.callbacks). At 10,000 it is under 1% and 2%; cyclic
# garbage waits a little longer for its collection.
GC_YOUNG_THRESHOLD = 10_000


def tune_interpreter_for_raft() -> None:
    """Keep the Raft thread's waits for the interpreter short while the HTTP side is busy.

    - A shorter switch interval (SWITCH_INTERVAL_S).
    - Rarer collections (GC_YOUNG_THRESHOLD); the older generations keep Python's ratios.
    - `gc.freeze()` once the node has started: what it allocated at start lives as long as
      the process, and a full collection, which holds the interpreter (and so the Raft
      thread) for its whole length, no longer scans it each time.
    """
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    gc.freeze()


async def serve(config: ServerConfig, on_started: Callable[[NodeServer], None] | None = None) -> None:
    """Run one node until SIGTERM/SIGINT; a second signal stops without draining."""
    raise_open_files_limit()
    node = NodeServer(config, on_fatal=exit_on_fatal)
    await node.start()
    tune_interpreter_for_raft()
    if on_started is not None:
        on_started(node)
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info(
                "%s: graceful stop (drain up to %d ms, then hand over)",
                signal.Signals(signum).name,
                config.drain_timeout_ms,
            )
            stop_requested.set()
        else:
            # Stop at once, as SIGKILL would: the node is built to survive that (its log
            # is durable; attempts it held fail over by their rows).
            log.warning("second signal: exiting now without draining")
            logging.shutdown()
            os._exit(1)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    await stop_requested.wait()
    await node.shutdown_gracefully()
    log.info("node %s stopped", config.node_id)
