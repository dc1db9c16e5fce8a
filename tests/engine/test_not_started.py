"""A Worker's `fail` with `not_started`: the Worker never called the
tool function (unknown tool, arguments refused). The call records `failed` with
NOT_STARTED and the not-run prefix, but only when no attempt of any step of the call could
have run: one attempt that may have run keeps the call NOT_COMPLETED (a write:
outcome_unknown), whatever later attempts say.
"""

from __future__ import annotations

import msgpack
import pytest

from dex_ha import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from dex_ha.engine import STEP_KINDS, FailAttempt, decode_command
from dex_ha.engine.commands import COMMAND_FORMAT_VERSION
from dex_ha.session_protocol import ToolCallView
from tests.engine.driver import Driver


def call_tool_attempts() -> int:
    """How many attempts a CallTool step may use (without a tool policy of its own)."""
    attempts = STEP_KINDS["CallTool"].max_attempts
    assert attempts is not None, "CallTool steps have a bounded number of attempts"
    return attempts


@pytest.fixture
def d(tmp_path):
    driver = Driver(str(tmp_path / "engine.db"))
    yield driver
    driver.engine.close()


def tool_turn(d: Driver, name: str, call_id: str = "c1") -> None:
    d.register()
    d.create()
    d.send("please help")
    d.run_model("calling a tool", [(call_id, name, {"x": 1})])


def not_started(d: Driver, step_id: str, retryable: bool = True) -> None:
    a = d.running(step_id)
    d.ok(
        FailAttempt(
            at=d.at,
            step_id=step_id,
            attempt=a.attempt,
            term=a.term,
            error="agent 'helper' has no tool 'send_email'",
            retryable=retryable,
            not_started=True,
        )
    )


def retry(d: Driver, step_id: str) -> None:
    d.tick(d.next_timer().due_at - d.at)
    assert d.fire_due() == 1
    d.hand_out(call_id=d.task(step_id).input["call_id"])


def assert_not_run(call: ToolCallView) -> None:
    assert (call["status"], call["attempt_progress"]) == ("failed", "NOT_STARTED"), call
    assert (call["error"] or "").startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX), call["error"]


def test_single_attempt_write_never_started_records_failed(d: Driver) -> None:
    tool_turn(d, "send_email")
    step = d.hand_out("CallSingleAttemptTool")
    not_started(d, step, retryable=False)
    call = d.call("c1")
    assert_not_run(call)
    assert [a["attempt_progress"] for a in call["steps"][0]["attempts"]] == ["NOT_STARTED"]
    history = d.task(d.next_step("RunModel")).input["history"]
    assert history[-1]["status"] == "failed" and history[-1]["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)


def test_idempotent_write_no_attempt_started(d: Driver) -> None:
    """Every attempt of the step says not started: the call never ran."""
    tool_turn(d, "put_item")
    step = d.hand_out("CallTool")
    for attempt in range(1, call_tool_attempts() + 1):
        if attempt > 1:
            retry(d, step)
        not_started(d, step)
    assert_not_run(d.call("c1"))


def test_one_attempt_that_may_have_run_keeps_the_outcome_unknown(d: Driver) -> None:
    """Attempt 1's Worker died while the tool ran; attempts 2 and 3 say not started. The
    tool may have run in attempt 1: the write stays outcome_unknown."""
    tool_turn(d, "put_item")
    step = d.hand_out("CallTool")
    d.worker_kill(step)
    for _ in range(call_tool_attempts() - 1):
        retry(d, step)
        not_started(d, step)
    call = d.call("c1")
    assert (call["status"], call["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")
    assert [a["attempt_progress"] for a in call["steps"][0]["attempts"]] == [
        "NOT_COMPLETED",
        "NOT_STARTED",
        "NOT_STARTED",
    ]


def test_single_attempt_write_that_asked_a_question_ran_before(d: Driver) -> None:
    """The tool asked the user (it ran); the re-run with the answer says not started. A
    Worker cannot turn that write into 'safe to call again' through the later step."""
    tool_turn(d, "send_email")
    first = d.hand_out("CallSingleAttemptTool")
    assert d.complete(first, {"status": "question", "question": "which address?"}).ok
    question_id = d.snap()["pending_questions"][0]["question_id"]
    assert d.answer(question_id, "ann@example.com").ok
    again = d.hand_out("CallSingleAttemptTool")
    assert again != first
    not_started(d, again, retryable=False)
    call = d.call("c1")
    assert (call["status"], call["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")
    assert call["error"] is not None and not call["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)


def test_cancel_after_a_not_started_attempt(d: Driver) -> None:
    """The step waits for its retry after a not-started attempt: nothing ran, so a cancel
    records failed NOT_STARTED, as for a queued step."""
    tool_turn(d, "put_item")
    step = d.hand_out("CallTool")
    not_started(d, step)
    d.cancel()
    assert_not_run(d.call("c1"))


def test_without_the_flag_a_failure_may_have_run(d: Driver) -> None:
    tool_turn(d, "send_email")
    step = d.hand_out("CallSingleAttemptTool")
    d.fail(step, "ValueError: the tool raised", retryable=False)
    call = d.call("c1")
    assert (call["status"], call["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")


def test_fail_attempt_entries_without_the_field_still_decode() -> None:
    """Log entries written before `not_started` existed apply as before (not_started=False)."""
    old = msgpack.packb(
        [
            COMMAND_FORMAT_VERSION,
            "FailAttempt",
            {"at": 1, "step_id": "st1", "attempt": 1, "term": 1, "error": "boom", "retryable": True},
        ],
        use_bin_type=True,
    )
    cmd = decode_command(old)
    assert isinstance(cmd, FailAttempt) and cmd.not_started is False
