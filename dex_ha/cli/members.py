"""`dex-ha step-down` (move the active node elsewhere) and `dex-ha members …` (list, add,
promote, remove), and the text of a member's contact and replication progress, which
`dex-ha status` shows too."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any
from urllib.parse import quote

from dex_ha.cli.common import (
    Subparsers,
    dash,
    format_table,
    non_negative_int,
    remote_options,
)
from dex_ha.cli.remote import call_active

# `step-down` without --drain-timeout-ms waits for the server's configured drain (≤ 1 h).
STEP_DOWN_MAX_WAIT_S = 3600.0


def add_parsers(sub: Subparsers, remote: argparse.ArgumentParser) -> None:
    step_down = sub.add_parser("step-down", parents=[remote], help="move the active node elsewhere (planned)")
    step_down.add_argument("--to", metavar="NODE", help="the node to hand over to (default: the most caught-up)")
    step_down.add_argument(
        "--drain-timeout-ms",
        type=non_negative_int,
        metavar="N",
        help="how long running attempts may finish first (default: the node's drain_timeout_ms)",
    )

    sub_remote = remote_options(default=argparse.SUPPRESS)  # for the subcommands (see remote_options)
    members = sub.add_parser(
        "members",
        parents=[remote],
        help="list, add, promote or remove cluster members",
        description="Without a subcommand: the members as the active node sees them, "
        "with each one's last contact and replication progress.",
    )
    actions = members.add_subparsers(dest="members_command", metavar="{list,add,promote,remove}")
    actions.add_parser("list", parents=[sub_remote], help="the members, their last contact and progress (the default)")
    add = actions.add_parser("add", parents=[sub_remote], help="add a node as a learner (cold standby)")
    add.add_argument("--id", required=True, help="the new node's id")
    add.add_argument("--raft-addr", required=True, metavar="HOST:PORT", help="the new node's Raft address")
    add.add_argument("--node-url", required=True, metavar="URL", help="the new node's HTTP URL")
    for name, what in (("promote", "promote a learner to a voter"), ("remove", "remove a member")):
        action = actions.add_parser(name, parents=[sub_remote], help=what)
        action.add_argument("id", metavar="ID", help="the member's node id")


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
    """ "12 ms ago"; "never" when the active node never heard from it; "-" when unknown."""
    if member.get("contacted") is False:
        return "never"
    contact = member.get("last_contact_ms_ago")
    return "-" if contact is None else f"{contact} ms ago"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def progress_text_of(member: dict[str, Any], commit_index: int | None) -> str:
    """How far a member is: a snapshot streaming to it (bytes), entries it lost, or the index
    it applied against the commit index ("caught up" only once it applied every committed entry)."""
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
    lost = member.get("lost_acknowledged_index")
    if lost:
        return f"LOST ENTRIES: had stored up to {lost}, has {match}; catching up (see the leader's log)"
    # A server of the release before reports no applied index: its match index then.
    applied = member.get("applied_index")
    done = match if applied is None else min(match, applied)
    if member.get("replication") == "snapshot":
        return f"snapshot sent, applying (match {match} of {commit_index})"
    relapsed = f" (lost entries {member['lost_entries']}x this term)" if member.get("lost_entries") else ""
    if done >= commit_index:
        return "caught up" + relapsed
    return f"catching up: applied {done} of {commit_index} ({commit_index - done} behind){relapsed}"


def format_members(members: list[dict[str, Any]], commit_index: int | None = None) -> str:
    rows = [
        [
            m["id"],
            "voter" if m.get("voter") else "learner",
            dash(m.get("url")),
            dash(m.get("match_index")),
            dash(m.get("applied_index")),
            contact_text_of(m),
            progress_text_of(m, commit_index),
        ]
        for m in members
    ]
    return format_table(["member", "kind", "url", "match", "applied", "last contact", "progress"], rows)


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
