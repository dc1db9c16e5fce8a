"""Turns (docs/architecture.md, "The engine"): a user message starts one on an idle session; each round
compacts the history if it is over the agent's limit, then calls the model; a response
with tool calls runs them (calls.py) and comes back here; a response without tool calls
completes the turn. A turn ends completed, failed or cancelled, and the next waiting
message (if any) starts the next turn at once.
"""

from __future__ import annotations

from typing import Any

from dex_ha import session_protocol as events
from dex_ha.engine import steps
from dex_ha.engine.context import ApplyContext
from dex_ha.engine.kinds import StepKind
from dex_ha.engine.results import Rejected
from dex_ha.engine.statuses import MessageStatus, SessionStatus, TurnStatus
from dex_ha.engine.store import from_json, to_json
from dex_ha.session_protocol import TURN_ENDED

# What delivering a message reads of it.
_MESSAGE_COLUMNS = "session_id, message_id, text, mode"


def start_next_turn_if_idle(ctx: ApplyContext, session: Any) -> None:
    """`session`: its row, or the part of it with session_id, current_turn_id, turn_count."""
    session_id = session["session_id"]
    if session["current_turn_id"] is not None:
        return
    message = ctx.store.row(
        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND status = 'waiting' ORDER BY seq LIMIT 1",
        (session_id,),
    )
    if message is None:
        return
    turn_id = ctx.ids.new("tu")
    number = session["turn_count"] + 1
    ctx.store.update(
        "sessions",
        {"session_id": session_id},
        status=SessionStatus.RUNNING,
        current_turn_id=turn_id,
        turn_count=number,
        updated_at=ctx.at,
    )
    first_seq = _deliver_message(ctx, message, turn_id, announce=False)  # turn_started says it
    ctx.store.insert(
        "turns",
        turn_id=turn_id,
        session_id=session_id,
        number=number,
        status=TurnStatus.RUNNING,
        message_id=message["message_id"],
        first_seq=first_seq,
        started_at=ctx.at,
    )
    ctx.emit(session_id, events.TurnStarted(turn_id=turn_id, number=number, message_id=message["message_id"]))
    schedule_model_round(ctx, session_id, turn_id)


def deliver_steered_messages(ctx: ApplyContext, session_id: str, turn_id: str) -> None:
    """Steered messages join the history at the next model call of the running turn."""
    for message in ctx.store.rows(
        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND status = 'waiting' "
        "AND mode = 'steer' ORDER BY seq",
        (session_id,),
    ):
        _deliver_message(ctx, message, turn_id, announce=True)


def _deliver_message(ctx: ApplyContext, message: Any, turn_id: str, announce: bool) -> int:
    ctx.store.update(
        "messages",
        {"session_id": message["session_id"], "message_id": message["message_id"]},
        status=MessageStatus.DELIVERED,
        turn_id=turn_id,
    )
    seq = ctx.store.append_history(message["session_id"], turn_id, {"type": "user", "text": message["text"]}, ctx.at)
    if announce:
        ctx.emit(
            message["session_id"],
            events.MessageDelivered(message_id=message["message_id"], turn_id=turn_id, mode=message["mode"]),
        )
    return seq


# ---------------------------------------------------------------- rounds


def schedule_model_round(ctx: ApplyContext, session_id: str, turn_id: str) -> None:
    """Step 2/3 of a turn: CompactContext if the visible history is over the limit, else
    RunModel; nothing once the turn is no longer running."""
    session = ctx.store.session_for_round(session_id, turn_id)
    if session["turn_status"] != TurnStatus.RUNNING:  # cancelled while its last calls finished
        return
    definition = ctx.store.parsed_definition(session["definition"]) or {}
    model_timeout = (definition.get("model") or {}).get("start_to_close_ms")
    cutoff = _compaction_cutoff(ctx, session, turn_id, definition.get("compaction") or {})
    if cutoff is not None:
        seq, tokens = cutoff
        steps.create_step(
            ctx,
            session_id=session_id,
            turn_id=turn_id,
            agent=session["agent"],
            kind=StepKind.COMPACT_CONTEXT,
            params={"upto_seq": seq, "upto_tokens": tokens},
            start_to_close_ms=model_timeout,
        )
    else:
        steps.create_step(
            ctx,
            session_id=session_id,
            turn_id=turn_id,
            agent=session["agent"],
            kind=StepKind.RUN_MODEL,
            start_to_close_ms=model_timeout,
        )


def _compaction_cutoff(ctx: ApplyContext, session: Any, turn_id: str, limits: dict[str, Any]) -> tuple[int, int] | None:
    """(seq, cumulative tokens) to summarise up to, or None when no compaction is due.

    Everything before the current turn's user message is summarised; when that is already
    summarised, everything but the latest item. The model always sees the latest item, and
    a cut never separates tool results from the assistant message that made the calls.
    """
    visible_items = session["history_count"] - session["summary_upto_seq"]
    visible_tokens = session["history_tokens"] - session["summary_upto_tokens"]
    over = (limits.get("max_items") and visible_items > limits["max_items"]) or (
        limits.get("max_tokens") and visible_tokens > limits["max_tokens"]
    )
    if not over:
        return None
    turn_start = ctx.store.scalar("SELECT first_seq FROM turns WHERE turn_id = ?", (turn_id,))
    cutoff = turn_start - 1
    if cutoff <= session["summary_upto_seq"]:
        cutoff = session["history_count"] - 1
    cutoff = _before_results(ctx, session, cutoff)
    if cutoff <= session["summary_upto_seq"]:
        return None
    tokens_after = ctx.store.scalar(
        "SELECT COALESCE(SUM(tokens), 0) FROM history WHERE session_id = ? AND seq > ?", (session["session_id"], cutoff)
    )
    return cutoff, session["history_tokens"] - tokens_after


def _before_results(ctx: ApplyContext, session: Any, cutoff: int) -> int:
    """`cutoff`, moved back while the item after it is a tool result, so the summary ends
    before the assistant message whose calls those results answer (a model input that
    starts with a result, its call summarised away, is one model APIs refuse)."""
    results = {
        row[0]
        for row in ctx.store.rows(
            "SELECT seq FROM history WHERE session_id = ? AND seq > ? AND seq <= ? "
            "AND json_extract(item, '$.type') = 'tool_result'",
            (session["session_id"], session["summary_upto_seq"], cutoff + 1),
        )
    }
    while cutoff > session["summary_upto_seq"] and cutoff + 1 in results:
        cutoff -= 1
    return cutoff


def record_summary(ctx: ApplyContext, step: Any, result: dict[str, Any]) -> None:
    """A committed CompactContext result replaces the session's one summary."""
    summary = result.get("summary")
    if not isinstance(summary, str):
        raise Rejected("invalid", "result.summary must be a string")
    params = from_json(step["params"])
    ctx.store.set_summary(step["session_id"], summary, params["upto_seq"], params["upto_tokens"], ctx.at)
    ctx.emit(
        step["session_id"],
        events.SummaryUpdated(turn_id=step["turn_id"], step_id=step["step_id"], upto_seq=params["upto_seq"]),
    )
    schedule_model_round(ctx, step["session_id"], step["turn_id"])


# ---------------------------------------------------------------- notes


def add_note(ctx: ApplyContext, session_id: str, text: str) -> None:
    """A note for the model. While a model response's tool calls run, the history ends with
    that assistant message and its results come next: a note now would split them (model
    APIs refuse that), so it is held and goes in right after the results (`release_notes`)."""
    session = ctx.store.require_session(session_id)
    turn_id = session["current_turn_id"]
    note = {"type": "note", "text": text}
    if turn_id is not None and ctx.store.scalar(
        "SELECT 1 FROM tool_calls WHERE turn_id = ? AND status = 'pending' LIMIT 1", (turn_id,)
    ):
        ctx.store.insert("held_notes", session_id=session_id, position=ctx.ids.queue_position(), item=to_json(note))
    else:
        ctx.store.append_history(session_id, turn_id, note, ctx.at)


def release_notes(ctx: ApplyContext, session_id: str, turn_id: str) -> None:
    """Append the notes held while the calls ran, in the order they came (after the results)."""
    held = ctx.store.rows("SELECT position, item FROM held_notes WHERE session_id = ? ORDER BY position", (session_id,))
    if held:
        ctx.store.append_history(session_id, turn_id, [from_json(row["item"]) for row in held], ctx.at)
        ctx.store.conn.execute("DELETE FROM held_notes WHERE session_id = ?", (session_id,))


# ---------------------------------------------------------------- endings


def fail_turn(ctx: ApplyContext, session_id: str, turn_id: str, error: str) -> None:
    """The turn fails; if tools already ran in it, a note tells the next turn's model."""
    ran = ctx.store.rows(
        "SELECT call_id, name, status FROM tool_calls WHERE turn_id = ? AND ran = 1 "
        "ORDER BY created_at, response_step_id, position",
        (turn_id,),
    )
    if ran:
        listed = "; ".join(f"{c['name']} (call {c['call_id']}): {c['status']}" for c in ran)
        text = (
            f"The previous turn failed ({error}). These tool calls already ran in it, so do not repeat them: {listed}."
        )
        add_note(ctx, session_id, text)
    end_turn(ctx, session_id, turn_id, TurnStatus.FAILED, error)


def end_turn(ctx: ApplyContext, session_id: str, turn_id: str, status: TurnStatus, error: str | None = None) -> None:
    release_notes(ctx, session_id, turn_id)  # none is left once the calls have their results; never held past a turn
    ctx.store.update("turns", {"turn_id": turn_id}, status=status, ended_at=ctx.at, error=error)
    session = ctx.store.row(
        "UPDATE sessions SET status = 'idle', current_turn_id = NULL, updated_at = ? "
        "WHERE session_id = ? RETURNING session_id, current_turn_id, turn_count",
        (ctx.at, session_id),
    )
    ctx.emit(session_id, TURN_ENDED[status](turn_id=turn_id, error=error))
    start_next_turn_if_idle(ctx, session)
