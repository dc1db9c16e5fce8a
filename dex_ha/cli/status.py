"""`dex-ha status`: the cluster table, from every node's own /v1/cluster view.

`--watch` draws it again every `--interval` seconds until Ctrl-C (or `--count` frames): on a
terminal over the previous frame, otherwise one frame after another under a timestamp line.
A node that stops answering shows as NO ANSWER in the next frame and the watch goes on; the
nodes a frame met stay in the next ones, so that a failover of the node named by --url does
not hide the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from dex_ha.cli.common import (
    EXIT_NO_NODE,
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandFailed,
    Subparsers,
    dash,
    format_table,
    positive_int,
    when,
)
from dex_ha.cli.members import contact_text_of
from dex_ha.cli.remote import (
    UNAUTHORIZED_HINT,
    NodeAnswer,
    gather_views,
    token_of,
    urls_of,
)


def add_parser(sub: Subparsers, remote: argparse.ArgumentParser) -> None:
    status = sub.add_parser(
        "status",
        parents=[remote],
        help="the cluster table, from every node (--watch: drawn again until Ctrl-C)",
        description="Ask every node for its view of the cluster and print one table: each node's role, term, "
        "commit and applied index, lease, version. With --watch the table is drawn again every --interval "
        "seconds until Ctrl-C: on a terminal in place, otherwise frame after frame under a line with the "
        "time. A node that goes down shows as NO ANSWER and the watch goes on.",
    )
    status.add_argument(
        "--json", action="store_true", help="print the raw /v1/cluster answers (with --watch: one JSON line a frame)"
    )
    status.add_argument(
        "--watch", action="store_true", help="draw the table again every --interval seconds, until Ctrl-C"
    )
    status.add_argument(
        "--interval",
        type=_interval,
        metavar="SECONDS",
        help=f"with --watch: seconds between frames (default {WATCH_INTERVAL_S:g})",
    )
    status.add_argument("--count", type=positive_int, metavar="N", help="with --watch: stop after N frames")


# `status --watch` draws a frame this often unless --interval says otherwise.
WATCH_INTERVAL_S = 2.0
# A terminal's escape codes: cursor home, then erase the screen.
CLEAR_SCREEN = "\033[H\033[2J"


def _interval(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _reference_members(answers: list[NodeAnswer]) -> dict[str, dict[str, Any]]:
    """Members as the active node sees them (match index and contact are the leader's knowledge)."""
    views = [a.view for a in answers if a.view]
    reference = next((v for v in views if v.get("role") in ("active", "draining")), views[0] if views else None)
    return {m["id"]: m for m in (reference or {}).get("members", [])}


def status_rows(answers: list[NodeAnswer]) -> list[list[str]]:
    members = _reference_members(answers)
    id_by_url = {(m.get("url") or "").rstrip("/"): node_id for node_id, m in members.items()}
    rows = []
    for a in answers:
        v = a.view
        node_id = v["node_id"] if v else id_by_url.get(a.url, "?")
        m = members.get(node_id, {})
        voter = "yes" if m.get("voter") is True else "no" if m.get("voter") is False else "-"
        contact_text = contact_text_of(m)
        if v is None:
            rows.append(
                [
                    node_id,
                    a.url,
                    "REFUSED" if a.refused else "NO ANSWER",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    voter,
                    dash(m.get("match_index")),
                    contact_text,
                    version_text(None, m),
                ]
            )
            continue
        rows.append(
            [
                node_id,
                a.url,
                v["role"],
                dash(v.get("term")),
                dash(v.get("leader_id")),
                dash(v.get("commit_index")),
                dash(v.get("applied_index")),
                dash(v.get("lease_remaining_ms")),
                voter,
                dash(m.get("match_index")),
                contact_text,
                version_text(v, m),
            ]
        )
    return rows


def version_text(view: dict[str, Any] | None, member: dict[str, Any]) -> str:
    """A node's release and state machine: as it says itself, else as the active node
    heard it ("0.1.0 (sm v1)"); a node of 0.1.0 does not say, its peers know."""
    own = view or {}
    package = own.get("version") or member.get("version")
    state_machine = own.get("state_machine_version") or member.get("state_machine_version")
    return f"{package} (sm v{state_machine})" if package else "-"


def cluster_version_line(answers: list[NodeAnswer]) -> str | None:
    """The cluster's state-machine version, and what it waits for during a rolling upgrade."""
    views = [a.view for a in answers if a.view and a.view.get("cluster_state_machine_version")]
    if not views:
        return None  # only nodes of 0.1.0 answered
    reference = next((v for v in views if v.get("role") in ("active", "draining")), views[0])
    cluster = reference["cluster_state_machine_version"]
    runs = {m.get("state_machine_version") for m in reference.get("members", [])}
    newest = max((n for n in runs if n is not None), default=cluster)
    line = f"cluster state machine: v{cluster}"
    if newest > cluster:
        line += f" (it moves to v{newest} once every member runs it: a rolling upgrade is under way)"
    return line


def format_status(answers: list[NodeAnswer]) -> str:
    headers = [
        "node",
        "url",
        "role",
        "term",
        "leader",
        "commit",
        "applied",
        "lease ms",
        "voter",
        "match",
        "last contact",
        "version",
    ]
    lines = [format_table(headers, status_rows(answers)), ""]
    active = [(a.url, a.view) for a in answers if a.view and a.view.get("role") == "active"]
    if len(active) == 1:
        url, view = active[0]
        lines.append(f"active node: {view['node_id']} ({url})")
    elif any(a.status == 401 for a in answers) and not any(a.view for a in answers):
        lines.append(UNAUTHORIZED_HINT)  # nodes are up but refuse the token: not an election
    elif not active:
        lines.append("NO active node answered (an election may be running; try again in a second)")
    else:
        lines.append(
            f"WARNING: {len(active)} nodes say they are active: " + ", ".join(view["node_id"] for _, view in active)
        )
    version_line = cluster_version_line(answers)
    if version_line is not None:
        lines.append(version_line)
    lines += [f"{a.url}: {a.error}" for a in answers if a.error]
    lines += [
        f"ALARM {alarm.get('alarm')} on {a.view.get('node_id')}: {alarm.get('message')}"
        for a in answers
        if a.view
        for alarm in a.view.get("alarms") or []
    ]
    lines += consistency_alarm_lines(answers)
    if any(a.view.get("insecure") for a in answers if a.view):
        lines.append("note: the cluster runs WITHOUT authentication (--insecure or dev mode)")
    return "\n".join(lines)


def consistency_alarm_lines(answers: list[NodeAnswer]) -> list[str]:
    """A line per member under the consistency alarm (replicated: any node's view names it)."""
    alarms: dict[str, int] = {}
    for a in answers:
        if a.view:
            alarms.update({node: info["index"] for node, info in (a.view.get("consistency_alarms") or {}).items()})
    return [
        f"CONSISTENCY ALARM: {node}'s state differed from the majority's at index {index}; it will not "
        f'become active. Replace it (docs/operations.md, "The consistency alarm")'
        for node, index in sorted(alarms.items())
    ]


def cmd_status(args: argparse.Namespace) -> int:
    if not args.watch and (args.interval is not None or args.count is not None):
        raise CommandFailed("--interval and --count go with --watch", EXIT_USAGE)
    urls, token = urls_of(args), token_of(args)
    if args.watch:
        answers = asyncio.run(
            watch_status(
                urls,
                token,
                interval_s=args.interval or WATCH_INTERVAL_S,
                count=args.count,
                as_json=args.json,
                on_terminal=sys.stdout.isatty(),
            )
        )
    else:
        answers = asyncio.run(gather_views(urls, token))
        print(json.dumps(_json_of(answers), indent=2) if args.json else format_status(answers))
    return _exit_code(answers)


def _json_of(answers: list[NodeAnswer]) -> dict[str, Any]:
    return {
        "nodes": [{"url": a.url, "answer": a.view} if a.view else {"url": a.url, "error": a.error} for a in answers]
    }


def _exit_code(answers: list[NodeAnswer]) -> int:
    """0 when a node answered; else the refusal (exit 1) or "no node answers" (exit 3)."""
    if any(a.view for a in answers):
        return 0
    if any(a.refused for a in answers):
        raise CommandFailed(next(a.error or "refused" for a in answers if a.refused), EXIT_REFUSED)
    raise CommandFailed(f"no dex-ha node answers at {', '.join(a.url for a in answers)}", EXIT_NO_NODE)


async def watch_status(
    urls: list[str], token: str | None, *, interval_s: float, count: int | None, as_json: bool, on_terminal: bool
) -> list[NodeAnswer]:
    """Print a frame every `interval_s` until `count` frames (None: until Ctrl-C); the last
    frame's answers. A frame is the table under a timestamp line, or with `as_json` one JSON
    line with the time in `at`."""
    loop = asyncio.get_running_loop()
    frames = 0
    while True:
        started = loop.time()
        answers = await gather_views(urls, token)
        urls = list(dict.fromkeys([*urls, *(a.url for a in answers)]))  # a node that goes down stays in the table
        frames += 1
        now = when(time.time() * 1000)
        if as_json:
            print(json.dumps({"at": now, **_json_of(answers)}), flush=True)
        else:
            header = f"dex-ha status at {now} (every {interval_s:g} s; Ctrl-C stops)\n"
            before = CLEAR_SCREEN if on_terminal else "\n" if frames > 1 else ""
            print(before + header + ("\n" if on_terminal else "") + format_status(answers), flush=True)
        if count is not None and frames >= count:
            return answers
        await asyncio.sleep(max(0.0, started + interval_s - loop.time()))
