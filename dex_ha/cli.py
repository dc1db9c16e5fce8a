"""The `dex-ha` command (DESIGN.md §7)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dex-ha", description="dex-ha durable execution server")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    dev = sub.add_parser("dev", help="run one node with embedded storage")
    dev.add_argument("--data-dir", default="./dex-data")
    dev.add_argument("--port", type=int, default=8801)
    return parser


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
    # The node server lands with issue #4 (server, SDKs, CLI); until then say so plainly.
    print(
        f"dex-ha {args.command}: the node server is not built yet (tracked in issue #4); "
        "this release ships the Raft layer and the engine only.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
