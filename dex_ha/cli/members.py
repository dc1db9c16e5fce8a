"""`dex-ha step-down` (move the active node elsewhere) and `dex-ha members …` (list, add,
promote, remove, replace), and the text of a member's contact and replication progress, which
`dex-ha status` shows too."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from dex_ha.cli.common import (
    EXIT_NO_NODE,
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandFailed,
    Subparsers,
    dash,
    format_table,
    non_negative_int,
    remote_options,
)
from dex_ha.cli.remote import call_active

# `step-down` without --drain-timeout-ms waits for the server's configured drain (≤ 1 h).
STEP_DOWN_MAX_WAIT_S = 3600.0
# `members replace`: how long it waits for the new incarnation to catch up, by default, and
# how often it asks.
REPLACE_WAIT_S = 600.0
REPLACE_POLL_S = 1.0
# How long each membership step of `members replace` is tried again while no node is active.
REPLACE_STEP_S = 60.0


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
    actions = members.add_subparsers(dest="members_command", metavar="{list,add,promote,remove,replace}")
    actions.add_parser("list", parents=[sub_remote], help="the members, their last contact and progress (the default)")
    add = actions.add_parser("add", parents=[sub_remote], help="add a node as a learner (cold standby)")
    add.add_argument("--id", required=True, help="the new node's id")
    add.add_argument("--raft-addr", required=True, metavar="HOST:PORT", help="the new node's Raft address")
    add.add_argument("--node-url", required=True, metavar="URL", help="the new node's HTTP URL")
    for name, what in (("promote", "promote a learner to a voter"), ("remove", "remove a member")):
        action = actions.add_parser(name, parents=[sub_remote], help=what)
        action.add_argument("id", metavar="ID", help="the member's node id")
    replace = actions.add_parser(
        "replace",
        parents=[sub_remote],
        help="replace a member by a new incarnation with an empty data dir (a node that lost its data)",
        description="Removes the member, adds it back as a learner, tells you how to start the new "
        "incarnation (empty data dir, --join), waits until it has caught up and promotes it.",
    )
    replace.add_argument("id", metavar="ID", help="the member's node id")
    replace.add_argument(
        "--raft-addr", metavar="HOST:PORT", help="the new incarnation's Raft address (default: the old one)"
    )
    replace.add_argument("--node-url", metavar="URL", help="the new incarnation's HTTP URL (default: the old one)")
    replace.add_argument(
        "--wait",
        type=float,
        default=REPLACE_WAIT_S,
        metavar="S",
        help=f"seconds to wait for it to catch up before promoting it (default {REPLACE_WAIT_S:.0f}; 0: do not "
        "wait, promote it later with `dex-ha members promote`)",
    )


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
    if args.members_command == "replace":
        return asyncio.run(replace_member(args))
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


# ---------------------------------------------------------------- replace


async def replace_member(args: argparse.Namespace) -> int:
    """`dex-ha members replace ID`: the one way to bring back a member that lost its data
    (docs/operations.md, "Replacing a node"). Its old incarnation may have acknowledged
    entries it no longer has, so it must not come back as a voter: it is removed, added
    again as a learner, started empty with --join, and promoted once it has caught up.

    Each step is tried again while no node is active (the removal leaves two voters, and an
    election then is likely), and a step whose answer was lost counts as done when the
    cluster's view shows it. A replace that stopped after the removal is resumed by running
    it again with --raft-addr and --node-url."""
    view = await call_active(args, "GET", "/v1/cluster")
    old = _member(view, args.id)
    if view.get("node_id") == args.id:
        raise CommandFailed(
            f"{args.id} is the active node: move it first with `dex-ha step-down`, then replace it", EXIT_USAGE
        )
    if old is None and not (args.raft_addr and args.node_url):
        raise CommandFailed(
            f"{args.id} is not a member of this cluster (see `dex-ha members`). If a replace stopped after "
            f"removing it, run it again with --raft-addr and --node-url to add it back and finish",
            EXIT_USAGE,
        )
    raft_addr = args.raft_addr or (old or {}).get("raft_addr")
    url = args.node_url or (old or {}).get("url")
    if not raft_addr or not url:
        raise CommandFailed(f"the address of {args.id} is unknown: give --raft-addr and --node-url", EXIT_USAGE)
    member = quote(args.id, safe="")
    if old is not None:
        await _membership_step(
            args, "DELETE", f"/v1/cluster/members/{member}", None, lambda v: _member(v, args.id) is None
        )
        print(f"{args.id} removed (its old incarnation may have lost entries it acknowledged: it never votes again)")
    body = {"id": args.id, "raft_addr": raft_addr, "url": url}
    await _membership_step(args, "POST", "/v1/cluster/members", body, lambda v: _member(v, args.id) is not None)
    print(f"{args.id} added back as a learner at {raft_addr} ({url})")
    print(
        f"Now start its new incarnation on an EMPTY data dir, as a learner:\n"
        f"  dex-ha node --config <the config of {args.id}> --join",
        flush=True,
    )
    if old is not None and not old.get("voter"):
        print(f"{args.id} was a learner: it stays one (promote it with `dex-ha members promote {args.id}`)")
        return 0
    if args.wait <= 0:
        print(f"Once it has caught up (see `dex-ha members`), promote it: dex-ha members promote {args.id}")
        return 0
    print(f"waiting up to {args.wait:g} s for it to catch up, to promote it ...", flush=True)
    answer = await _promote_when_caught_up(args, member, time.monotonic() + args.wait)
    print(f"{args.id} caught up and is a voter again")
    print(format_members(answer.get("members", []), answer.get("commit_index")))
    return 0


def _member(view: dict[str, Any], node_id: str) -> dict[str, Any] | None:
    return next((m for m in view.get("members", []) if m["id"] == node_id), None)


async def _membership_step(
    args: argparse.Namespace, method: str, path: str, body: Any, done: Callable[[dict[str, Any]], bool]
) -> None:
    """One membership change on the active node. While no node is active it is tried again
    (up to REPLACE_STEP_S); before each new try the cluster's view is read, and a change it
    already shows (the answer to an earlier try was lost) is not made twice."""
    deadline = time.monotonic() + REPLACE_STEP_S
    while True:
        try:
            await call_active(args, method, path, body)
            return
        except CommandFailed as exc:
            if exc.exit_code != EXIT_NO_NODE:
                # Refused: fine if an earlier try, whose answer was lost, made the change.
                if done(await call_active(args, "GET", "/v1/cluster")):
                    return
                raise
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(REPLACE_POLL_S)
        try:
            if done(await call_active(args, "GET", "/v1/cluster")):
                return
        except CommandFailed as exc:
            if exc.exit_code != EXIT_NO_NODE:
                raise


async def _promote_when_caught_up(args: argparse.Namespace, member: str, deadline: float) -> Any:
    """Promote the learner as soon as the active node agrees it has caught up (it answers
    409 until then), or fail at `deadline` saying how to go on. While no node is active it
    tries again, and a promotion whose answer was lost counts once the view shows a voter."""
    while True:
        try:
            return await call_active(args, "POST", f"/v1/cluster/members/{member}/promote")
        except CommandFailed as exc:
            waiting = exc.exit_code == EXIT_NO_NODE or "not caught up" in str(exc)
            if not waiting:
                view = await call_active(args, "GET", "/v1/cluster")
                if (_member(view, args.id) or {}).get("voter"):
                    return view
            if not waiting or time.monotonic() >= deadline:
                raise CommandFailed(
                    f"{exc} — once it has caught up, promote it: dex-ha members promote {args.id}", EXIT_REFUSED
                ) from None
        await asyncio.sleep(REPLACE_POLL_S)
