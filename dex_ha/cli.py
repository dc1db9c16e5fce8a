"""The `dex-ha` command.

    dex-ha dev | node | cluster up | cluster down | status | step-down | members … | demo
    dex-ha backup | restore   (cli_backup.py)

Exit codes: 0 done; 1 the server refused (its message is printed) or a cluster command
could not go on; 2 bad usage, or a config that cannot run; 3 no node answered. An expected
error prints one line to stderr, never a traceback.

The commands that talk to a cluster take `--url` (several allowed, or comma-separated) and
`--token`, and follow the active node like the SDKs do; they use the Client SDK's
Connection for every request. Without the flags they read DEX_HA_URLS and DEX_HA_TOKEN,
which `source DIR/tokens.env` sets after `dex-ha cluster up` (dex_ha/client/env.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from dex_ha import cli_backup, cli_cluster, cli_sessions
from dex_ha.client import Connection, DexClient, DexError, DexUnavailable
from dex_ha.client.env import DEFAULT_URL, TOKEN_VAR, URLS_VAR, split_urls, token_from_env, urls_from_env
from dex_ha.server.auth import TokenAuth
from dex_ha.server.config import ConfigError, dev_config, dev_overrides_from_env, load_config, tokens_from_env

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NO_NODE = 3
# How long a command looks for the active node (an election takes about a second).
FIND_ACTIVE_TIMEOUT_S = 15.0
# `status`: how long one node may take to answer before it is marked as not answering.
STATUS_NODE_TIMEOUT_S = 2.0
# `step-down` without --drain-timeout-ms waits for the server's configured drain (≤ 1 h).
STEP_DOWN_MAX_WAIT_S = 3600.0


class CommandFailed(Exception):
    """An expected failure: one line for stderr and the exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# ---------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dex-ha", description="dex-ha durable execution server",
        epilog=f"The commands that talk to a cluster (status, step-down, members, sessions) read ${URLS_VAR} "
               f"(comma-separated node URLs) and ${TOKEN_VAR} when --url and --token are not given; "
               f"`source DIR/tokens.env` after `dex-ha cluster up` sets both. "
               f"Exit codes: 0 done, 1 refused, 2 bad usage, 3 no node answered.")
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

    _add_cluster_parser(sub)
    remote = _remote_options()
    status = sub.add_parser("status", parents=[remote], help="the cluster table, from every node")
    status.add_argument("--json", action="store_true", help="print the raw /v1/cluster answers")

    step_down = sub.add_parser("step-down", parents=[remote], help="move the active node elsewhere (planned)")
    step_down.add_argument("--to", metavar="NODE", help="the node to hand over to (default: the most caught-up)")
    step_down.add_argument("--drain-timeout-ms", type=_non_negative_int, metavar="N",
                           help="how long running attempts may finish first (default: the node's drain_timeout_ms)")

    _add_members_parser(sub, remote)
    cli_sessions.add_parser(sub, remote)

    cli_backup.add_parsers(sub, remote)

    demo = sub.add_parser("demo", help="a scripted agent session through a failover, on a local cluster")
    demo.add_argument("--dir", help="where the cluster lives (default: a new temporary directory)")
    demo.add_argument("--keep", action="store_true", help="leave the cluster and the Worker running at the end")
    return parser


def _add_cluster_parser(sub: argparse._SubParsersAction) -> None:
    cluster = sub.add_parser("cluster", help="a local cluster on loopback, for trying HA")
    actions = cluster.add_subparsers(dest="cluster_command", required=True, metavar="{up,down}")
    up = actions.add_parser("up", help="write configs, start the nodes, wait for the active node")
    up.add_argument("--nodes", type=_positive_int, default=3, help="how many nodes (default 3)")
    up.add_argument("--dir", default="./dex-cluster", help="configs, data, logs and pids (default ./dex-cluster)")
    up.add_argument("--base-port", type=_positive_int, default=8801, help="HTTP port of n1; n2 gets +1, … (8801)")
    up.add_argument("--raft-base-port", type=_positive_int, default=9801, help="Raft port of n1, then +1 (9801)")
    up.add_argument("--probe-base-port", type=_positive_int, default=10801,
                    help="probe port (/livez, /readyz) of n1, then +1 (10801)")
    up.add_argument("--relaxed", action="store_true", help="durability relaxed: no fsync (tests, demos)")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the active node (60)")
    down = actions.add_parser("down", help="stop the nodes that `cluster up` started (SIGTERM, then SIGKILL)")
    down.add_argument("--dir", default="./dex-cluster", help="the directory given to `cluster up`")
    down.add_argument("--timeout", type=float, default=45.0,
                      help="seconds to wait after SIGTERM before SIGKILL (45: above the 30 s drain)")


def _add_members_parser(sub: argparse._SubParsersAction, remote: argparse.ArgumentParser) -> None:
    members_remote = remote
    remote = _remote_options(default=argparse.SUPPRESS)  # for the subcommands (see _remote_options)
    members = sub.add_parser("members", parents=[members_remote], help="list, add, promote or remove cluster members",
                             description="Without a subcommand: the members as the active node sees them, "
                                         "with each one's last contact and replication progress.")
    actions = members.add_subparsers(dest="members_command", metavar="{list,add,promote,remove}")
    actions.add_parser("list", parents=[remote], help="the members, their last contact and progress (the default)")
    add = actions.add_parser("add", parents=[remote], help="add a node as a learner (cold standby)")
    add.add_argument("--id", required=True, help="the new node's id")
    add.add_argument("--raft-addr", required=True, metavar="HOST:PORT", help="the new node's Raft address")
    add.add_argument("--node-url", required=True, metavar="URL", help="the new node's HTTP URL")
    for name, what in (("promote", "promote a learner to a voter"), ("remove", "remove a member")):
        action = actions.add_parser(name, parents=[remote], help=what)
        action.add_argument("id", metavar="ID", help="the member's node id")


def _remote_options(default: Any = None) -> argparse.ArgumentParser:
    """--url and --token, shared by the commands that talk to a running cluster.

    `default=argparse.SUPPRESS` is for a subcommand of a command that takes them too
    (`members --url X list`): otherwise the subcommand's None would overwrite X.
    """
    remote = argparse.ArgumentParser(add_help=False, argument_default=default)
    remote.add_argument("--url", action="append", metavar="URL",
                        help=f"a node URL; repeat, or separate with commas, for several "
                             f"(default: ${URLS_VAR}, else {DEFAULT_URL})")
    remote.add_argument("--token", help=f"a bearer token (default: ${TOKEN_VAR})")
    return remote


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


# ---------------------------------------------------------------- main


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
    name = " ".join(filter(None, [args.command, getattr(args, "cluster_command", None),
                                  getattr(args, "members_command", None), getattr(args, "sessions_command", None)]))
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


# ---------------------------------------------------------------- dev and node


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
    # No authentication unless tokens are configured (docs/configuration.md): DEX_HA_TOKENS_* set them.
    tokens = {role: tuple(values) for role, values in tokens_from_env(os.environ).items()}
    try:
        config = replace(dev_config(Path(args.data_dir), args.port, host=args.host, tokens=tokens,
                                    durability="relaxed" if args.relaxed else "strict"),
                         **dev_overrides_from_env(os.environ))
        config.check()
        TokenAuth(config.tokens)  # refuses short, duplicated or unknown-role tokens, naming them
    except (ConfigError, ValueError) as exc:
        print(f"dex-ha dev: {exc}", file=sys.stderr)
        return 2
    return _run_node(config, args.log_json)


def cmd_node(args: argparse.Namespace) -> int:
    try:
        config = load_config(Path(args.config), insecure=args.insecure)
    except ConfigError as exc:
        print(f"dex-ha node: {exc}", file=sys.stderr)
        return 2
    return _run_node(config, args.log_json)


# ---------------------------------------------------------------- cluster up / down


def cmd_cluster(args: argparse.Namespace) -> int:
    try:
        if args.cluster_command == "down":
            for line in cli_cluster.cluster_down(Path(args.dir), timeout_s=args.timeout):
                print(line)
            return 0
        http_ports = cli_cluster.contiguous_ports(args.base_port, args.nodes, "--base-port")
        raft_ports = cli_cluster.contiguous_ports(args.raft_base_port, args.nodes, "--raft-base-port")
        probe_ports = cli_cluster.contiguous_ports(args.probe_base_port, args.nodes, "--probe-base-port")
        plan = cli_cluster.plan_cluster(Path(args.dir), http_ports, raft_ports, probe_ports,
                                        durability="relaxed" if args.relaxed else "strict")
        result = cli_cluster.cluster_up(plan, timeout_s=args.timeout)
    except ValueError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from None
    except cli_cluster.ClusterError as exc:
        raise CommandFailed(str(exc), EXIT_REFUSED) from None
    print(cli_cluster.format_up_report(result))
    return 0


# ---------------------------------------------------------------- talking to a cluster


def _urls(args: argparse.Namespace) -> list[str]:
    """--url (repeated or comma-separated), else $DEX_HA_URLS, else the dev URL; checked, no repeats."""
    given = [url for text in args.url for url in split_urls(text)] if args.url else None
    source = "--url" if given else URLS_VAR
    urls = []
    for url in given or urls_from_env():
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise CommandFailed(f"{source}: expected http://host:port, got {url!r}", EXIT_USAGE)
        if url.strip().rstrip("/") not in urls:
            urls.append(url.strip().rstrip("/"))
    return urls


def _token(args: argparse.Namespace) -> str | None:
    return args.token or token_from_env(TOKEN_VAR)


UNAUTHORIZED_HINT = f"401 unauthorized: set {TOKEN_VAR} or pass --token"


def _refusal(exc: DexError) -> str:
    if exc.status == 401:  # the usual first stumble: tokens.env not sourced
        return f"{UNAUTHORIZED_HINT} (the server said: {exc.message})"
    return f"refused ({exc.status} {exc.code}): {exc.message}"


async def find_active(urls: list[str], token: str | None, timeout_s: float = FIND_ACTIVE_TIMEOUT_S) -> str:
    """The URL of the active node: /readyz, following `leader_url` like the SDKs do.

    The member URLs that the nodes list join the given ones, so that one --url of any
    node is enough (a Connection follows `leader_url` only when it has several URLs).
    CommandFailed with exit 3 when no URL answers at all, or when no node becomes
    active within `timeout_s`.
    """
    answers = await gather_views(urls, token)
    if not any(a.view or a.refused for a in answers):
        raise CommandFailed(f"no dex-ha node answers at {', '.join(urls)}", EXIT_NO_NODE)
    if not any(a.view for a in answers):  # every node that answered refused (a token problem)
        raise CommandFailed(next(a.error for a in answers if a.refused), EXIT_REFUSED)
    candidates = list(dict.fromkeys(urls + [a.url for a in answers]))
    async with Connection(candidates, token, give_up_after_s=timeout_s,
                          request_timeout_s=STATUS_NODE_TIMEOUT_S) as conn:
        try:
            await conn.request("GET", "/readyz")
        except DexUnavailable as exc:
            raise CommandFailed(f"no active node within {timeout_s:.0f} s: {exc.message}", EXIT_NO_NODE) from None
        except DexError as exc:
            raise CommandFailed(_refusal(exc), EXIT_REFUSED) from None
        return conn.current_url


async def call_once(url: str, token: str | None, method: str, path: str, body: Any = None,
                    timeout_s: float = 30.0) -> Any:
    """One request to one node, never repeated: an admin change must not run twice."""
    async with Connection(url, token, give_up_after_s=0, request_timeout_s=timeout_s) as conn:
        try:
            return await conn.request(method, path, body)
        except DexUnavailable as exc:
            raise CommandFailed(f"{url} did not answer as the active node: {exc.message}", EXIT_NO_NODE) from None
        except DexError as exc:
            raise CommandFailed(_refusal(exc), EXIT_REFUSED) from None


async def call_active(args: argparse.Namespace, method: str, path: str, body: Any = None,
                      timeout_s: float = 30.0) -> Any:
    url = await find_active(_urls(args), _token(args))
    return await call_once(url, _token(args), method, path, body, timeout_s)


# ---------------------------------------------------------------- status


@dataclass
class NodeAnswer:
    """What one URL answered to GET /v1/cluster: the view, or why there is none."""

    url: str
    view: dict[str, Any] | None = None
    error: str | None = None
    refused: bool = False  # it answered with an error status (it is up, but said no)
    status: int | None = None  # the HTTP status of a refusal


async def fetch_view(url: str, token: str | None) -> NodeAnswer:
    async with Connection(url, token, give_up_after_s=STATUS_NODE_TIMEOUT_S / 2,
                          request_timeout_s=STATUS_NODE_TIMEOUT_S) as conn:
        try:
            return NodeAnswer(url, view=await conn.request("GET", "/v1/cluster"))
        except DexUnavailable:
            return NodeAnswer(url, error="no answer")
        except DexError as exc:
            return NodeAnswer(url, error=_refusal(exc), refused=True, status=exc.status)


async def gather_views(urls: list[str], token: str | None) -> list[NodeAnswer]:
    """/v1/cluster from the given URLs, then from every member URL they list that was not asked yet."""
    answers = list(await asyncio.gather(*(fetch_view(url, token) for url in urls)))
    seen_ids = {a.view["node_id"] for a in answers if a.view}
    member_urls = [m["url"].rstrip("/") for a in answers if a.view for m in a.view.get("members", [])
                   if m.get("url") and m["id"] not in seen_ids]
    extra = [url for url in dict.fromkeys(member_urls) if url not in urls]
    answers += await asyncio.gather(*(fetch_view(url, token) for url in extra))
    return answers


def _reference_members(answers: list[NodeAnswer]) -> dict[str, dict[str, Any]]:
    """Members as the active node sees them (match index and contact are the leader's knowledge)."""
    views = [a.view for a in answers if a.view]
    reference = next((v for v in views if v.get("role") in ("active", "draining")), views[0] if views else None)
    return {m["id"]: m for m in (reference or {}).get("members", [])}


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def status_rows(answers: list[NodeAnswer]) -> list[list[str]]:
    members = _reference_members(answers)
    id_by_url = {(m.get("url") or "").rstrip("/"): node_id for node_id, m in members.items()}
    rows = []
    for a in answers:
        v = a.view
        node_id = v["node_id"] if v else id_by_url.get(a.url, "?")
        m = members.get(node_id, {})
        voter = {True: "yes", False: "no"}.get(m.get("voter"), "-")
        contact_text = contact_text_of(m)
        if v is None:
            rows.append([node_id, a.url, "REFUSED" if a.refused else "NO ANSWER", "-", "-", "-", "-", "-",
                         voter, _dash(m.get("match_index")), contact_text])
            continue
        rows.append([node_id, a.url, v["role"], _dash(v.get("term")), _dash(v.get("leader_id")),
                     _dash(v.get("commit_index")), _dash(v.get("applied_index")), _dash(v.get("lease_remaining_ms")),
                     voter, _dash(m.get("match_index")), contact_text])
    return rows


def format_status(answers: list[NodeAnswer]) -> str:
    headers = ["node", "url", "role", "term", "leader", "commit", "applied", "lease ms", "voter", "match",
               "last contact"]
    lines = [cli_cluster.format_table(headers, status_rows(answers)), ""]
    active = [a for a in answers if a.view and a.view.get("role") == "active"]
    if len(active) == 1:
        lines.append(f"active node: {active[0].view['node_id']} ({active[0].url})")
    elif any(a.status == 401 for a in answers) and not any(a.view for a in answers):
        lines.append(UNAUTHORIZED_HINT)  # nodes are up but refuse the token: not an election
    elif not active:
        lines.append("NO active node answered (an election may be running; try again in a second)")
    else:
        lines.append(f"WARNING: {len(active)} nodes say they are active: "
                     + ", ".join(a.view["node_id"] for a in active))
    lines += [f"{a.url}: {a.error}" for a in answers if a.error]
    if any(a.view.get("insecure") for a in answers if a.view):
        lines.append("note: the cluster runs WITHOUT authentication (--insecure or dev mode)")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    answers = asyncio.run(gather_views(_urls(args), _token(args)))
    if args.json:
        print(json.dumps({"nodes": [{"url": a.url, "answer": a.view} if a.view else {"url": a.url, "error": a.error}
                                    for a in answers]}, indent=2))
    else:
        print(format_status(answers))
    if any(a.view for a in answers):
        return 0
    if any(a.refused for a in answers):
        raise CommandFailed(next(a.error for a in answers if a.refused), EXIT_REFUSED)
    raise CommandFailed(f"no dex-ha node answers at {', '.join(a.url for a in answers)}", EXIT_NO_NODE)


# ---------------------------------------------------------------- step down and members


def cmd_step_down(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if args.to is not None:
        body["to"] = args.to
    if args.drain_timeout_ms is not None:
        body["drain_timeout_ms"] = args.drain_timeout_ms
    # The answer comes after the drain and the transfer: wait for both.
    wait_s = STEP_DOWN_MAX_WAIT_S if args.drain_timeout_ms is None else args.drain_timeout_ms / 1000
    answer = asyncio.run(call_active(args, "POST", "/v1/cluster/step-down", body, timeout_s=wait_s + 30))
    left = answer.get("running_attempts_left", 0)
    still = "1 attempt was" if left == 1 else f"{left} attempts were"
    print(f"active node moved from {answer.get('from')} to {answer.get('to')} ({still} still running)")
    return 0


def contact_text_of(member: dict[str, Any]) -> str:
    """"12 ms ago"; "never" when the active node never heard from it; "-" when unknown."""
    if member.get("contacted") is False:
        return "never"
    contact = member.get("last_contact_ms_ago")
    return "-" if contact is None else f"{contact} ms ago"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def progress_text_of(member: dict[str, Any], commit_index: int | None) -> str:
    """How far a member is: a snapshot streaming to it (bytes), or its match index against the commit index."""
    if member.get("replication") == "self":
        return "leader"
    sent_total = member.get("snapshot_bytes")
    if sent_total:
        sent, total = sent_total
        percent = 100 * sent // total if total else 100
        return f"snapshot {_mib(sent)} of {_mib(total)} ({percent}%)"
    if member.get("contacted") is False:
        return "not reached yet (is it running?)"
    match = member.get("match_index")
    if match is None or commit_index is None:
        return "-"
    if member.get("replication") == "snapshot":
        return f"snapshot sent, applying (match {match} of {commit_index})"
    if match >= commit_index:
        return "caught up"
    return f"catching up: {match} of {commit_index} ({max(0, commit_index - match)} behind)"


def format_members(members: list[dict[str, Any]], commit_index: int | None = None) -> str:
    rows = [[m["id"], "voter" if m.get("voter") else "learner", _dash(m.get("url")), _dash(m.get("match_index")),
             contact_text_of(m), progress_text_of(m, commit_index)]
            for m in members]
    return cli_cluster.format_table(["member", "kind", "url", "match", "last contact", "progress"], rows)


def cmd_members(args: argparse.Namespace) -> int:
    if args.members_command in (None, "list"):
        view = asyncio.run(call_active(args, "GET", "/v1/cluster"))
        print(format_members(view.get("members", []), view.get("commit_index")))
        return 0
    member = quote(args.id, safe="")
    if args.members_command == "add":
        body = {"id": args.id, "raft_addr": args.raft_addr, "url": args.node_url}
        answer = asyncio.run(call_active(args, "POST", "/v1/cluster/members", body))
        done = f"{args.id} added as a learner (cold standby); promote it with: dex-ha members promote {args.id}"
    elif args.members_command == "promote":
        answer = asyncio.run(call_active(args, "POST", f"/v1/cluster/members/{member}/promote"))
        done = f"{args.id} is a voter now"
    else:
        answer = asyncio.run(call_active(args, "DELETE", f"/v1/cluster/members/{member}"))
        done = f"{args.id} removed from the cluster"
    print(done)
    print(format_members(answer.get("members", []), answer.get("commit_index")))
    return 0


# ---------------------------------------------------------------- sessions


def cmd_sessions(args: argparse.Namespace) -> int:
    """`dex-ha sessions …`: the active node is found first (clear errors), then the Client SDK."""
    async def run() -> str:
        urls, token = _urls(args), _token(args)
        active = await find_active(urls, token)
        candidates = list(dict.fromkeys([active, *urls]))
        async with DexClient(candidates, token, give_up_after_s=FIND_ACTIVE_TIMEOUT_S) as client:
            try:
                return await cli_sessions.run(args, client)
            except DexUnavailable as exc:
                raise CommandFailed(exc.message, EXIT_NO_NODE) from None
            except DexError as exc:
                raise CommandFailed(_refusal(exc), EXIT_REFUSED) from None
            except (TypeError, ValueError) as exc:  # bad input, named by the SDK or cli_sessions
                raise CommandFailed(str(exc), EXIT_USAGE) from None

    print(asyncio.run(run()))
    return 0


# ---------------------------------------------------------------- backup and restore


def cmd_backup(args: argparse.Namespace) -> int:
    async def backup() -> dict[str, Any]:
        url = await find_active(_urls(args), _token(args))
        return await cli_backup.download_backup([url], _token(args), Path(args.out), args.timeout)

    try:
        info = asyncio.run(backup())
    except cli_backup.BackupError as exc:  # the download's header or checksum is wrong: nothing written
        raise CommandFailed(str(exc), EXIT_REFUSED) from None
    except ValueError as exc:  # a bad argument
        raise CommandFailed(str(exc), EXIT_USAGE) from None
    except TimeoutError:
        raise CommandFailed(f"the download took longer than --timeout {args.timeout:g} s", EXIT_NO_NODE) from None
    except DexUnavailable as exc:
        raise CommandFailed(f"no active node served the backup: {exc.message}", EXIT_NO_NODE) from None
    except DexError as exc:
        raise CommandFailed(_refusal(exc), EXIT_REFUSED) from None
    print(cli_backup.backup_line(args.out, info))
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    try:
        print(cli_backup.run_restore(args.file, args.data_dir, args.node_id, args.members, args.relaxed))
    except ValueError as exc:  # the file, its checksum or format, the data dir or an argument
        raise CommandFailed(str(exc), EXIT_USAGE) from None
    return 0


# ---------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    from dex_ha.demo import run_demo

    return run_demo(Path(args.dir) if args.dir else None, keep=args.keep)


COMMANDS = {"dev": cmd_dev, "node": cmd_node, "cluster": cmd_cluster, "status": cmd_status,
            "step-down": cmd_step_down, "members": cmd_members, "demo": cmd_demo, "sessions": cmd_sessions,
            "backup": cmd_backup, "restore": cmd_restore}

if __name__ == "__main__":
    sys.exit(main())
