"""Tool calls: from a committed model response to one final outcome per call.

A call's route: built-in `ask_user` → AwaitQuestionAnswer; built-in `sleep` → AwaitTimer;
a tool no registered agent defines → failed NOT_STARTED; an inline tool → recorded with
the model step (it ran inside RunModel); `approval` → AwaitToolApproval first; then
CallTool / CallSingleAttemptTool by effect. A tool may answer with a question
(→ AwaitQuestionAnswer, then it runs again with `answer`) or a task handle
(→ AwaitTimer and PollToolTask on the same handle until ok or error).

When every call of a model response has its outcome, the tool results go into the
history in call order and the turn goes back to the model (`turns.schedule_model_round`).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from dex_ha import session_protocol as events
from dex_ha.engine import steps, turns
from dex_ha.engine.agents import ASK_USER, SLEEP, ToolPolicy, tool_policy
from dex_ha.engine.context import ApplyContext
from dex_ha.engine.kinds import (
    MAX_DURATION_MS,
    StepKind,
    max_attempts_for,
    not_run_error,
    tool_outcome_on_exhaustion,
    tool_step_kind,
)
from dex_ha.engine.results import Rejected
from dex_ha.engine.statuses import (
    FINAL_CALL_STATUSES,
    ApprovalStatus,
    AttemptProgress,
    CallStatus,
    QuestionStatus,
    TimerPurpose,
    ToolResultStatus,
    TurnStatus,
)
from dex_ha.engine.store import from_json, to_json

DEFAULT_POLL_AFTER_MS = 1_000
MAX_TOOL_CALLS_PER_RESPONSE = 1_000  # keeps one entry's events within its event-id range
# A tool_calls row: read from the table, or the dict just inserted into it.
CallRow = sqlite3.Row | dict[str, Any]
NO_ANSWER = object()  # marks "the tool did not ask", as opposed to an answer of null


# ---------------------------------------------------------------- model response


def record_model_response(ctx: ApplyContext, step: sqlite3.Row, result: dict[str, Any]) -> None:
    """A RunModel result: the assistant message, then one call per tool call."""
    content, tool_calls = _validate_model_result(ctx, step["session_id"], result)
    if isinstance(result.get("usage"), dict):
        ctx.store.update("steps", {"step_id": step["step_id"]}, usage=to_json(result["usage"]))
    message = {
        "type": "assistant",
        "content": content,
        "tool_calls": [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in tool_calls],
    }
    ctx.store.append_history(step["session_id"], step["turn_id"], message, ctx.at)
    ctx.emit(
        step["session_id"],
        events.AssistantMessage(
            turn_id=step["turn_id"], step_id=step["step_id"], content=content, tool_calls=message["tool_calls"]
        ),
    )
    if not tool_calls:
        turns.end_turn(ctx, step["session_id"], step["turn_id"], TurnStatus.COMPLETED)
        return
    definition = ctx.store.warm_agent_definition(step["agent"])
    policies = [tool_policy(definition, c["name"]) for c in tool_calls]
    # Insert every call before routing any: a call that ends at once must not see its
    # response as complete while its siblings do not exist yet.
    rows = [
        _insert_call(ctx, step, position, call, policy)
        for position, (call, policy) in enumerate(zip(tool_calls, policies))
    ]
    for row, call, policy in zip(rows, tool_calls, policies):
        _route_call(ctx, row, policy, call)


def _validate_model_result(
    ctx: ApplyContext, session_id: str, result: dict[str, Any]
) -> tuple[Any, list[dict[str, Any]]]:
    tool_calls = result.get("tool_calls") or []
    if not isinstance(tool_calls, list):
        raise Rejected("invalid", "result.tool_calls must be a list")
    if len(tool_calls) > MAX_TOOL_CALLS_PER_RESPONSE:
        raise Rejected("invalid", f"result.tool_calls: at most {MAX_TOOL_CALLS_PER_RESPONSE} calls")
    seen: set[str] = set()
    normalized = []
    for i, call in enumerate(tool_calls):
        where = f"result.tool_calls[{i}]"
        if not isinstance(call, dict):
            raise Rejected("invalid", f"{where} must be an object")
        call_id, name, arguments = call.get("id"), call.get("name"), call.get("arguments", {})
        if not isinstance(call_id, str) or not call_id:
            raise Rejected("invalid", f"{where}.id must be a non-empty string")
        if not isinstance(name, str) or not name:
            raise Rejected("invalid", f"{where}.name must be a non-empty string")
        if not isinstance(arguments, dict):
            raise Rejected("invalid", f"{where}.arguments must be an object")
        if call_id in seen:
            raise Rejected("invalid", f"{where}.id {call_id!r} is used twice")
        seen.add(call_id)
        normalized.append({**call, "arguments": arguments})
    return result.get("content"), normalized


def _insert_call(
    ctx: ApplyContext, step: sqlite3.Row, position: int, call: dict[str, Any], policy: ToolPolicy | None
) -> dict[str, Any]:
    """Insert the call; returns the row as inserted (the routing reads it, not the table)."""
    row = dict(
        session_id=step["session_id"],
        call_id=call["id"],
        turn_id=step["turn_id"],
        agent=step["agent"],
        response_step_id=step["step_id"],
        position=position,
        name=call["name"],
        arguments=to_json(call["arguments"]),
        policy=to_json(policy.as_json() if policy else None),
        effect=policy.effect if policy else None,
        status=CallStatus.PENDING,
        created_at=ctx.at,
    )
    try:
        ctx.store.insert("tool_calls", **row)
    except sqlite3.IntegrityError:
        raise Rejected("invalid", f"tool call id {call['id']!r} is already used in this session") from None
    return row


def _route_call(ctx: ApplyContext, call: dict[str, Any], policy: ToolPolicy | None, raw: dict[str, Any]) -> None:
    name, arguments = call["name"], from_json(call["arguments"])
    if policy is None:
        finish_call(
            ctx,
            call,
            CallStatus.FAILED,
            progress=AttemptProgress.NOT_STARTED,
            error=not_run_error(f"no registered agent defines the tool {name!r}"),
        )
    elif name == ASK_USER:
        ask_question(ctx, call, "ask_user", arguments.get("question", arguments))
    elif name == SLEEP:
        _start_sleep(ctx, call, arguments)
    elif policy.inline:
        _record_inline_result(ctx, call, raw.get("result"))
    elif policy.approval:
        _request_approval(ctx, call)
    else:
        queue_tool_step(ctx, call)


def _start_sleep(ctx: ApplyContext, call: CallRow, arguments: dict[str, Any]) -> None:
    ms = arguments.get("ms")
    if not isinstance(ms, int) or isinstance(ms, bool) or not 0 <= ms <= MAX_DURATION_MS:
        finish_call(
            ctx,
            call,
            CallStatus.FAILED,
            progress=AttemptProgress.NOT_STARTED,
            error=not_run_error(f"sleep needs `ms`, an integer from 0 to {MAX_DURATION_MS} (ten years)"),
        )
        return
    step_id = _create_call_step(ctx, call, StepKind.AWAIT_TIMER)
    steps.set_timer(ctx, _step_ref(call, step_id), TimerPurpose.SLEEP, ctx.at + ms)


def _record_inline_result(ctx: ApplyContext, call: CallRow, result: Any) -> None:
    """An inline tool ran inside the model call (at-least-once); it has no step of its own."""
    ctx.store.update("tool_calls", _key(call), ran=1, step_id=call["response_step_id"])
    status = result.get("status") if isinstance(result, dict) else None
    if status == ToolResultStatus.OK:
        finish_call(ctx, call, CallStatus.SUCCEEDED, output=result.get("output"))
    elif status == ToolResultStatus.ERROR:
        finish_call(ctx, call, CallStatus.FAILED, error=str(result.get("error")))
    else:
        finish_call(ctx, call, CallStatus.FAILED, error="the Worker reported no result for this inline tool")


def _request_approval(ctx: ApplyContext, call: CallRow) -> None:
    step_id = _create_call_step(ctx, call, StepKind.AWAIT_TOOL_APPROVAL)
    ctx.store.insert(
        "approvals",
        session_id=call["session_id"],
        call_id=call["call_id"],
        step_id=step_id,
        status=ApprovalStatus.PENDING,
        requested_at=ctx.at,
    )
    ctx.emit(
        call["session_id"],
        events.ApprovalRequested(call_id=call["call_id"], name=call["name"], arguments=from_json(call["arguments"])),
    )


def queue_tool_step(ctx: ApplyContext, call: CallRow, answer: Any = NO_ANSWER) -> str:
    """Queue the call's tool for a Worker, under the policy recorded on the call; with
    `answer` when the tool asked a question (a JSON null is an answer too)."""
    policy = from_json(call["policy"])
    kind = tool_step_kind(call["effect"])
    params: dict[str, Any] = {
        "call_id": call["call_id"],
        "name": call["name"],
        "arguments": from_json(call["arguments"]),
    }
    if answer is not NO_ANSWER:
        params["answer"] = answer
    return _create_call_step(
        ctx,
        call,
        kind,
        params=params,
        max_attempts=max_attempts_for(kind, policy["max_attempts"]),
        start_to_close_ms=policy["start_to_close_ms"],
    )


def queue_poll(ctx: ApplyContext, call: CallRow) -> str:
    params = {"call_id": call["call_id"], "name": call["name"], "handle": from_json(call["handle"])}
    return _create_call_step(ctx, call, StepKind.POLL_TOOL_TASK, params=params)


def ask_question(ctx: ApplyContext, call: CallRow, source: str, question: Any) -> None:
    step_id = _create_call_step(ctx, call, StepKind.AWAIT_QUESTION_ANSWER)
    question_id = ctx.ids.new("q")
    ctx.store.insert(
        "questions",
        question_id=question_id,
        session_id=call["session_id"],
        call_id=call["call_id"],
        step_id=step_id,
        source=source,
        question=to_json(question),
        status=QuestionStatus.PENDING,
        asked_at=ctx.at,
    )
    ctx.emit(
        call["session_id"],
        events.QuestionAsked(question_id=question_id, call_id=call["call_id"], source=source, question=question),
    )


def _create_call_step(ctx: ApplyContext, call: CallRow, kind: StepKind, **kwargs: Any) -> str:
    return steps.create_step(
        ctx,
        session_id=call["session_id"],
        turn_id=call["turn_id"],
        agent=call["agent"],
        kind=kind,
        call_id=call["call_id"],
        **kwargs,
    )


def _step_ref(call: CallRow, step_id: str) -> dict[str, Any]:
    return {"session_id": call["session_id"], "turn_id": call["turn_id"], "step_id": step_id}


def _key(call: CallRow) -> dict[str, Any]:
    return {"session_id": call["session_id"], "call_id": call["call_id"]}


# ---------------------------------------------------------------- tool results


def record_tool_result(ctx: ApplyContext, step: sqlite3.Row, result: dict[str, Any]) -> None:
    """A CallTool / CallSingleAttemptTool result: ok, error, question or task."""
    status = result.get("status")
    if status == ToolResultStatus.OK:  # the step names the call: finish_call needs no more of it
        finish_call(ctx, step, CallStatus.SUCCEEDED, output=result.get("output"))
    elif status == ToolResultStatus.ERROR:
        finish_call(ctx, step, CallStatus.FAILED, error=str(result.get("error")))
    elif status == ToolResultStatus.QUESTION:
        ask_question(ctx, ctx.store.require_call(step["session_id"], step["call_id"]), "tool", result.get("question"))
    elif status == ToolResultStatus.TASK:
        _start_task(ctx, ctx.store.require_call(step["session_id"], step["call_id"]), result)
    else:
        raise Rejected("invalid", "result.status must be ok, error, question or task")


def _start_task(ctx: ApplyContext, call: CallRow, result: dict[str, Any]) -> None:
    if result.get("handle") is None:
        raise Rejected("invalid", "result.handle is required when status is task")
    poll_after = _poll_after(result, DEFAULT_POLL_AFTER_MS)
    ctx.store.update("tool_calls", _key(call), handle=to_json(result["handle"]), poll_after_ms=poll_after)
    ctx.emit(call["session_id"], events.ToolTaskStarted(call_id=call["call_id"], handle=result["handle"]))
    _wait_before_poll(ctx, call, poll_after)


def record_poll_result(ctx: ApplyContext, step: sqlite3.Row, result: dict[str, Any]) -> None:
    """A PollToolTask result: pending (poll again later), ok or error."""
    call = ctx.store.require_call(step["session_id"], step["call_id"])
    status = result.get("status")
    if status == ToolResultStatus.PENDING:
        poll_after = _poll_after(result, call["poll_after_ms"] or DEFAULT_POLL_AFTER_MS)
        ctx.store.update("tool_calls", _key(call), poll_after_ms=poll_after)
        _wait_before_poll(ctx, call, poll_after)
    elif status == ToolResultStatus.OK:
        finish_call(ctx, call, CallStatus.SUCCEEDED, output=result.get("output"))
    elif status == ToolResultStatus.ERROR:
        finish_call(ctx, call, CallStatus.FAILED, error=str(result.get("error")))
    else:
        raise Rejected("invalid", "a poll result's status must be pending, ok or error")


def _poll_after(result: dict[str, Any], default: int) -> int:
    value = result.get("poll_after_ms", default)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_DURATION_MS:
        raise Rejected("invalid", f"result.poll_after_ms must be an integer from 0 to {MAX_DURATION_MS} (ten years)")
    return value


def _wait_before_poll(ctx: ApplyContext, call: CallRow, delay_ms: int) -> None:
    step_id = _create_call_step(ctx, call, StepKind.AWAIT_TIMER)
    steps.set_timer(ctx, _step_ref(call, step_id), TimerPurpose.POLL, ctx.at + delay_ms)


# ---------------------------------------------------------------- outcomes


def finish_call(
    ctx: ApplyContext,
    call: CallRow,
    status: CallStatus,
    *,
    output: Any = None,
    error: str | None = None,
    progress: AttemptProgress | None = None,
) -> None:
    """Record the call's one final outcome; the last call of a response moves the turn on.
    `call` needs only its key (session_id, call_id): the rest comes back from the UPDATE."""
    assert status in FINAL_CALL_STATUSES, status
    finished = ctx.store.row(
        "UPDATE tool_calls SET status = ?, output = ?, error = ?, attempt_progress = ?, ended_at = ? "
        "WHERE session_id = ? AND call_id = ? RETURNING name, response_step_id, turn_id",
        (
            status,
            None if output is None else to_json(output),
            error,
            progress,
            ctx.at,
            call["session_id"],
            call["call_id"],
        ),
    )
    if finished is None:
        raise Rejected("not_found", f"session {call['session_id']} has no tool call {call['call_id']}")
    ctx.bump(f"tool_calls.{status}")
    ctx.emit(
        call["session_id"],
        events.ToolCallFinished(
            call_id=call["call_id"],
            name=finished["name"],
            status=status,
            output=output,
            error=error,
            attempt_progress=progress,
        ),
    )
    _finish_response_if_done(ctx, finished["response_step_id"], call["session_id"], finished["turn_id"])


def _finish_response_if_done(ctx: ApplyContext, response_step_id: str, session_id: str, turn_id: str) -> None:
    response = ctx.store.rows(
        "SELECT call_id, name, status, output, error FROM tool_calls WHERE response_step_id = ? ORDER BY position",
        (response_step_id,),
    )
    if any(call["status"] == CallStatus.PENDING for call in response):
        return
    ctx.store.append_history(session_id, turn_id, [tool_result_item(call) for call in response], ctx.at)
    turns.release_notes(ctx, session_id, turn_id)
    turns.schedule_model_round(ctx, session_id, turn_id)  # unless the turn was cancelled meanwhile


def tool_result_item(call: CallRow) -> dict[str, Any]:
    """The history item the model sees for a call with an outcome."""
    item = {"type": "tool_result", "call_id": call["call_id"], "name": call["name"], "status": call["status"]}
    if call["status"] == CallStatus.SUCCEEDED:
        item["output"] = from_json(call["output"])
    else:
        item["error"] = call["error"]
    return item


def cancel_pending_calls(ctx: ApplyContext, turn_id: str) -> None:
    """Cancel: each open call records its outcome by whether its tool may have run."""
    for call in ctx.store.rows(
        "SELECT * FROM tool_calls WHERE turn_id = ? AND status = 'pending' ORDER BY response_step_id, position",
        (turn_id,),
    ):
        if call["ran"]:
            status = tool_outcome_on_exhaustion(call["effect"], AttemptProgress.NOT_COMPLETED)
            error = (
                "the turn was cancelled while the tool ran"
                if status == CallStatus.FAILED
                else "the outcome is unknown: the turn was cancelled while the tool ran; it will not run again"
            )
            finish_call(ctx, call, status, error=error, progress=AttemptProgress.NOT_COMPLETED)
        else:
            finish_call(
                ctx,
                call,
                CallStatus.FAILED,
                error=not_run_error("the turn was cancelled"),
                progress=AttemptProgress.NOT_STARTED,
            )


# ---------------------------------------------------------------- decisions


def decide_approval(ctx: ApplyContext, session_id: str, call_id: str, approved: bool, reason: str | None) -> bool:
    """Returns False when the same decision was already recorded (an ok no-op)."""
    approval = ctx.store.approval(session_id, call_id)
    if approval is None:
        raise Rejected("not_found", f"call {call_id} of session {session_id} awaits no approval")
    decided = {ApprovalStatus.APPROVED: True, ApprovalStatus.DENIED: False}.get(approval["status"])
    if approval["status"] == ApprovalStatus.CANCELLED:
        raise Rejected("conflict", f"call {call_id}: its turn was cancelled")
    if decided is not None:
        if decided == approved:
            return False
        raise Rejected("conflict", f"call {call_id} was already {approval['status']}")
    ctx.store.update(
        "approvals",
        {"session_id": session_id, "call_id": call_id},
        status=ApprovalStatus.APPROVED if approved else ApprovalStatus.DENIED,
        reason=reason,
        decided_at=ctx.at,
    )
    steps.end_wait_step(ctx, approval["step_id"])
    ctx.emit(session_id, events.ApprovalDecided(call_id=call_id, approved=approved, reason=reason))
    call = ctx.store.require_call(session_id, call_id)
    if approved:
        queue_tool_step(ctx, call)
    else:
        finish_call(
            ctx,
            call,
            CallStatus.FAILED,
            progress=AttemptProgress.NOT_STARTED,
            # It never ran, so it carries the not-run prefix as every NOT_STARTED call does;
            # the reason follows, so the model sees why the user refused it.
            error=not_run_error("the user denied the tool call" + (f": {reason}" if reason else "")),
        )
    return True


def answer_question(ctx: ApplyContext, session_id: str, question_id: str, answer: Any) -> bool:
    """Returns False when the same answer was already recorded (an ok no-op)."""
    question = ctx.store.question(question_id)
    if question is None or question["session_id"] != session_id:
        raise Rejected("not_found", f"session {session_id} has no question {question_id}")
    if question["status"] == QuestionStatus.CANCELLED:
        raise Rejected("conflict", f"question {question_id}: its turn was cancelled")
    if question["status"] == QuestionStatus.ANSWERED:
        if question["answer"] == to_json(answer):
            return False
        raise Rejected("conflict", f"question {question_id} already has a different answer")
    ctx.store.update(
        "questions",
        {"question_id": question_id},
        status=QuestionStatus.ANSWERED,
        answer=to_json(answer),
        answered_at=ctx.at,
    )
    steps.end_wait_step(ctx, question["step_id"])
    ctx.emit(session_id, events.QuestionAnswered(question_id=question_id, call_id=question["call_id"], answer=answer))
    call = ctx.store.require_call(session_id, question["call_id"])
    if question["source"] == "ask_user":
        finish_call(ctx, call, CallStatus.SUCCEEDED, output=answer)
    else:  # the tool that asked runs again, with the answer in its input
        queue_tool_step(ctx, call, answer=answer)
    return True


def reconcile(ctx: ApplyContext, session_id: str, call_id: str, outcome: str, result: Any, error: str | None) -> bool:
    """Settle an outcome_unknown call. Returns False for a repeat of the same settlement."""
    call = ctx.store.require_call(session_id, call_id)
    if outcome == CallStatus.FAILED:
        output, error = None, error or "reconciled as failed by an operator"
    else:
        output, error = (None if result is None else to_json(result)), None
    if call["reconciled_at"] is not None:
        if (call["status"], call["output"], call["error"]) == (outcome, output, error):
            return False
        raise Rejected("conflict", f"call {call_id} was already reconciled as {call['status']}")
    if call["status"] != CallStatus.OUTCOME_UNKNOWN:
        raise Rejected(
            "conflict", f"only an outcome_unknown call can be reconciled; call {call_id} is {call['status']}"
        )
    ctx.bump(f"tool_calls.{outcome}")
    ctx.store.update("tool_calls", _key(call), status=outcome, output=output, error=error, reconciled_at=ctx.at)
    note = (
        f"Tool call {call_id} ({call['name']}), whose outcome was unknown, was reconciled "
        f"by an operator: {outcome}" + (f" ({error})" if outcome == CallStatus.FAILED else "") + "."
    )
    turns.add_note(ctx, session_id, note)
    ctx.emit(session_id, events.ToolCallReconciled(call_id=call_id, outcome=outcome, result=result, error=error))
    return True
