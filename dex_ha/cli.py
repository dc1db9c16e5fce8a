"""The `dex-ha` command (DESIGN.md §7)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from dex_ha.server.config import ConfigError, dev_config, load_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dex-ha", description="dex-ha durable execution server")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")

    dev = sub.add_parser("dev", help="run one node with embedded storage, ready in seconds")
    dev.add_argument("--data-dir", default="./dex-data", help="where the node keeps its state (default ./dex-data)")
    dev.add_argument("--port", type=int, default=8801, help="HTTP port on 127.0.0.1 (default 8801)")
    dev.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on (default 127.0.0.1)")
    dev.add_argument("--relaxed", action="store_true", help="no fsync (faster; loses the last writes on power loss)")
    dev.add_argument("--log-json", action="store_true", help="structured logs: one JSON object per line")

    node = sub.add_parser("node", help="run one member of a cluster")
    node.add_argument("--config", required=True, help="the node's TOML file (see deploy/)")
    node.add_argument("--insecure", action="store_true",
                      help="allow running without API tokens and cluster secret (says so loudly)")
    node.add_argument("--log-json", action="store_true", help="structured logs: one JSON object per line")
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
    return COMMANDS[args.command](args)


def _run_node(config, json_logs: bool) -> int:
    from dex_ha.server.process import configure_logging, serve, use_uvloop

    configure_logging(json_logs or config.log_json)
    use_uvloop()
    asyncio.run(serve(config, on_started=_print_started if config.dev else None))
    return 0


def _print_started(node) -> None:
    url = f"http://{node.config.http_listen[0]}:{node.http_port}"
    auth = "token auth ON" if node.config.auth_enabled else "NO authentication (dev mode: no tokens configured)"
    print(f"dex-ha dev: serving {url}  ({auth}; data in {node.config.data_dir}; Ctrl-C stops)", flush=True)


def cmd_dev(args: argparse.Namespace) -> int:
    config = dev_config(Path(args.data_dir), args.port, host=args.host,
                        durability="relaxed" if args.relaxed else "strict")
    return _run_node(config, args.log_json)


def cmd_node(args: argparse.Namespace) -> int:
    try:
        config = load_config(Path(args.config), insecure=args.insecure)
    except ConfigError as exc:
        print(f"dex-ha node: {exc}", file=sys.stderr)
        return 2
    return _run_node(config, args.log_json)


COMMANDS = {"dev": cmd_dev, "node": cmd_node}

if __name__ == "__main__":
    sys.exit(main())
