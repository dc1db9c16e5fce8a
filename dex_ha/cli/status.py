"""`dex-ha status`: the cluster table, from every node's own /v1/cluster view."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from dex_ha.cli.common import (
    EXIT_NO_NODE,
    EXIT_REFUSED,
    CommandFailed,
    Subparsers,
    dash,
    format_table,
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
    status = sub.add_parser("status", parents=[remote], help="the cluster table, from every node")
    status.add_argument("--json", action="store_true", help="print the raw /v1/cluster answers")


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
    answers = asyncio.run(gather_views(urls_of(args), token_of(args)))
    if args.json:
        print(
            json.dumps(
                {
                    "nodes": [
                        {"url": a.url, "answer": a.view} if a.view else {"url": a.url, "error": a.error}
                        for a in answers
                    ]
                },
                indent=2,
            )
        )
    else:
        print(format_status(answers))
    if any(a.view for a in answers):
        return 0
    if any(a.refused for a in answers):
        raise CommandFailed(next(a.error or "refused" for a in answers if a.refused), EXIT_REFUSED)
    raise CommandFailed(f"no dex-ha node answers at {', '.join(a.url for a in answers)}", EXIT_NO_NODE)
