"""`dex-ha sessions …`: look at sessions and act on them from a terminal.

    dex-ha sessions list [--agent A] [--status idle|running] [--awaiting-approval] [--outcome-unknown]
                         [--limit N] [--after CURSOR] [--all]
    dex-ha sessions show SESSION_ID
    dex-ha sessions approve SESSION_ID CALL_ID [--reason TEXT]
    dex-ha sessions deny SESSION_ID CALL_ID [--reason TEXT]
    dex-ha sessions answer SESSION_ID QUESTION_ID ANSWER [--json-value]
    dex-ha sessions reconcile SESSION_ID CALL_ID --outcome succeeded|failed [--result JSON] [--error TEXT]
    dex-ha sessions send SESSION_ID TEXT [--mode queue|steer] [--message-id ID]
    dex-ha sessions delete SESSION_ID

Every subcommand takes `--json` (the server's answer as JSON, for scripts) and `--namespace`
(the namespace of the sessions; default $DEX_HA_NAMESPACE, else the server's default). This module
turns arguments into Client SDK calls and answers into text; `cmd_sessions` finds the
active node first (clear errors), makes the DexClient and turns errors into exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from dex_ha.cli.common import (
    EXIT_NO_NODE,
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandFailed,
    Subparsers,
    dash,
    format_table,
)
from dex_ha.cli.remote import (
    FIND_ACTIVE_TIMEOUT_S,
    find_active,
    refusal,
    token_of,
    urls_of,
)
from dex_ha.client import (
    Attempt,
    DexClient,
    DexError,
    DexUnavailable,
    PendingApproval,
    PendingQuestion,
    Session,
    SessionPage,
    SessionSummary,
    ToolCallRecord,
    Turn,
)
from dex_ha.client.env import NAMESPACE_VAR

# How much of a tool's arguments, output or error one table cell shows.
CELL_CHARS = 60


def add_parser(sub: Subparsers, remote: argparse.ArgumentParser) -> None:
    """The `sessions` command and its subcommands (each takes --url, --token and --json)."""
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print the server's answer as JSON (for scripts)")
    output.add_argument(
        "--namespace",
        help=f"the namespace of the sessions (default: ${NAMESPACE_VAR}, else the server's: default, "
        "or the only namespace of a token limited to one)",
    )
    common = [remote, output]
    sessions = sub.add_parser(
        "sessions",
        help="list, inspect and act on agent sessions",
        description="Look at sessions and act on them: approve or deny a tool call, "
        "answer a question, settle an outcome_unknown call, send a message.",
    )
    actions = sessions.add_subparsers(
        dest="sessions_command", required=True, metavar="{list,show,approve,deny,answer,reconcile,cancel,send,delete}"
    )

    listing = actions.add_parser(
        "list", parents=common, help="sessions, newest first, one page at a time (--all: every page)"
    )
    listing.add_argument("--agent", help="only this agent's sessions")
    listing.add_argument("--status", choices=("idle", "running"), help="only sessions in this status")
    listing.add_argument(
        "--awaiting-approval", action="store_true", help="only sessions with a tool call waiting for approval"
    )
    listing.add_argument(
        "--outcome-unknown", action="store_true", help="only sessions with an outcome_unknown tool call to reconcile"
    )
    listing.add_argument("--limit", type=_page_size, default=50, help="sessions per page, 1..1000 (default 50)")
    listing.add_argument("--after", metavar="CURSOR", help="the page after this cursor (printed under a full page)")
    listing.add_argument("--all", action="store_true", help="follow the cursor through every page")

    show = actions.add_parser(
        "show", parents=common, help="one session: turns, steps and attempts, tool calls, pending approvals/questions"
    )
    show.add_argument("session_id", metavar="SESSION_ID")

    for name, what in (
        ("approve", "run a tool call that waits for approval"),
        ("deny", "refuse a tool call that waits for approval (the model sees the reason)"),
    ):
        decide = actions.add_parser(name, parents=common, help=what)
        decide.add_argument("session_id", metavar="SESSION_ID")
        decide.add_argument("call_id", metavar="CALL_ID")
        decide.add_argument("--reason", help="why (a denial's reason is what the model sees)")

    answer = actions.add_parser("answer", parents=common, help="answer a question the model or a tool asked")
    answer.add_argument("session_id", metavar="SESSION_ID")
    answer.add_argument("question_id", metavar="QUESTION_ID")
    answer.add_argument("answer", metavar="ANSWER", help="the answer text")
    answer.add_argument("--json-value", action="store_true", help="ANSWER is a JSON value, not text")

    reconcile = actions.add_parser(
        "reconcile", parents=common, help="settle a tool call whose outcome is unknown, after checking what happened"
    )
    reconcile.add_argument("session_id", metavar="SESSION_ID")
    reconcile.add_argument("call_id", metavar="CALL_ID")
    reconcile.add_argument("--outcome", required=True, choices=("succeeded", "failed"), help="what really happened")
    reconcile.add_argument("--result", metavar="JSON", help="the tool's output as JSON, when it succeeded")
    reconcile.add_argument("--error", help="the error, when it failed")

    cancel = actions.add_parser("cancel", parents=common, help="cancel the running turn of a session")
    cancel.add_argument("session_id", metavar="SESSION_ID")
    cancel.add_argument("--reason", help="why (kept with the cancelled turn)")

    send = actions.add_parser("send", parents=common, help="send a user message (starts or steers a turn)")
    send.add_argument("session_id", metavar="SESSION_ID")
    send.add_argument("text", metavar="TEXT")
    send.add_argument(
        "--mode",
        choices=("queue", "steer"),
        default="queue",
        help="queue: after the running turn (default); steer: at its next model call",
    )
    send.add_argument("--message-id", help="an id that makes a repeated send a no-op (default: a new one)")
    _add_delete_parser(actions, common)


def _add_delete_parser(actions: Any, common: list[argparse.ArgumentParser]) -> None:
    delete = actions.add_parser(
        "delete",
        parents=common,
        help="delete an ended session and everything of it (a running one: cancel it first)",
    )
    delete.add_argument("session_id", metavar="SESSION_ID")


def _page_size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be from 1 to 1000, got {value}")
    return value


def _json_argument(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{option}: not valid JSON ({exc}): {text!r}") from None


# ---------------------------------------------------------------- running a subcommand


def cmd_sessions(args: argparse.Namespace) -> int:
    """`dex-ha sessions …`: the active node is found first (clear errors), then the Client SDK."""

    async def run_through_active() -> str:
        urls, token = urls_of(args), token_of(args)
        active = await find_active(urls, token)
        candidates = list(dict.fromkeys([active, *urls]))
        async with DexClient(
            candidates, token, namespace=args.namespace, give_up_after_s=FIND_ACTIVE_TIMEOUT_S
        ) as client:
            try:
                return await run(args, client)
            except DexUnavailable as exc:
                raise CommandFailed(exc.message, EXIT_NO_NODE) from None
            except DexError as exc:
                raise CommandFailed(refusal(exc), EXIT_REFUSED) from None
            except (TypeError, ValueError) as exc:  # bad input, named by the SDK or this module
                raise CommandFailed(str(exc), EXIT_USAGE) from None

    print(asyncio.run(run_through_active()))
    return 0


async def run(args: argparse.Namespace, client: DexClient) -> str:
    """Run the subcommand in `args` through `client`; the text to print."""
    command = args.sessions_command
    if command == "list":
        return await _list(args, client)
    if command == "show":
        snapshot = await client.get_session(args.session_id)
        return _json(snapshot.raw) if args.json else format_session(snapshot)
    answer, done = await _act(args, client)
    return _json(answer) if args.json else done


async def _list(args: argparse.Namespace, client: DexClient) -> str:
    async def page_after(after: str | None) -> SessionPage:
        return await client.list_sessions(
            agent=args.agent,
            status=args.status,
            limit=args.limit,
            after=after,
            awaiting_approval=True if args.awaiting_approval else None,
            outcome_unknown=True if args.outcome_unknown else None,
        )

    page = await page_after(args.after)
    sessions = list(page.sessions)
    while args.all and page.next_after:
        page = await page_after(page.next_after)
        sessions += page.sessions
    if args.json:
        return _json({"sessions": [s.raw for s in sessions], "next_after": page.next_after})
    return format_session_list(sessions, page.next_after)


async def _act(args: argparse.Namespace, client: DexClient) -> tuple[Any, str]:
    """The server's answer and one line saying what was done."""
    sid, command = args.session_id, args.sessions_command
    if command in ("approve", "deny"):
        answer = await client.approve(sid, args.call_id, approved=command == "approve", reason=args.reason)
        return answer, f"tool call {args.call_id} of {sid}: {'approved' if command == 'approve' else 'denied'}"
    if command == "answer":
        value = _json_argument(args.answer, "ANSWER") if args.json_value else args.answer
        return await client.answer(sid, args.question_id, value), f"question {args.question_id} of {sid}: answered"
    if command == "reconcile":
        result = _json_argument(args.result, "--result") if args.result is not None else None
        answer = await client.reconcile(sid, args.call_id, args.outcome, result=result, error=args.error)
        return answer, f"tool call {args.call_id} of {sid}: reconciled as {args.outcome}"
    if command == "cancel":
        answer = await client.cancel(sid, reason=args.reason)
        turn = answer.get("cancelled")
        return answer, f"turn {turn} of {sid}: cancelled" if turn else f"{sid}: no turn was running, nothing cancelled"
    if command == "delete":
        return await client.delete(sid), f"session {sid}: deleted"
    if command == "send":
        accepted = await client.send_message(sid, args.text, message_id=args.message_id, mode=args.mode)
        return accepted.raw, f"message {accepted.message_id} sent to {sid} ({args.mode})"
    raise ValueError(f"unknown sessions command {command!r}")


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


# ---------------------------------------------------------------- formatting


def when(ms: Any) -> str:
    """A leader timestamp (ms since the epoch) as UTC time, "-" when there is none."""
    if not isinstance(ms, int | float):
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def short(value: Any, limit: int = CELL_CHARS) -> str:
    """A value on one line, cut to `limit` characters ("-" for None)."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_session_list(sessions: list[SessionSummary], next_after: str | None) -> str:
    rows = [
        [s.session_id, s.agent, s.status, dash(s.turn_count), when(s.created_at), when(s.updated_at)] for s in sessions
    ]
    lines = [
        format_table(["session", "agent", "status", "turns", "created", "updated"], rows) if rows else "no sessions"
    ]
    if next_after:
        lines.append(f"more: dex-ha sessions list --after {next_after}  (or --all)")
    return "\n".join(lines)


def format_session(snapshot: Session) -> str:
    """The snapshot of GET /v1/sessions/{id} as sections of tables, pending decisions last."""
    sid = snapshot.session_id
    sections = [
        f"session {sid}  agent {snapshot.agent}  status {snapshot.status}  "
        f"created {when(snapshot.created_at)}  updated {when(snapshot.updated_at)}",
        _turns_section(snapshot.turns),
        _current_turn_section(snapshot.current_turn),
        _calls_section(snapshot.tool_calls),
        _approvals_section(sid, snapshot.pending_approvals),
        _questions_section(sid, snapshot.pending_questions),
    ]
    if snapshot.waiting_messages:
        sections.append(f"waiting messages: {len(snapshot.waiting_messages)} (they start turns after the running one)")
    return "\n\n".join(section for section in sections if section)


def _turns_section(turns: Sequence[Turn]) -> str:
    rows = [[dash(t.number), t.turn_id, t.status, when(t.started_at), when(t.ended_at), short(t.error)] for t in turns]
    return "turns:\n" + (format_table(["#", "turn", "status", "started", "ended", "error"], rows) if rows else "none")


def _current_turn_section(turn: Turn | None) -> str:
    if turn is None:
        return ""
    rows = [
        [
            step.step_id,
            step.kind,
            step.status,
            short(step.call_id),
            f"{step.attempts_used}/{dash(step.max_attempts)}",
            _attempts_text(step.attempts),
        ]
        for step in turn.steps
    ]
    title = f"current turn {turn.turn_id} ({turn.status}): steps and attempts"
    table = format_table(["step", "kind", "status", "call", "attempts", "attempt: status (worker, error)"], rows)
    return title + "\n" + (table if rows else "no steps yet")


def _attempts_text(attempts: Sequence[Attempt]) -> str:
    parts = []
    for a in attempts:
        detail = ", ".join(x for x in (a.worker_id, short(a.error, 40) if a.error else None) if x)
        parts.append(f"#{a.number} {a.status}" + (f" ({detail})" if detail else ""))
    return "; ".join(parts) or "-"


def _calls_section(calls: Sequence[ToolCallRecord]) -> str:
    rows = [
        [
            c.call_id,
            c.name,
            dash(c.effect),
            c.status,
            str(sum(len(step.attempts) for step in c.steps)),
            short(c.error if c.error else c.output),
        ]
        for c in calls
    ]
    table = format_table(["call", "tool", "effect", "status", "attempts", "output / error"], rows)
    hint = ""
    if any(c.status == "outcome_unknown" for c in calls):
        hint = (
            "\noutcome_unknown: check what the tool did, then "
            "dex-ha sessions reconcile SESSION CALL --outcome succeeded|failed"
        )
    return "tool calls:\n" + (table + hint if rows else "none")


def _approvals_section(sid: str, approvals: Sequence[PendingApproval]) -> str:
    if not approvals:
        return ""
    rows = [[a.call_id, dash(a.name), short(a.arguments), when(a.requested_at)] for a in approvals]
    return (
        "pending approvals (dex-ha sessions approve|deny "
        + sid
        + " CALL):\n"
        + format_table(["call", "tool", "arguments", "requested"], rows)
    )


def _questions_section(sid: str, questions: Sequence[PendingQuestion]) -> str:
    if not questions:
        return ""
    rows = [[q.question_id, dash(q.source), short(q.call_id), short(q.question), when(q.asked_at)] for q in questions]
    return (
        "pending questions (dex-ha sessions answer "
        + sid
        + " QUESTION ANSWER):\n"
        + format_table(["question", "source", "call", "question text", "asked"], rows)
    )
