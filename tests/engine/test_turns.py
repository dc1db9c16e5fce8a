"""Every flow of a turn at the engine level."""

from __future__ import annotations

import pytest

from dex_ha import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from dex_ha.engine import (
    STEP_KINDS,
    CompleteAttempt,
    CreateSession,
    FailHeldAttempts,
    FireTimer,
    Handout,
    StartAttempts,
)
from dex_ha.engine.results import SessionCreated
from tests.engine.driver import Driver


@pytest.fixture
def d(tmp_path):
    driver = Driver(str(tmp_path / "engine.db"))
    driver.register()
    driver.create()
    yield driver
    driver.engine.close()


def user_texts(items):
    return [h["text"] for h in items if h["type"] == "user"]


# ---------------------------------------------------------------- messages


def test_messages_during_a_turn_queue_behind_it(d):
    d.send("one")
    d.send("two")
    d.send("three")
    assert d.snap()["current_turn"]["number"] == 1
    assert [m["text"] for m in d.snap()["waiting_messages"]] == ["two", "three"]
    d.run_model("answer one")
    assert d.snap()["current_turn"]["number"] == 2
    assert user_texts(d.engine.task_for(d.next_step()).input["history"]) == ["one", "two"]
    d.run_model("answer two")
    d.run_model("answer three")
    assert d.snap()["status"] == "idle" and [t["status"] for t in d.snap()["turns"]] == ["completed"] * 3


def test_a_steered_message_joins_the_next_model_call(d):
    d.send("build it")
    d.run_model("building", [("c1", "lookup", {})])
    d.send("use the red one", mode="steer")
    d.send("a later question")  # queued: its own turn
    tool = d.hand_out("CallTool")
    d.complete(tool, {"status": "ok", "output": 1})
    model = d.hand_out("RunModel")
    history = d.engine.task_for(model).input["history"]
    assert user_texts(history) == ["build it", "use the red one"]
    assert history[-1] == {"type": "user", "text": "use the red one"}
    d.model(model, "done")
    assert d.snap()["current_turn"]["number"] == 2
    assert user_texts(d.snap()["history"])[-1] == "a later question"


def test_a_steer_left_at_turn_end_starts_the_next_turn(d):
    d.send("one")
    model = d.hand_out("RunModel")
    d.send("steer me", mode="steer")
    d.model(model, "answer")  # the steer arrived after the hand-out
    assert d.snap()["current_turn"]["number"] == 2
    assert user_texts(d.snap()["history"]) == ["one", "steer me"]


def test_a_repeated_message_id_is_a_noop(d):
    first = d.send("hi", message_id="m-1")
    again = d.send("hi", message_id="m-1")
    assert not first.noop and again.noop and again.value.duplicate
    assert len(d.snap()["turns"]) == 1 and len(d.snap()["history"]) == 1
    other = d.apply(d_send(d, "different", "m-1"))
    assert other.code == "conflict"


def d_send(d, text, message_id):
    from dex_ha.engine import SendMessage

    return SendMessage(at=d.at, session_id="s1", text=text, message_id=message_id)


# ---------------------------------------------------------------- tool calls


def test_parallel_calls_are_separate_steps_and_results_keep_call_order(d):
    d.send("go")
    d.run_model("three at once", [("a", "lookup", {}), ("b", "put_item", {}), ("c", "send_email", {})])
    assert sorted(d.queued_kinds()) == ["CallSingleAttemptTool", "CallTool", "CallTool"]
    for call_id, output in (("c", "C"), ("a", "A"), ("b", "B")):
        assert d.queued_kinds() != ["RunModel"]
        step = d.hand_out(call_id=call_id)
        d.complete(step, {"status": "ok", "output": output})
    results = [h for h in d.snap()["history"] if h["type"] == "tool_result"]
    assert [(r["call_id"], r["output"]) for r in results] == [("a", "A"), ("b", "B"), ("c", "C")]
    assert d.queued_kinds() == ["RunModel"]


def test_a_tool_error_result_fails_the_call_and_nothing_runs_again(d):
    d.send("go")
    d.run_model("", [("a", "put_item", {})])
    step = d.hand_out("CallTool")
    d.complete(step, {"status": "error", "error": "no such item"})
    call = d.call("a")
    assert (call["status"], call["error"]) == ("failed", "no such item")
    assert len(call["steps"]) == 1 and len(call["steps"][0]["attempts"]) == 1
    assert d.queued_kinds() == ["RunModel"] and d.engine.next_timer() is None


def test_an_undefined_tool_fails_not_started_with_the_prefix(d):
    d.send("go")
    d.run_model("", [("a", "teleport", {})])
    call = d.call("a")
    assert call["status"] == "failed" and call["attempt_progress"] == "NOT_STARTED"
    assert call["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    assert call["steps"] == [] and d.queued_kinds() == ["RunModel"]


def test_a_non_retryable_failure_uses_up_every_attempt(d):
    d.send("go")
    d.run_model("", [("w", "put_item", {}), ("r", "lookup", {})])
    for call_id in ("w", "r"):
        step = d.hand_out(call_id=call_id)
        d.fail(step, "raised ValueError", retryable=False)
    assert d.call("w")["status"] == "outcome_unknown"  # a write that raised may have done part
    assert d.call("r")["status"] == "failed"
    assert d.call("w")["attempt_progress"] == "NOT_COMPLETED"


def test_tool_policy_overrides_attempts_and_timeouts_but_a_write_runs_once(d):
    d.register(
        [
            {"name": "flaky", "effect": "read", "max_attempts": 5, "start_to_close_ms": 1234},
            {"name": "pay", "effect": "write", "max_attempts": 5},
        ],
        model={"start_to_close_ms": 999},
    )
    d.send("go")
    model = d.next_step("RunModel")
    d.hand_out("RunModel")
    assert d.engine.task_for(model).deadline_ms == d.at + 999
    d.model(model, "", [("f", "flaky", {}), ("p", "pay", {})])
    flaky = d.hand_out(call_id="f")
    assert d.engine.task_for(flaky).deadline_ms == d.at + 1234
    for _ in range(4):
        d.worker_kill(flaky)
        d.tick(60_000)
        d.fire_due()
        d.hand_out(call_id="f")
    assert d.running(flaky).attempt == 5
    pay = d.hand_out(call_id="p")
    d.worker_kill(pay)
    assert d.call("p")["status"] == "outcome_unknown" and len(d.call("p")["steps"][0]["attempts"]) == 1


def test_the_policy_in_force_when_the_response_commits_is_recorded(d):
    d.send("go")
    d.run_model("", [("a", "lookup", {})])
    d.register([{"name": "lookup", "effect": "write", "approval": True}])
    assert d.call("a")["policy"]["effect"] == "read" and d.queued_kinds() == ["CallTool"]
    d.complete(d.hand_out("CallTool"), {"status": "ok", "output": 1})
    d.run_model("", [("b", "lookup", {})])
    assert d.call("b")["policy"]["effect"] == "write" and d.call("b")["step_kind"] == "AwaitToolApproval"


def test_a_denied_call_records_failed_with_the_reason(d):
    """A denied call never ran: NOT_STARTED with the not-run prefix, as every call that never
    ran, then the denial and its reason (what the model reads)."""
    d.send("go")
    d.run_model("", [("a", "wire_money", {"amount": 10})])
    assert d.approve("a", approved=False, reason="too much").ok
    call = d.call("a")
    assert (call["status"], call["attempt_progress"], call["error"]) == (
        "failed",
        "NOT_STARTED",
        f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: the user denied the tool call: too much",
    )
    assert d.queued_kinds() == ["RunModel"] and d.snap()["pending_approvals"] == []
    assert d.approve("a", approved=False).noop
    assert d.approve("a", approved=True).code == "conflict"


def test_ask_user_waits_for_the_answer(d):
    d.send("go")
    d.run_model("", [("q", "ask_user", {"question": "name?"})])
    question = d.snap()["pending_questions"][0]
    assert (question["question"], question["source"]) == ("name?", "ask_user")
    assert d.queued() == []
    assert d.answer(question["question_id"], "Ada").ok
    assert d.call("q")["output"] == "Ada" and d.queued_kinds() == ["RunModel"]
    assert d.answer(question["question_id"], "Ada").noop
    assert d.answer(question["question_id"], "Bob").code == "conflict"
    assert d.answer("q-nope", "x").code == "not_found"


def test_a_tool_that_asked_has_run_so_cancel_records_outcome_unknown(d):
    d.send("go")
    d.run_model("", [("b", "build", {})])
    d.complete(d.hand_out("CallTool"), {"status": "question", "question": "sure?"})
    question_id = d.snap()["pending_questions"][0]["question_id"]
    d.answer(question_id, "yes")
    assert d.queued_kinds() == ["CallTool"]  # runs again with the answer, not yet handed out
    d.cancel()
    call = d.call("b")
    assert (call["status"], call["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")


def test_sleep_is_a_timer_that_fires_once(d):
    d.send("go")
    d.run_model("", [("z", "sleep", {"ms": 1_000})])
    timer = d.engine.next_timer()
    early = d.apply(FireTimer(at=d.at + 10, timer_id=timer.timer_id))
    assert early.code == "conflict" and d.call("z")["status"] == "pending"
    d.tick(1_000)
    assert d.fire_due() == 1 and d.call("z")["output"] == {"slept_ms": 1_000}
    d.run_model("", [("bad", "sleep", {"ms": "soon"})])
    assert d.call("bad")["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)


def test_a_long_running_task_polls_the_same_handle_until_done(d):
    d.send("go")
    d.run_model("", [("t", "build", {})])
    d.complete(d.hand_out("CallTool"), {"status": "task", "handle": {"job": 9}, "poll_after_ms": 500})
    for _ in range(3):
        d.tick(500)
        assert d.fire_due() == 1
        poll = d.hand_out("PollToolTask")
        assert d.engine.task_for(poll).input == {"call_id": "t", "name": "build", "handle": {"job": 9}}
        assert d.engine.task_for(poll).idempotency_key == "s1:t"
        d.complete(poll, {"status": "pending"})
    assert d.call("t")["step_kind"] == "AwaitTimer" and d.call("t")["handle"] == {"job": 9}
    d.tick(500)
    d.fire_due()
    d.complete(d.hand_out("PollToolTask"), {"status": "error", "error": "build broke"})
    call = d.call("t")
    assert (call["status"], call["error"]) == ("failed", "build broke")
    assert [s["kind"] for s in call["steps"]].count("CallTool") == 1


def test_cancel_between_polls_stops_the_task_without_a_second_one(d):
    d.send("go")
    d.run_model("", [("t", "build", {})])
    d.complete(d.hand_out("CallTool"), {"status": "task", "handle": "h", "poll_after_ms": 500})
    timer = d.engine.next_timer()
    d.cancel()
    assert d.call("t")["status"] == "outcome_unknown" and d.engine.next_timer() is None
    d.tick(1_000)
    assert d.apply(FireTimer(at=d.at, timer_id=timer.timer_id)).noop
    assert d.queued() == []


def test_inline_tools_are_recorded_with_the_model_step(d):
    d.send("go")
    model = d.hand_out("RunModel")
    inline = [
        {"id": "i1", "name": "search_inline", "arguments": {}, "result": {"status": "ok", "output": 3}},
        {"id": "i2", "name": "search_inline", "arguments": {}, "result": {"status": "error", "error": "x"}},
    ]
    d.complete(model, {"content": "", "tool_calls": inline})
    assert [d.call(c)["status"] for c in ("i1", "i2")] == ["succeeded", "failed"]
    assert {d.call(c)["step_kind"] for c in ("i1", "i2")} == {"RunModel"}
    assert d.queued_kinds() == ["RunModel"]


# ---------------------------------------------------------------- cancel


def test_cancel_flags_running_attempts_and_records_every_open_call(d):
    d.send("go")
    d.run_model(
        "",
        [
            ("queued", "put_item", {}),
            ("single", "send_email", {}),
            ("read", "lookup", {}),
            ("appr", "wire_money", {}),
            ("ask", "ask_user", {"question": "?"}),
        ],
    )
    single = d.hand_out(call_id="single")
    read = d.hand_out(call_id="read")
    attempt = d.running(single)
    result = d.cancel()
    assert result.value.cancelled == d.snap()["turns"][-1]["turn_id"]
    calls = {c["call_id"]: c for c in d.snap()["tool_calls"]}
    assert calls["queued"]["status"] == "failed" and calls["queued"]["attempt_progress"] == "NOT_STARTED"
    assert calls["queued"]["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    assert calls["single"]["status"] == "outcome_unknown"
    assert calls["read"]["status"] == "failed" and calls["read"]["attempt_progress"] == "NOT_COMPLETED"
    assert calls["appr"]["status"] == "failed" and calls["ask"]["status"] == "failed"
    assert d.snap()["status"] == "idle" and d.queued() == [] and d.turn_status() == "cancelled"
    assert d.snap()["pending_approvals"] == [] and d.snap()["pending_questions"] == []
    # The leader tells Workers in heartbeat answers; the attempts stay running until they stop.
    flags = {a.step_id: a.cancel_requested for a in d.engine.running_attempts()}
    assert flags == {single: True, read: True}
    assert d.engine.attempt_state(single, attempt.attempt, attempt.term, d.secrets[single]).cancel_requested
    late = d.complete(single, {"status": "ok", "output": "sent anyway"})
    assert late.ok and d.call("single")["status"] == "outcome_unknown"
    d.worker_kill(read)
    assert d.engine.running_attempts() == [] and d.engine.next_timer() is None
    assert d.approve("appr").code == "conflict"
    assert d.cancel().noop  # nothing to cancel any more


def test_cancel_of_a_running_model_then_the_next_message_starts_a_turn(d):
    d.send("one")
    model = d.hand_out("RunModel")
    d.send("two")
    d.cancel()
    assert d.snap()["current_turn"]["number"] == 2 and d.queued_kinds() == ["RunModel"]
    assert d.complete(model, {"content": "late"}).ok
    assert [h.get("content") for h in d.snap()["history"] if h["type"] == "assistant"] == []


# ---------------------------------------------------------------- turn failure


def test_a_failed_turn_without_tool_runs_has_no_note(d):
    d.send("go")
    d.run_model("", [("a", "teleport", {})])  # failed NOT_STARTED: nothing ran
    model = d.next_step("RunModel")
    for _ in range(STEP_KINDS["RunModel"].max_attempts):
        d.hand_out("RunModel")
        d.fail(model, "429")
        d.tick(10_000)
        d.fire_due()
    assert d.turn_status() == "failed" and all(h["type"] != "note" for h in d.snap()["history"])


def test_run_model_retries_only_within_its_window(d):
    d.send("go")
    model = d.hand_out("RunModel")
    d.tick(STEP_KINDS["RunModel"].retry_window_ms)
    d.time_out(model)
    assert d.turn_status() == "failed"
    assert "30 min" in d.snap()["turns"][-1]["error"]


def test_takeover_fails_only_attempts_of_earlier_terms_and_fences_late_handouts(d):
    d.send("go")
    d.run_model("", [("a", "lookup", {}), ("b", "lookup", {})])
    step_a = d.hand_out(call_id="a")
    old_term = d.term
    step_b = d.next_step(call_id="b")
    d.takeover()
    assert d.engine.running_attempts() == [] and d.queued_kinds() == ["CallTool"]  # b untouched
    late = d.apply(StartAttempts(at=d.at, handouts=[Handout(step_id=step_b, worker_id="w", term=old_term)]))
    assert late.code == "stale_attempt"
    new = d.hand_out(call_id="b")
    assert d.engine.running_attempts(term_lt=d.term) == []
    assert [a.step_id for a in d.engine.running_attempts()] == [new]
    assert d.apply(FailHeldAttempts(at=d.at, term=d.term)).noop
    assert step_a != step_b


def test_many_handouts_in_one_command_each_start_or_are_refused(d):
    for sid in ("s2", "s3"):
        d.create(sid)
        d.send("go", session_id=sid)
    d.send("go")
    steps = [s.step_id for s in d.queued()]
    assert len(steps) == 3
    handouts = [Handout(step_id=s, worker_id=f"w{i}", term=d.term) for i, s in enumerate(steps)]
    handouts.append(Handout(step_id=steps[0], worker_id="w9", term=d.term))  # already started above
    handouts.append(Handout(step_id="st-nope", worker_id="w9", term=d.term))
    result = d.ok(StartAttempts(at=d.at, handouts=handouts))
    assert [s.step_id for s in result.value.started] == steps
    assert [r.code for r in result.value.refused] == ["conflict", "not_found"]
    assert len(d.engine.running_attempts()) == 3


def test_fifo_per_agent_queue(d):
    d.register(name="other")
    for sid, agent in (("s2", "other"), ("s3", "helper"), ("s4", "helper")):
        d.create(sid, agent=agent)
    for sid in ("s3", "s1", "s2", "s4"):
        d.send("go", session_id=sid)
    assert [s.session_id for s in d.queued()] == ["s3", "s1", "s4"]
    assert [s.session_id for s in d.queued("other")] == ["s2"]
    assert [s.session_id for s in d.engine.queued_steps("helper", 2)] == ["s3", "s1"]
    first = d.hand_out()  # s3's model step fails and retries: it queues behind s1 and s4
    d.worker_kill(first)
    d.tick(60_000)
    d.fire_due()
    assert [s.session_id for s in d.queued()] == ["s1", "s4", "s3"]


# ---------------------------------------------------------------- reconcile, sessions, events


def test_reconcile_settles_only_outcome_unknown(d):
    d.send("go")
    d.run_model("", [("w", "send_email", {}), ("r", "lookup", {})])
    d.worker_kill(d.hand_out(call_id="w"))
    assert d.reconcile("r", "failed").code == "conflict"  # not outcome_unknown
    assert d.reconcile("w", "succeeded", result={"id": 1}).ok
    call = d.call("w")
    assert (call["status"], call["output"], call["error"]) == ("succeeded", {"id": 1}, None)
    assert d.reconcile("w", "succeeded", result={"id": 1}).noop
    assert d.reconcile("w", "failed").code == "conflict"
    assert d.reconcile("nope", "failed").code == "not_found"
    # "r" still runs: the note waits for the response's results, so it cannot split them.
    assert d.snap()["history"][-1]["type"] == "assistant"
    assert d.complete(d.hand_out(call_id="r"), {"status": "ok", "output": 1}).ok
    assert [h["type"] for h in d.snap()["history"][-4:]] == ["assistant", "tool_result", "tool_result", "note"]


def test_create_session_is_idempotent_per_agent(d):
    again = d.ok(CreateSession(at=d.at, session_id="s1", agent="helper"))
    assert again.noop and again.value == SessionCreated("s1", created=False)
    assert d.apply(CreateSession(at=d.at, session_id="s1", agent="other")).code == "conflict"
    generated = d.ok(CreateSession(at=d.at, agent="helper"))
    assert generated.value.session_id == f"s{d.index}"


def test_list_sessions_filters_and_pages(d):
    for i in range(5):
        d.create(f"t{i}", agent="helper" if i % 2 else "other")
    d.send("go", session_id="t1")
    page1 = d.engine.sessions_page(limit=3).items
    page2 = d.engine.sessions_page(limit=3, after=page1[-1]["session_id"]).items
    assert [s["session_id"] for s in page1 + page2] == ["s1", "t0", "t1", "t2", "t3", "t4"]
    assert [s["session_id"] for s in d.engine.sessions_page(agent="other").items] == ["t0", "t2", "t4"]
    assert [s["session_id"] for s in d.engine.sessions_page(status="running").items] == ["t1"]


def test_events_have_increasing_ids_and_resume_after_an_id(d):
    d.send("go")
    d.run_model("hello")
    events = d.engine.events("s1")
    ids = [e.event_id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    types = [e.type for e in events]
    for expected in (
        "session_created",
        "message_received",
        "turn_started",
        "step_queued",
        "attempt_started",
        "assistant_message",
        "turn_completed",
    ):
        assert expected in types
    resumed = d.engine.events("s1", after=ids[3])
    assert [e.event_id for e in resumed] == ids[4:]


def test_snapshot_shows_calls_attempts_and_progress(d):
    d.send("go")
    d.run_model("", [("a", "put_item", {"k": 1})])
    step = d.hand_out("CallTool")
    d.worker_kill(step)
    snap = d.snap()
    call = snap["tool_calls"][0]
    assert call["idempotency_key"] == "s1:a" and call["step_kind"] == "CallTool"
    assert call["step_status"] == "backoff"
    assert call["steps"][0]["attempts"][0]["attempt_progress"] == "NOT_COMPLETED"
    assert snap["pending_timers"][0]["purpose"] == "backoff"
    assert snap["current_turn"]["steps"][0]["kind"] == "RunModel"
    assert snap["status"] == "running" and snap["summary"] is None


def test_a_repeated_identical_completion_is_ok_and_a_different_one_stale(d):
    d.send("go")
    model = d.hand_out("RunModel")
    a = d.running(model)
    d.model(model, "hi")
    same = d.apply(
        CompleteAttempt(
            at=d.at, step_id=model, attempt=a.attempt, term=a.term, result={"content": "hi", "tool_calls": []}
        )
    )
    other = d.apply(CompleteAttempt(at=d.at, step_id=model, attempt=a.attempt, term=a.term, result={"content": "bye"}))
    assert same.ok and same.noop and other.code == "stale_attempt"
