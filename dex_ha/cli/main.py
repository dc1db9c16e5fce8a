"""The `dex-ha` command: its argument parser and `main`.

    dex-ha dev | node                     node.py
    dex-ha cluster up | down              cluster.py
    dex-ha status [--watch]               status.py
    dex-ha step-down | members …          members.py
    dex-ha sessions …                     sessions.py (sessions watch: watch.py)
    dex-ha backup | restore               backup.py
    dex-ha demo                           demo.py

Exit codes: 0 done; 1 the server refused (its message is printed) or a cluster command
could not go on; 2 bad usage, or a config that cannot run; 3 no node answered. An expected
error prints one line to stderr, never a traceback.

The commands that talk to a cluster take `--url` (several allowed, or comma-separated) and
`--token`, and follow the active node like the SDKs do (remote.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from dex_ha.cli import backup, cluster, members, node, sessions, status
from dex_ha.cli.common import CommandFailed, remote_options
from dex_ha.client.env import TOKEN_VAR, URLS_VAR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dex-ha",
        description="dex-ha durable execution server",
        epilog=f"The commands that talk to a cluster (status, step-down, members, sessions) read ${URLS_VAR} "
        f"(comma-separated node URLs) and ${TOKEN_VAR} when --url and --token are not given; "
        f"`source DIR/tokens.env` after `dex-ha cluster up` sets both. "
        f"Exit codes: 0 done, 1 refused, 2 bad usage, 3 no node answered.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    remote = remote_options()
    node.add_parsers(sub)
    cluster.add_parser(sub)
    status.add_parser(sub, remote)
    members.add_parsers(sub, remote)
    sessions.add_parser(sub, remote)
    backup.add_parsers(sub, remote)
    demo = sub.add_parser("demo", help="a scripted agent session through a failover, on a local cluster")
    demo.add_argument("--dir", help="where the cluster lives (default: a new temporary directory)")
    demo.add_argument("--keep", action="store_true", help="leave the cluster and the Worker running at the end")
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    # Imported here: the demo loads the Worker SDK, which no other command needs, and
    # `python -m dex_ha.cli.demo` (its Worker child) must not find it imported already.
    from dex_ha.cli.demo import run_demo

    return run_demo(Path(args.dir) if args.dir else None, keep=args.keep)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "dev": node.cmd_dev,
    "node": node.cmd_node,
    "cluster": cluster.cmd_cluster,
    "status": status.cmd_status,
    "step-down": members.cmd_step_down,
    "members": members.cmd_members,
    "demo": cmd_demo,
    "sessions": sessions.cmd_sessions,
    "backup": backup.cmd_backup,
    "restore": backup.cmd_restore,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from dex_ha import __version__

        print(__version__)
        return 0
    if args.command is None:
        parser.print_help()
        return 2
    name = " ".join(
        filter(
            None,
            [
                args.command,
                getattr(args, "cluster_command", None),
                getattr(args, "members_command", None),
                getattr(args, "sessions_command", None),
            ],
        )
    )
    try:
        return COMMANDS[args.command](args)
    except CommandFailed as exc:
        print(f"dex-ha {name}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"dex-ha {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`dex-ha status | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 1
