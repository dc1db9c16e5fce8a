"""`dex-ha sessions …`: look at sessions and act on them from a terminal.

    dex-ha sessions list [--agent A] [--status idle|running] [--awaiting-approval] [--outcome-unknown]
                         [--limit N] [--after CURSOR] [--all]
    dex-ha sessions show SESSION_ID [--history N]
    dex-ha sessions approve SESSION_ID CALL_ID [--reason TEXT]
    dex-ha sessions deny SESSION_ID CALL_ID [--reason TEXT]
    dex-ha sessions answer SESSION_ID QUESTION_ID ANSWER [--json-value]
    dex-ha sessions reconcile SESSION_ID CALL_ID --outcome succeeded|failed [--result JSON] [--error TEXT]
    dex-ha sessions send SESSION_ID TEXT [--mode queue|steer] [--message-id ID]
    dex-ha sessions delete SESSION_ID
    dex-ha sessions watch SESSION_ID [--until-idle]

Every subcommand takes `--json` (the server's answer as JSON, for scripts; for `watch`, each
event as one JSON object a line) and `--namespace`
(the namespace of the sessions; default $DEX_HA_NAMESPACE, else the server's default). This module
turns arguments into Client SDK calls and answers into text; `cmd_sessions` finds the
active node first (clear errors), makes the DexClient and turns errors into exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from typing import Any

from dex_ha.cli import watch
from dex_ha.cli.common import (
    CELL_CHARS,
    EXIT_NO_NODE,
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandFailed,
    Subparsers,
    dash,
    format_table,
    non_negative_int,
    short,
    when,
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
    Step,
    ToolCallRecord,
    Turn,
)
from dex_ha.client.env import NAMESPACE_VAR

# How much of a tool's input, output or error one conversation line shows (--json: all of it).
CONVERSATION_VALUE_CHARS = 1000
# How many of the latest conversation items `sessions show` prints by default.
DEFAULT_HISTORY_ITEMS = 50


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
        "answer a question, settle an outcome_unknown call, send a message, follow its events.",
    )
    actions = sessions.add_subparsers(
        dest="sessions_command",
        required=True,
        metavar="{list,show,approve,deny,answer,reconcile,cancel,send,delete,watch}",
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
        "show",
        parents=common,
        help="one session: its conversation, every turn with its steps and attempts, tool calls, "
        "pending approvals and questions",
        description="Print one session: a header (agent, status, created, updated); the conversation in "
        "order (the compaction summary if the history was compacted, user messages, the assistant's text, "
        "each tool call with its input, each tool's output or error, messages waiting for a turn), the "
        "latest --history items of it; every turn with its steps (kind, status, the tool call and its "
        "outcome) and each step's attempts (status, worker, term, start, duration, error); the tool calls; "
        "the approvals and questions that wait for an answer. Times are UTC (marked Z). "
        f"A tool input, output or error longer than {CONVERSATION_VALUE_CHARS} characters is cut (table cells: "
        f"{CELL_CHARS}); --json prints everything as the server sent it.",
    )
    show.add_argument("session_id", metavar="SESSION_ID")
    show.add_argument(
        "--history",
        type=non_negative_int,
        default=DEFAULT_HISTORY_ITEMS,
        metavar="N",
        help=f"show the latest N items of the conversation and say how many earlier ones are left out "
        f"(default {DEFAULT_HISTORY_ITEMS}; 0: every item)",
    )

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
    watch.add_arguments(
        actions.add_parser(
            "watch",
            parents=common,
            help="follow a session's events live, one line each (--json: one JSON object a line), until Ctrl-C",
            description="Print the session's events since it was created, then each new one as it "
            "happens, one line each: the time (UTC), the event type and its essentials. The live text "
            "of a model is condensed into one line per attempt. It follows the active node through a "
            "failover. With --json, each event is printed as it came, as one JSON object a line.",
        )
    )


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

    text = asyncio.run(run_through_active())
    if text:  # `watch` printed its lines as they came
        print(text)
    return 0


async def run(args: argparse.Namespace, client: DexClient) -> str:
    """Run the subcommand in `args` through `client`; the text to print."""
    command = args.sessions_command
    if command == "list":
        return await _list(args, client)
    if command == "watch":
        await watch.watch_session(args, client, _print_now)
        return ""
    if command == "show":
        snapshot = await client.get_session(args.session_id)
        return _json(snapshot.raw) if args.json else format_session(snapshot, history=args.history)
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


def _print_now(line: str) -> None:
    print(line, flush=True)  # at once, also into a pipe: the reader follows the session live


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


# ---------------------------------------------------------------- formatting


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


def format_session(snapshot: Session, history: int = DEFAULT_HISTORY_ITEMS) -> str:
    """The snapshot of GET /v1/sessions/{id}: the conversation (its latest `history` items; 0:
    all), every turn with its steps and attempts, tool calls, then the pending decisions."""
    sid = snapshot.session_id
    sections = [
        f"session {sid}  agent {snapshot.agent}  status {snapshot.status}  "
        f"created {when(snapshot.created_at)}  updated {when(snapshot.updated_at)}  (times UTC)",
        _conversation_section(snapshot, history),
        _turns_section(snapshot.turns, {c.call_id: c for c in snapshot.tool_calls}),
        _calls_section(snapshot.tool_calls),
        _approvals_section(sid, snapshot.pending_approvals),
        _questions_section(sid, snapshot.pending_questions),
    ]
    return "\n\n".join(section for section in sections if section)


def _conversation_section(snapshot: Session, history: int) -> str:
    """The history as stored, in order: the summary first when it was compacted, then the
    latest `history` items (0: all), then the messages that wait for a turn."""
    items = snapshot.history
    shown = items[-history:] if history else items
    lines = [f"conversation ({len(items)} items):"]
    if len(shown) < len(items):
        lines.append(f"  … {len(items) - len(shown)} earlier items not shown (--history N shows more; 0: all)")
    if snapshot.summary:
        summary = snapshot.summary
        lines.append(f"summary of the items up to #{dash(summary.get('upto_seq'))} ({when(summary.get('at'))}):")
        lines.append(_indented(summary.get("text")))
    lines += [_history_item(item) for item in shown]
    lines += [
        f"waiting ({m.get('mode')}) since {when(m.get('at'))}, not in a turn yet:\n{_indented(m.get('text'))}"
        for m in snapshot.waiting_messages
    ]
    if not items and not snapshot.waiting_messages:
        lines.append("no messages yet")
    return "\n".join(lines)


def _history_item(item: dict[str, Any]) -> str:
    """One conversation item: who, then what (texts whole, tool values cut at CONVERSATION_VALUE_CHARS)."""
    seq, kind = f"#{dash(item.get('seq'))}", item.get("type")
    if kind == "user":
        return f"{seq} user:\n{_indented(item.get('text'))}"
    if kind == "assistant":
        lines = [f"{seq} assistant:"]
        if item.get("content"):
            lines.append(_indented(item["content"]))
        lines += [
            f"  calls {call.get('name')} (call {call.get('id')}) with input "
            f"{short(call.get('arguments'), CONVERSATION_VALUE_CHARS)}"
            for call in item.get("tool_calls") or []
        ]
        return "\n".join(lines)
    if kind == "tool_result":
        head = f"{seq} tool {item.get('name')} (call {item.get('call_id')}) {item.get('status')}"
        if item.get("error") is not None:
            return f"{head}, error: {short(item['error'], CONVERSATION_VALUE_CHARS)}"
        return f"{head}, output: {short(item.get('output'), CONVERSATION_VALUE_CHARS)}"
    if kind == "note":
        return f"{seq} note:\n{_indented(item.get('text'))}"
    return f"{seq} {kind}: {short(item, CONVERSATION_VALUE_CHARS)}"


def _indented(text: Any) -> str:
    """A text (or a JSON value) whole, each of its lines indented under its heading."""
    if text is None:
        return "  -"
    value = text if isinstance(text, str) else json.dumps(text, sort_keys=True)
    return "\n".join("  " + line for line in value.splitlines() or [""])


def _turns_section(turns: Sequence[Turn], calls: dict[str, ToolCallRecord]) -> str:
    if not turns:
        return "turns: none"
    return f"turns ({len(turns)}):\n" + "\n\n".join(_turn_text(turn, calls) for turn in turns)


def _turn_text(turn: Turn, calls: dict[str, ToolCallRecord]) -> str:
    """A turn's line, then a table of its steps, one row per attempt (a step's columns on its first)."""
    head = f"turn {dash(turn.number)} {turn.turn_id}  {turn.status}  started {when(turn.started_at)}  ended {when(turn.ended_at)}"
    if turn.error:
        head += f"  error: {short(turn.error)}"
    rows = [row for step in turn.steps for row in _step_rows(step, calls.get(step.call_id or ""))]
    headers = [
        "step",
        "kind",
        "status",
        "call",
        "outcome",
        "attempts",
        "attempt",
        "worker (term)",
        "started",
        "took",
        "error",
    ]
    return head + "\n" + (_indented(format_table(headers, rows)) if rows else "  no steps yet")


def _step_rows(step: Step, call: ToolCallRecord | None) -> list[list[str]]:
    outcome = call.status if call is not None else "-"
    first = [
        step.step_id,
        step.kind,
        step.status,
        dash(step.call_id),
        outcome,
        f"{step.attempts_used}/{dash(step.max_attempts)}",
    ]
    blank = [""] * len(first)
    if not step.attempts:
        return [[*first, "-", "-", "-", "-", short(step.error)]]
    return [[*(blank if i else first), *_attempt_cells(a)] for i, a in enumerate(step.attempts)]


def _attempt_cells(a: Attempt) -> list[str]:
    worker = f"{a.worker_id or '-'} (term {dash(a.term)})"
    progress = a.raw.get("attempt_progress")
    error = short(a.error, 40) + (f" [{progress}]" if progress else "") if a.error else dash(progress)
    return [f"#{a.number} {a.status}", worker, when(a.started_at), _took(a.started_at, a.ended_at), error]


def _took(started_at: int | None, ended_at: int | None) -> str:
    """How long something ran, "-" while it runs."""
    if started_at is None or ended_at is None:
        return "-"
    ms = ended_at - started_at
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


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
