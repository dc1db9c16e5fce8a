"""The engine-level scenario of every crash-matrix row (tests/crash/rows.py names each
row's scenario; test_crash_rows.py runs them).

A scenario drives the commands a failure produces and checks what is recorded and what is
queued next; `outage` is what the failure does to the engine:

- worker_kill: the leader stops hearing heartbeats → HeartbeatLost (NOT_COMPLETED);
- server_restart: the store is closed and reopened on its file, then FailHeldAttempts
  of the new term;
- takeover: FailHeldAttempts of the new leader's term.

The checks read the step-kind table (dex_ha.engine.kinds.STEP_KINDS) instead of repeating
its numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dex_ha import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from dex_ha.engine import STEP_KINDS, CompleteAttempt, FireTimer, Task, Timer
from tests.engine.driver import Driver

EngineScenario = Callable[[Driver, str], None]


def outage(d: Driver, failure: str, step_id: str | None = None) -> None:
    """What `failure` does to the engine; a Worker kill with no attempt running does nothing."""
    if failure == "worker_kill":
        if step_id is not None:
            d.worker_kill(step_id)
    else:
        d.fail_by(failure, step_id or "")


def start_turn(d: Driver, **agent: Any) -> None:
    d.register(**agent)
    d.create()
    d.send("please help")


def tool_turn(d: Driver, name: str, arguments: dict | None = None, call_id: str = "c1") -> None:
    """A turn whose first model response calls one tool."""
    start_turn(d)
    d.run_model("calling a tool", [(call_id, name, arguments or {})])


def task_of(d: Driver, step_id: str) -> Task:
    """The task a Worker would be handed for `step_id` (the step must exist)."""
    task = d.engine.task_for(step_id)
    assert task is not None, f"no task for step {step_id}"
    return task


def next_timer(d: Driver) -> Timer:
    """The engine's next timer (one must be set)."""
    timer = d.engine.next_timer()
    assert timer is not None, "no timer is set"
    return timer


def retry_after_backoff(d: Driver, step_id: str) -> None:
    """The failed step waits on its backoff timer, then is queued again (same step)."""
    assert step_id not in [s.step_id for s in d.queued()]
    timer = next_timer(d)
    assert timer.purpose == "backoff" and timer.step_id == step_id
    d.tick(timer.due_at - d.at)
    assert d.fire_due() == 1
    assert step_id in [s.step_id for s in d.queued()]


def keys_of_attempts(d: Driver, step_id: str) -> str | None:
    return task_of(d, step_id).idempotency_key


def history_types(d: Driver) -> list[str]:
    return [h["type"] for h in d.snap()["history"]]


# ---------------------------------------------------------------- RunModel


def row_run_model_exhausts(d: Driver, failure: str) -> None:
    """R01: runs again up to the table's attempts, then the turn fails with a note."""
    spec = STEP_KINDS["RunModel"]
    assert spec.max_attempts is not None
    start_turn(d)
    d.run_model("look first", [("c1", "lookup", {"q": "x"})])
    tool = d.hand_out("CallTool")
    assert d.complete(tool, {"status": "ok", "output": 42}).ok
    model = d.next_step("RunModel")
    for attempt in range(1, spec.max_attempts + 1):
        d.hand_out("RunModel")
        assert d.running(model).attempt == attempt
        outage(d, failure, model)
        if attempt < spec.max_attempts:
            assert next_timer(d).due_at == d.at + spec.backoff_initial_ms * spec.backoff_factor ** (attempt - 1)
            retry_after_backoff(d, model)
    assert d.turn_status() == "failed"
    assert d.queued() == [] and d.snap()["status"] == "idle"
    note = d.snap()["history"][-1]
    assert note["type"] == "note" and "c1" in note["text"] and "do not repeat" in note["text"]
    d.send("again")
    assert d.queued_kinds() == ["RunModel"]
    assert task_of(d, d.next_step()).attempt == 1


def row_run_model_after_output(d: Driver, failure: str) -> None:
    """R02: the same; the new attempt's result counts, the old attempt's is refused."""
    start_turn(d)
    model = d.hand_out("RunModel")
    old = d.running(model)
    d.tick(2_000)  # deltas reached the server; the engine stores none of them
    outage(d, failure, model)
    retry_after_backoff(d, model)
    d.hand_out("RunModel")
    assert d.running(model).attempt == 2
    before = d.engine.logical_dump(include_applied_index=False)
    late = d.apply(
        CompleteAttempt(at=d.at, step_id=model, attempt=old.attempt, term=old.term, result={"content": "stale"})
    )
    assert (late.code, late.http_status) == ("stale_attempt", 409)
    assert d.engine.logical_dump(include_applied_index=False) == before
    d.model(model, "done")
    assert d.turn_status() == "completed"
    assert [h.get("content") for h in d.snap()["history"] if h["type"] == "assistant"] == ["done"]


# ---------------------------------------------------------------- CallTool


def row_call_tool_runs_again(tool: str, tick_ms: int) -> EngineScenario:
    """R03/R04/R05: the call runs again with the same idempotency key, then succeeds once."""

    def scenario(d: Driver, failure: str) -> None:
        tool_turn(d, tool, {"id": 7})
        step = d.hand_out("CallTool")
        keys = [keys_of_attempts(d, step)]
        d.tick(tick_ms)
        outage(d, failure, step)
        retry_after_backoff(d, step)
        d.hand_out("CallTool")
        keys.append(keys_of_attempts(d, step))
        assert d.running(step).attempt == 2
        assert d.complete(step, {"status": "ok", "output": "stored"}).ok
        call = d.call("c1")
        assert call["status"] == "succeeded" and call["output"] == "stored"
        assert keys == ["s1:c1", "s1:c1"] and call["idempotency_key"] == "s1:c1"
        assert [a["attempt_progress"] for a in call["steps"][0]["attempts"]] == ["NOT_COMPLETED", None]
        assert d.queued_kinds() == ["RunModel"]

    return scenario


def row_call_tool_every_attempt(d: Driver, failure: str) -> None:
    """R06: after the table's attempts, a read records failed, a write outcome_unknown."""
    spec = STEP_KINDS["CallTool"]
    assert spec.max_attempts is not None
    start_turn(d)
    d.run_model("both", [("r", "lookup", {}), ("w", "put_item", {})])
    for call_id in ("r", "w"):
        step = d.next_step(call_id=call_id)
        for attempt in range(1, spec.max_attempts + 1):
            d.hand_out(call_id=call_id)
            assert keys_of_attempts(d, step) == f"s1:{call_id}"
            outage(d, failure, step)
            if attempt < spec.max_attempts:
                retry_after_backoff(d, step)
        assert len(d.call(call_id)["steps"][0]["attempts"]) == spec.max_attempts
    read, write = d.call("r"), d.call("w")
    assert (read["status"], read["attempt_progress"]) == ("failed", "NOT_COMPLETED")
    assert (write["status"], write["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")
    assert read["error"] is not None and not read["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    model = d.next_step("RunModel")
    seen = {h["call_id"]: h["status"] for h in task_of(d, model).input["history"] if h["type"] == "tool_result"}
    assert seen == {"r": "failed", "w": "outcome_unknown"}


# ---------------------------------------------------------------- CallSingleAttemptTool


def row_single_attempt(tick_ms: int) -> EngineScenario:
    """R07/R08: the call records outcome_unknown and never runs again."""

    def scenario(d: Driver, failure: str) -> None:
        tool_turn(d, "send_email", {"to": "a@b"})
        step = d.hand_out("CallSingleAttemptTool")
        assert keys_of_attempts(d, step) == "s1:c1"
        d.tick(tick_ms)
        outage(d, failure, step)
        call = d.call("c1")
        assert (call["status"], call["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")
        assert len(call["steps"]) == 1 and len(call["steps"][0]["attempts"]) == 1
        assert d.engine.next_timer() is None
        assert d.queued_kinds() == ["RunModel"]  # the turn moves on; the model sees it
        history = task_of(d, d.next_step()).input["history"]
        assert history[-1]["status"] == "outcome_unknown"

    return scenario


# ---------------------------------------------------------------- waits


def row_approval(d: Driver, failure: str) -> None:
    """R09: nothing runs again while it waits; a later approval runs the tool once."""
    tool_turn(d, "wire_money", {"amount": 5})
    assert d.snap()["pending_approvals"][0]["call_id"] == "c1" and d.queued() == []
    outage(d, failure)
    assert d.snap()["pending_approvals"][0]["call_id"] == "c1" and d.queued() == []
    assert d.approve("c1").ok
    assert d.queued_kinds() == ["CallSingleAttemptTool"]
    repeat = d.approve("c1")
    assert repeat.ok and repeat.noop and d.queued_kinds() == ["CallSingleAttemptTool"]
    assert d.approve("c1", approved=False).code == "conflict"
    step = d.hand_out("CallSingleAttemptTool")
    assert keys_of_attempts(d, step) == "s1:c1"
    assert d.complete(step, {"status": "ok", "output": "sent"}).ok
    call = d.call("c1")
    assert call["status"] == "succeeded"
    assert [s["kind"] for s in call["steps"]] == ["AwaitToolApproval", "CallSingleAttemptTool"]


def row_question(d: Driver, failure: str) -> None:
    """R10: nothing runs again; a later answer resumes the turn (ask_user and a tool's question)."""
    start_turn(d)
    d.run_model("asking", [("ask", "ask_user", {"question": "which?"}), ("b", "build", {"x": 1})])
    build = d.hand_out("CallTool")
    assert d.complete(build, {"status": "question", "question": "which branch?"}).ok
    questions = {q["call_id"]: q["question_id"] for q in d.snap()["pending_questions"]}
    assert set(questions) == {"ask", "b"} and d.queued() == []
    outage(d, failure)
    assert {q["call_id"] for q in d.snap()["pending_questions"]} == {"ask", "b"} and d.queued() == []
    assert d.answer(questions["ask"], "the blue one").ok
    assert d.answer(questions["b"], "main").ok
    rerun = d.next_step("CallTool")
    assert rerun != build
    assert task_of(d, rerun).input == {"call_id": "b", "name": "build", "arguments": {"x": 1}, "answer": "main"}
    assert keys_of_attempts(d, rerun) == "s1:b"
    d.hand_out("CallTool")
    assert d.complete(rerun, {"status": "ok", "output": "built"}).ok
    assert d.call("ask")["output"] == "the blue one" and d.call("b")["status"] == "succeeded"
    assert d.queued_kinds() == ["RunModel"]


def row_timer(d: Driver, failure: str) -> None:
    """R11: the timer fires once; one that came due during the outage fires afterwards."""
    tool_turn(d, "sleep", {"ms": 60_000})
    timer = next_timer(d)
    assert timer.purpose == "sleep" and d.queued() == []
    d.tick(120_000)  # the outage lasts past the due time
    outage(d, failure)
    assert d.engine.due_timers(d.at)[0].timer_id == timer.timer_id
    assert d.fire_due() == 1
    again = d.apply(FireTimer(at=d.at, timer_id=timer.timer_id))
    assert again.ok and again.noop
    assert d.queued_kinds() == ["RunModel"] and d.call("c1")["status"] == "succeeded"


def start_long_task(d: Driver) -> str:
    tool_turn(d, "build", {"target": "all"})
    step = d.hand_out("CallTool")
    assert d.complete(step, {"status": "task", "handle": "job-1", "poll_after_ms": 5_000}).ok
    return step


def poll_once(d: Driver) -> str:
    d.tick(5_000)
    assert d.fire_due() == 1
    return d.hand_out("PollToolTask")


def row_poll_between(d: Driver, failure: str) -> None:
    """R12: polling goes on with the same task handle; no second task starts."""
    start_long_task(d)
    poll = poll_once(d)
    assert task_of(d, poll).input == {"call_id": "c1", "name": "build", "handle": "job-1"}
    assert d.complete(poll, {"status": "pending"}).ok
    outage(d, failure)  # between two polls: nothing is running
    poll = poll_once(d)
    assert task_of(d, poll).input["handle"] == "job-1"
    assert d.complete(poll, {"status": "ok", "output": "artifact"}).ok
    call = d.call("c1")
    assert call["status"] == "succeeded"
    assert [s["kind"] for s in call["steps"]].count("CallTool") == 1


def row_poll_during(d: Driver, failure: str) -> None:
    """R13: the poll runs again; no second task starts."""
    start_long_task(d)
    poll = poll_once(d)
    outage(d, failure, poll)
    retry_after_backoff(d, poll)
    d.hand_out("PollToolTask")
    assert task_of(d, poll).input["handle"] == "job-1" and d.running(poll).attempt == 2
    assert d.complete(poll, {"status": "ok", "output": "artifact"}).ok
    kinds = [s["kind"] for s in d.call("c1")["steps"]]
    assert kinds.count("CallTool") == 1 and d.call("c1")["status"] == "succeeded"


def row_compaction(d: Driver, failure: str) -> None:
    """R14: only the summary call runs again; one summary; exhausted → turn fails, next compacts."""
    spec = STEP_KINDS["CompactContext"]
    assert spec.max_attempts is not None
    start_turn(d, compaction={"max_items": 3})
    d.run_model("first answer")
    d.send("second")
    d.run_model("second answer")
    d.send("third")
    compact = d.hand_out("CompactContext")  # history is over max_items: compact before the model
    assert d.complete(compact, {"summary": "S1"}).ok
    d.run_model("third answer")
    d.send("fourth")
    d.run_model("fourth answer")
    d.send("fifth")  # over max_items again
    compact = d.next_step("CompactContext")
    for attempt in range(1, spec.max_attempts + 1):
        d.hand_out("CompactContext")
        assert d.running(compact).attempt == attempt
        outage(d, failure, compact)
        assert summary_text(d) == "S1"
        if attempt < spec.max_attempts:
            retry_after_backoff(d, compact)
    assert d.turn_status() == "failed" and d.queued() == []
    d.send("sixth")
    compact = d.hand_out("CompactContext")  # the next user message compacts again
    task = task_of(d, compact).input
    assert task["summary"] == "S1" and task["history"][0] == {"type": "user", "text": "third"}
    assert d.complete(compact, {"summary": "S2"}).ok
    assert summary_text(d) == "S2" and d.queued_kinds() == ["RunModel"]
    model_input = task_of(d, d.next_step()).input
    assert model_input["summary"] == "S2"
    assert model_input["history"] == [{"type": "user", "text": "sixth"}]


def summary_text(d: Driver) -> str:
    summary = d.snap()["summary"]
    assert summary is not None, "the session has no summary"
    return summary["text"]


def row_idle(d: Driver, failure: str) -> None:
    """R15: nothing runs again; the next message starts a turn."""
    start_turn(d)
    d.run_model("hi there")
    assert d.snap()["status"] == "idle" and d.queued() == []
    assert d.snap()["waiting_for"] == "AwaitUserMessage"
    outage(d, failure)
    assert d.snap()["status"] == "idle" and d.queued() == [] and d.engine.running_attempts() == []
    d.send("next")
    current = d.snap()["current_turn"]
    assert d.queued_kinds() == ["RunModel"] and current is not None and current["number"] == 2


def row_queued(d: Driver, failure: str) -> None:
    """R16: a queued step stays queued and uses no attempt; it runs as attempt 1."""
    tool_turn(d, "put_item")
    d.send("queued behind", session_id="s1")
    step = d.next_step("CallTool")
    outage(d, failure)
    assert d.queued_kinds() == ["CallTool"]
    assert task_of(d, step).attempt == 1
    d.hand_out("CallTool")
    assert d.running(step).attempt == 1 and keys_of_attempts(d, step) == "s1:c1"


def row_before_first_heartbeat(d: Driver, failure: str) -> None:
    """R17: CallTool read, PollToolTask and CompactContext: the same as their rows."""
    start_turn(d, compaction={"max_items": 2})
    d.run_model("tools", [("r", "lookup", {}), ("t", "build", {})])
    read = d.hand_out(call_id="r")
    outage(d, failure, read)
    retry_after_backoff(d, read)
    d.hand_out(call_id="r")
    assert d.running(read).attempt == 2 and keys_of_attempts(d, read) == "s1:r"
    assert d.complete(read, {"status": "ok", "output": 1}).ok
    build = d.hand_out(call_id="t")
    assert d.complete(build, {"status": "task", "handle": "h", "poll_after_ms": 10}).ok
    d.tick(10)
    d.fire_due()
    poll = d.hand_out("PollToolTask")
    outage(d, failure, poll)
    retry_after_backoff(d, poll)
    d.hand_out("PollToolTask")
    assert task_of(d, poll).input["handle"] == "h"
    assert d.complete(poll, {"status": "ok", "output": 2}).ok
    compact = d.hand_out("CompactContext")  # history grew over max_items=2
    outage(d, failure, compact)
    retry_after_backoff(d, compact)
    d.hand_out("CompactContext")
    assert d.running(compact).attempt == 2


def row_wait_ended(d: Driver, failure: str) -> None:
    """R18: the handler runs again; the resolved approval, answer or timer stays recorded."""
    start_turn(d)
    d.run_model("waits", [("a", "wire_money", {}), ("q", "ask_user", {"question": "?"}), ("z", "sleep", {"ms": 10})])
    question_id = d.snap()["pending_questions"][0]["question_id"]
    timer_id = next_timer(d).timer_id
    d.tick(10)
    approved, answered, fired = d.approve("a"), d.answer(question_id, "yes"), d.fire_due()
    entries = d.log[-3:]
    outage(d, failure)
    for index, data in entries:  # the same entries again (a replay after restart)
        assert d.engine.apply(index, data).code == "already_applied"
    assert d.approve("a").noop and d.answer(question_id, "yes").noop
    assert d.apply(FireTimer(at=d.at, timer_id=timer_id)).noop
    assert approved.ok and answered.ok and fired == 1
    assert d.queued_kinds() == ["CallSingleAttemptTool"]  # the approved tool, queued once
    assert d.call("q")["status"] == "succeeded" and d.call("z")["status"] == "succeeded"


def row_result_not_committed(d: Driver, failure: str) -> None:
    """R19: the engine sees either the completion or the attempt failing; both are clean."""
    # (a) the result commits before the failure: recorded once, nothing runs again.
    tool_turn(d, "put_item", call_id="a")
    step = d.hand_out("CallTool")
    attempt = d.running(step)
    assert d.complete(step, {"status": "ok", "output": "done"}).ok
    outage(d, failure)
    assert d.call("a")["status"] == "succeeded" and d.queued_kinds() == ["RunModel"]
    resend = d.apply(
        CompleteAttempt(
            at=d.at, step_id=step, attempt=attempt.attempt, term=attempt.term, result={"status": "ok", "output": "done"}
        )
    )
    assert resend.ok and resend.noop  # the Worker's retry of the same result
    # (b) the attempt fails first: it follows the row; the late result is refused (409).
    d.run_model("more", [("b", "put_item", {}), ("c", "send_email", {})])
    for call_id in ("b", "c"):
        step = d.hand_out(call_id=call_id)
        attempt = d.running(step)
        outage(d, failure, step)
        before = d.engine.logical_dump(include_applied_index=False)
        late = d.apply(
            CompleteAttempt(
                at=d.at,
                step_id=step,
                attempt=attempt.attempt,
                term=attempt.term,
                result={"status": "ok", "output": "late"},
            )
        )
        assert late.code == "stale_attempt" and late.http_status == 409
        assert d.engine.logical_dump(include_applied_index=False) == before
    assert d.call("c")["status"] == "outcome_unknown"  # single attempt: the write row
    retry_after_backoff(d, d.call("b")["steps"][0]["step_id"])  # the idempotent write runs again
    assert d.call("b")["status"] == "pending" and d.queued_kinds() == ["CallTool"]


def row_inline(d: Driver, failure: str) -> None:
    """R20: an inline tool runs inside RunModel and repeats with it (at-least-once)."""
    start_turn(d)
    model = d.hand_out("RunModel")
    outage(d, failure, model)  # the inline tool may have run inside this attempt
    retry_after_backoff(d, model)
    d.hand_out("RunModel")
    inline = {
        "id": "i1",
        "name": "search_inline",
        "arguments": {"q": "x"},
        "result": {"status": "ok", "output": ["hit"]},
    }
    assert d.complete(model, {"content": "found", "tool_calls": [inline]}).ok
    call = d.call("i1")
    assert call["status"] == "succeeded" and call["step_kind"] == "RunModel" and call["steps"] == []
    assert d.queued_kinds() == ["RunModel"]  # the model goes on with the inline result
