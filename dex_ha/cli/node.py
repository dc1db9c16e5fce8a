"""`dex-ha dev` (one node with embedded storage) and `dex-ha node` (one member of a cluster)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from dex_ha.cli.common import Subparsers
from dex_ha.local_cluster import port_in_use, port_taken_message
from dex_ha.server.auth import TokenAuth
from dex_ha.server.config import (
    ConfigError,
    ServerConfig,
    dev_config,
    dev_overrides_from_env,
    load_config,
    tokens_from_env,
)
from dex_ha.server.data_dir import private_files

if TYPE_CHECKING:
    from dex_ha.server.node import NodeServer


def add_parsers(sub: Subparsers) -> None:
    dev = sub.add_parser("dev", help="run one node with embedded storage, ready in seconds")
    dev.add_argument("--data-dir", default="./dex-data", help="where the node keeps its state (default ./dex-data)")
    dev.add_argument("--port", type=int, default=8801, help="HTTP port on 127.0.0.1 (default 8801)")
    dev.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on (default 127.0.0.1)")
    dev.add_argument("--relaxed", action="store_true", help="no fsync (faster; loses the last writes on power loss)")
    dev.add_argument(
        "--insecure",
        action="store_true",
        help="allow --host other than loopback without tokens: anyone who reaches it may do anything",
    )
    dev.add_argument("--log-json", action="store_true", help="structured logs: one JSON object per line")

    node = sub.add_parser("node", help="run one member of a cluster")
    node.add_argument("--config", required=True, help="the node's TOML file (see deploy/)")
    node.add_argument(
        "--insecure", action="store_true", help="allow running without API tokens and cluster secret (says so loudly)"
    )
    node.add_argument(
        "--join",
        action="store_true",
        help="start as a learner of the running cluster (as join = true in the config): a new node, "
        "or a new incarnation of one being replaced (see `dex-ha members replace`)",
    )
    node.add_argument("--log-json", action="store_true", help="structured logs: one JSON object per line")


def _run_node(config: ServerConfig, json_logs: bool) -> int:
    from dex_ha.engine import NeedsUpgrade
    from dex_ha.raft.identity import IdentityRefused
    from dex_ha.server.node import CannotListen
    from dex_ha.server.process import (  # the server loads only to serve
        FATAL_EXIT_CODE,
        REFUSED_EXIT_CODE,
        configure_logging,
        serve,
        use_uvloop,
    )

    configure_logging(json_logs or config.log_json)
    use_uvloop()
    try:
        with private_files():  # the state, the Raft log and snapshots are the node's user's only
            asyncio.run(serve(config, on_started=_announce_when_ready if config.dev else None))
    except IdentityRefused as exc:  # found at start (a damaged identity.json); later ones exit in process.py
        print(f"dex-ha node: {exc}", file=sys.stderr)
        return REFUSED_EXIT_CODE
    except NeedsUpgrade as exc:  # found at start: the state's cluster runs a newer state machine
        print(f"dex-ha node: {exc}", file=sys.stderr)
        return FATAL_EXIT_CODE
    except ConfigError as exc:  # found at start: e.g. a data directory others may write
        print(f"dex-ha {'dev' if config.dev else 'node'}: {exc}", file=sys.stderr)
        return 2
    except CannotListen as exc:  # e.g. the port is taken: say which, and what to do
        print(
            f"dex-ha {'dev' if config.dev else 'node'}: {exc.strerror}; stop what uses it or choose another "
            f"address ({'--port' if config.dev else 'http_listen / probe_listen'})",
            file=sys.stderr,
        )
        return 2
    return 0


# How long `dex-ha dev` waits for its node to be ready before it prints its URL anyway.
READY_WAIT_S = 30.0


async def _announce_when_ready(node: NodeServer) -> None:
    """Print the URL and the console's once the node answers requests (/readyz 200), so that
    what the line points to works when it appears."""
    deadline = time.monotonic() + READY_WAIT_S
    while not node.is_ready() and time.monotonic() < deadline:  # noqa: ASYNC110 (no event says "ready")
        await asyncio.sleep(0.02)
    url = f"http://{node.config.http_listen[0]}:{node.http_port}"
    auth = "token auth ON" if node.config.auth_enabled else "NO authentication (dev mode: no tokens configured)"
    ready = "" if node.is_ready() else f"NOT READY after {READY_WAIT_S:.0f} s, see the log above; "
    print(
        # The URL stands alone after "serving": scripts and benches read it up to the next space.
        f"dex-ha dev: serving {url}  ({ready}console {url}/ui; {auth}; data in {node.config.data_dir}; Ctrl-C stops)",
        flush=True,
    )


def cmd_dev(args: argparse.Namespace) -> int:
    # No authentication unless tokens are configured (docs/configuration.md): DEX_HA_TOKENS_* set them.
    tokens = {role: tuple(values) for role, values in tokens_from_env(os.environ).items()}
    try:
        config = replace(
            dev_config(
                Path(args.data_dir),
                args.port,
                host=args.host,
                tokens=tokens,
                durability="relaxed" if args.relaxed else "strict",
                insecure=args.insecure,
            ),
            **dev_overrides_from_env(os.environ),
        )
        config.check()
        TokenAuth(config.tokens, config.scoped_tokens)  # refuses short, duplicated or unknown-role tokens, naming them
    except (ConfigError, ValueError) as exc:
        print(f"dex-ha dev: {exc}", file=sys.stderr)
        return 2
    # Checked before the node starts, as `cluster up` does: one line, not the node's logs
    # and then the error (the node still says so itself if the port is taken in between).
    reason = port_in_use(args.host, args.port)
    if reason is not None:
        print(
            f"dex-ha dev: {port_taken_message(args.port, f'HTTP on {args.host}', reason, 'another port with --port')}",
            file=sys.stderr,
        )
        return 2
    return _run_node(config, args.log_json)


def cmd_node(args: argparse.Namespace) -> int:
    try:
        config = load_config(Path(args.config), insecure=args.insecure)
        if args.join:
            config = replace(config, join=True)
    except ConfigError as exc:
        print(f"dex-ha node: {exc}", file=sys.stderr)
        return 2
    return _run_node(config, args.log_json)
