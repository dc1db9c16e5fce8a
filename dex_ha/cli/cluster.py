"""`dex-ha cluster up | down`: a local cluster on loopback, for trying high availability.

`up` writes one TOML per node under DIR, starts `python -m dex_ha.cli node --config …` for
each node (in its own session, so the nodes outlive the command), records the pids, waits
until exactly one node is the active node, and returns. `down` stops the recorded pids.
The plan, the files, the processes and the waits are dex_ha/local_cluster.py, which the
demo (`dex_ha.cli.demo`) and the test harness use too; DIR's files are listed there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dex_ha.cli.common import (
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandFailed,
    Subparsers,
    format_table,
    positive_int,
)
from dex_ha.local_cluster import (
    TOKENS_FILE,
    ClusterError,
    UpResult,
    cluster_down,
    cluster_up,
    contiguous_ports,
    plan_cluster,
)


def format_up_report(result: UpResult) -> str:
    """The table of nodes, how to use the tokens and how to stop the cluster."""
    plan = result.plan
    rows = [
        [
            n.node_id,
            n.url,
            n.raft_addr,
            str(result.pids[n.node_id]),
            str(n.log_path),
            "active" if n.node_id == result.active else "standby",
        ]
        for n in plan.nodes
    ]
    urls = " ".join(f"--url {u}" for u in plan.urls)
    pids = " ".join(str(result.pids[n.node_id]) for n in plan.nodes)
    return "\n".join(
        [
            f"dex-ha cluster up: {len(plan.nodes)} nodes running in {plan.cluster_dir} (durability {plan.durability})",
            "",
            format_table(["node", "url", "raft address", "pid", "log", "role"], rows),
            "",
            f"Tokens are in {plan.cluster_dir / TOKENS_FILE} (mode 0600). To use them:",
            f"  source {plan.cluster_dir / TOKENS_FILE}      # DEX_HA_URLS, and DEX_HA_TOKEN: the admin token",
            "  dex-ha status                 # no --url or --token needed once it is sourced",
            f"  dex-ha step-down {urls}",
            "  DexClient() and Worker() read DEX_HA_URLS and $DEX_HA_CLIENT_TOKEN / $DEX_HA_WORKER_TOKEN too",
            "",
            f"Web console: {plan.urls[0]}/ui (any node serves it; when it asks for a token, paste",
            "$DEX_HA_TOKEN, the admin token: echo $DEX_HA_TOKEN after sourcing the file)",
            "",
            "To stop the cluster:",
            f"  dex-ha cluster down --dir {plan.cluster_dir}",
            f"  or: kill {pids}      # SIGTERM: each node drains and stops",
        ]
    )


# ---------------------------------------------------------------- the command


def add_parser(sub: Subparsers) -> None:
    cluster = sub.add_parser("cluster", help="a local cluster on loopback, for trying HA")
    actions = cluster.add_subparsers(dest="cluster_command", required=True, metavar="{up,down}")
    up = actions.add_parser("up", help="write configs, start the nodes, wait for the active node")
    up.add_argument("--nodes", type=positive_int, default=3, help="how many nodes (default 3)")
    up.add_argument("--dir", default="./dex-cluster", help="configs, data, logs and pids (default ./dex-cluster)")
    up.add_argument("--base-port", type=positive_int, default=8801, help="HTTP port of n1; n2 gets +1, … (8801)")
    up.add_argument("--raft-base-port", type=positive_int, default=9801, help="Raft port of n1, then +1 (9801)")
    up.add_argument(
        "--probe-base-port",
        type=positive_int,
        default=10801,
        help="probe port (/livez, /readyz) of n1, then +1 (10801)",
    )
    up.add_argument("--relaxed", action="store_true", help="durability relaxed: no fsync (tests, demos)")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the active node (60)")
    down = actions.add_parser("down", help="stop the nodes that `cluster up` started (SIGTERM, then SIGKILL)")
    down.add_argument("--dir", default="./dex-cluster", help="the directory given to `cluster up`")
    down.add_argument(
        "--timeout",
        type=float,
        default=45.0,
        help="seconds to wait after SIGTERM before SIGKILL (45: above the 30 s drain)",
    )


def cmd_cluster(args: argparse.Namespace) -> int:
    try:
        if args.cluster_command == "down":
            for line in cluster_down(Path(args.dir), timeout_s=args.timeout):
                print(line)
            return 0
        http_ports = contiguous_ports(args.base_port, args.nodes, "--base-port")
        raft_ports = contiguous_ports(args.raft_base_port, args.nodes, "--raft-base-port")
        probe_ports = contiguous_ports(args.probe_base_port, args.nodes, "--probe-base-port")
        plan = plan_cluster(
            Path(args.dir), http_ports, raft_ports, probe_ports, durability="relaxed" if args.relaxed else "strict"
        )
        result = cluster_up(plan, timeout_s=args.timeout)
    except ValueError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from None
    except ClusterError as exc:
        raise CommandFailed(str(exc), EXIT_REFUSED) from None
    print(format_up_report(result))
    return 0
