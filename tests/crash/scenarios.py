"""The real-process scenario of every crash cell: what a cell of a row (or of a variant, or
a case) does to its Cell and what it then checks. tests/crash/rows.py names each row's
scenario; test_matrix.py runs them, one test per cell.

Each scenario runs its row's agent (agents.py) in its own worker process (worker_proc.py),
brings on the column's failure at the row's moment (columns.py: SIGKILL, or a failpoint's
exit where only the process knows the moment; rows.py says which for every cell), and
checks the row's outcome from outside the server: the side-effect ledger the worker
processes write, the session snapshot (`get_session`) and the client's event stream.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

from dex_ha import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from dex_ha.client import SessionEvent
from dex_ha.worker.runner import first_heartbeat_failpoint
from harness.waiting import eventually
from tests.crash.agents import R14_MAX_ITEMS, RELEASE, SLEEP_MS
from tests.crash.cell import COMPLETED, FAILED, SLOW_HEARTBEAT_S, Cell, attempts, call_of, results_seen
from tests.crash.columns import DEADLINE_S, SERVER_RESTART_HEARTBEAT_TIMEOUT_MS
from tests.crash.ledger import Run

WAIT_POINT = "server.wait.after-commit"
HANDOUT_POINT = "server.handout.after-commit"

CellScenario = Callable[[Cell], Awaitable[None]]


# ---------------------------------------------------------------- shared moves


def start_before_first_heartbeat(cell: Cell, *kinds: str) -> None:
    """A worker whose first heartbeat of an attempt of `kinds` never reaches the server: with
    a Worker kill it exits at that failpoint; otherwise it beats only every 10 s."""
    if cell.worker_kill:
        cell.start_worker(failpoints=",".join(first_heartbeat_failpoint(kind) for kind in kinds))
    else:
        cell.start_worker(heartbeat_interval_s=SLOW_HEARTBEAT_S)


async def interrupt_before_first_heartbeat(cell: Cell, started_at: float) -> None:
    await cell.interrupt()
    if not cell.worker_kill:
        assert cell.failed_at[-1] - started_at < SLOW_HEARTBEAT_S / 2, "the failure came too late"


def assert_ran_again_with_the_key(cell: Cell, tool: str, call_id: str, finished: list[int] | None = None) -> None:
    """Two runs with the call's key; only the second finished (unless `finished` says otherwise)."""
    key = f"{cell.sid}:{call_id}"
    started = cell.ledger.runs("tool", tool, "started")
    assert [(run.key, run.attempt) for run in started] == [(key, 1), (key, 2)]
    assert [run.attempt for run in cell.ledger.runs("tool", tool, "finished")] == (finished or [2])


def last_model_call(cell: Cell) -> Run:
    return cell.ledger.runs("model", cell.agent, "started")[-1]


# ---------------------------------------------------------------- RunModel


async def r01(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    await cell.until_ledger("tool", "lookup", "finished")
    for attempt in (1, 2, 3):  # the model call after the tool result hangs on every attempt
        await cell.until_ledger("model", cell.agent, "started", count=1 + attempt)
        await cell.interrupt()
    snap = await cell.until(lambda s: s["turns"][0]["status"] == "failed", "turn 1 to fail")
    note = snap["history"][-1]
    assert note["type"] == "note" and "c1" in note["text"] and "do not repeat" in note["text"]
    hanging = [run for run in cell.ledger.runs("model", cell.agent, "started") if results_seen(run)]
    assert [run.attempt for run in hanging] == [1, 2, 3]  # the same model call, 3 times
    await cell.send("again")
    await cell.idle()
    assert cell.step_attempts("RunModel") == [COMPLETED, FAILED, FAILED, FAILED, COMPLETED]
    assert any(
        item["type"] == "note" and "do not repeat" in item["text"] for item in last_model_call(cell).data["history"]
    )  # the next turn's model saw it
    assert cell.ledger.count("tool", "lookup") == 1


async def r02(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    first = await _eventually_delta(cell, attempt=1)
    await cell.interrupt()
    snap = await cell.idle()
    failed = [e.data for e in cell.committed("attempt_failed")]
    assert [(f["step_id"], f["attempt"], f["kind"]) for f in failed] == [(first.step_id, 1, "RunModel")]
    assert any(e.id is None and e.attempt == 2 and e.step_id == first.step_id for e in cell.events)
    assert snap["history"][-1]["content"] == "final answer"
    assert [run.attempt for run in cell.ledger.runs("model", cell.agent, "started")] == [1, 2]


async def _eventually_delta(cell: Cell, attempt: int) -> SessionEvent:
    return await eventually(
        lambda: next((e for e in cell.events if e.id is None and e.attempt == attempt), None),
        f"a delta of attempt {attempt}",
    )


# ---------------------------------------------------------------- CallTool


async def interrupt_the_tool(cell: Cell, kind: str, tool: str, before_first_heartbeat: bool) -> None:
    """Start the worker, send "go", and interrupt the first run of `tool` (a step of `kind`):
    before its first heartbeat reached the server, or once one did."""
    if before_first_heartbeat:
        start_before_first_heartbeat(cell, kind)
    else:
        cell.start_worker()
    await cell.send("go")
    started = (await cell.until_ledger("tool", tool))[0]
    if before_first_heartbeat:
        await interrupt_before_first_heartbeat(cell, started.at)
    else:
        await cell.until_ledger("tool", tool, "beat")  # a heartbeat of attempt 1 got through
        await cell.interrupt()


def runs_again(tool: str, before_first_heartbeat: bool) -> CellScenario:
    async def scenario(cell: Cell) -> None:
        await interrupt_the_tool(cell, "CallTool", tool, before_first_heartbeat)
        snap = await cell.idle()
        call = call_of(snap, "c1")
        assert (call["status"], call["output"]) == ("succeeded", "done")
        assert attempts(call["steps"], "CallTool") == [FAILED, COMPLETED]
        assert call["idempotency_key"] == f"{cell.sid}:c1"
        assert_ran_again_with_the_key(cell, tool, "c1")

    return scenario


async def r06(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    for attempt in (1, 2, 3):
        for tool in ("lookup", "put_item"):
            await _until_beat(cell, tool, attempt)
        await cell.interrupt()
    snap = await cell.idle()
    read, write = call_of(snap, "r"), call_of(snap, "w")
    assert (read["status"], read["attempt_progress"]) == ("failed", "NOT_COMPLETED")
    assert (write["status"], write["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")
    for call, tool in ((read, "lookup"), (write, "put_item")):
        assert not call["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
        assert attempts(call["steps"], "CallTool") == [FAILED] * 3
        runs = cell.ledger.runs("tool", tool, "started")
        assert [(run.key, run.attempt) for run in runs] == [(f"{cell.sid}:{call['call_id']}", n) for n in (1, 2, 3)]
        assert cell.ledger.runs("tool", tool, "finished") == []
    assert results_seen(last_model_call(cell)) == {"r": "failed", "w": "outcome_unknown"}


async def _until_beat(cell: Cell, tool: str, attempt: int) -> None:
    await eventually(
        lambda: any(run.attempt == attempt for run in cell.ledger.runs("tool", tool, "beat")),
        f"a heartbeat of {tool} attempt {attempt}",
    )


# ---------------------------------------------------------------- CallSingleAttemptTool


def single_attempt(before_first_heartbeat: bool) -> CellScenario:
    async def scenario(cell: Cell) -> None:
        await interrupt_the_tool(cell, "CallSingleAttemptTool", "send_email", before_first_heartbeat)
        snap = await cell.idle()
        call = call_of(snap, "c1")
        assert (call["status"], call["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")
        assert not call["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
        assert attempts(call["steps"], "CallSingleAttemptTool") == [FAILED]
        assert [(r.key, r.attempt) for r in cell.ledger.runs("tool", "send_email", "started")] == [
            (f"{cell.sid}:c1", 1)
        ]
        assert cell.ledger.runs("tool", "send_email", "finished") == []
        assert results_seen(last_model_call(cell)) == {"c1": "outcome_unknown"}  # the model sees it

    return scenario


# ---------------------------------------------------------------- waits


async def r09(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    await cell.until(lambda s: [a["call_id"] for a in s["pending_approvals"]] == ["c1"], "the approval request")
    await cell.interrupt()
    snap = await cell.snapshot()
    assert [a["call_id"] for a in snap["pending_approvals"]] == ["c1"]
    assert cell.ledger.count("tool", "wire_money") == 0  # nothing ran while it waited
    await cell.client.approve(cell.sid, "c1")
    snap = await cell.idle()
    call = call_of(snap, "c1")
    assert call["status"] == "succeeded"
    assert [s["kind"] for s in call["steps"]] == ["AwaitToolApproval", "CallSingleAttemptTool"]
    assert [(r.key, r.attempt) for r in cell.ledger.runs("tool", "wire_money", "started")] == [(f"{cell.sid}:c1", 1)]
    assert (await cell.client.approve(cell.sid, "c1"))["noop"] is True


async def r10(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    snap = await cell.until(lambda s: len(s["pending_questions"]) == 2, "both questions")
    await cell.interrupt()
    after = await cell.snapshot()
    assert after["pending_questions"] == snap["pending_questions"]
    assert cell.ledger.count("tool", "build_branch") == 1  # it asked, and nothing ran again
    questions = {q["call_id"]: q["question_id"] for q in after["pending_questions"]}
    await cell.client.answer(cell.sid, questions["ask"], "blue")
    await cell.client.answer(cell.sid, questions["b"], "main")
    snap = await cell.idle()
    assert call_of(snap, "ask")["output"] == "blue"
    assert (call_of(snap, "b")["status"], call_of(snap, "b")["output"]) == ("succeeded", "built main")
    runs = cell.ledger.runs("tool", "build_branch", "started")
    assert [(r.key, r.data["answer"]) for r in runs] == [(f"{cell.sid}:b", None), (f"{cell.sid}:b", "main")]


async def r11(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    snap = await cell.until(lambda s: s["pending_timers"], "the sleep timer")
    due_at_s = snap["pending_timers"][0]["due_at"] / 1000
    await cell.fail()
    if cell.worker_kill:  # it fires while no Worker runs
        await cell.until(lambda s: call_of(s, "z")["status"] == "succeeded", "the timer to fire")
    elif cell.column.name == "server_restart":  # the node is down when it comes due
        await asyncio.sleep(max(0.0, due_at_s - time.time()) + 0.1)  # not a state wait: the outage length
    await cell.recover()
    snap = await cell.idle()
    assert call_of(snap, "z")["status"] == "succeeded"
    fired = [e for e in cell.committed("timer_fired") if e.data["purpose"] == "sleep"]
    assert len(fired) == 1
    assert results_seen(last_model_call(cell)) == {"z": "succeeded"}
    assert call_of(snap, "z")["output"]["slept_ms"] >= SLEEP_MS


async def r12(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    await cell.until_ledger("poll", "build", "finished")  # the first poll said pending
    await cell.until(
        lambda s: (
            any(t["purpose"] == "poll" for t in s["pending_timers"])
            and all(st["status"] == "done" for st in call_of(s, "t")["steps"] if st["kind"] == "PollToolTask")
        ),
        "the first poll's result to be recorded",
    )
    await cell.interrupt()
    snap = await cell.idle()
    assert_one_task_polled(cell, snap, polls=2)
    assert FAILED not in attempts(call_of(snap, "t")["steps"], "PollToolTask")


def assert_one_task_polled(cell: Cell, snap: dict, polls: int) -> None:
    call = call_of(snap, "t")
    assert (call["status"], call["output"]) == ("succeeded", "artifact")
    assert cell.ledger.count("tool", "build") == 1  # no second task started
    assert [s["kind"] for s in call["steps"]].count("CallTool") == 1
    handle = f"task-of-{cell.sid}:t"
    assert [run.data for run in cell.ledger.runs("poll", "build", "started")] == [handle] * polls


async def r13(cell: Cell) -> None:
    if cell.worker_kill:
        cell.start_worker(failpoints="worker.PollToolTask.during-poll")
    else:
        cell.start_worker()
    await cell.send("go")
    if cell.worker_kill:
        await cell.until_ledger("poll", "build", "finished")
        await cell.fail()
        assert cell.worker is not None
        cell.worker.failpoints = ""  # the new Worker delivers its poll
        await cell.recover()
    else:
        await cell.until_ledger("poll", "build", "beat")
        await cell.interrupt()
    snap = await cell.idle()
    assert_one_task_polled(cell, snap, polls=2)
    assert attempts(call_of(snap, "t")["steps"], "PollToolTask") == [FAILED, COMPLETED]


# ---------------------------------------------------------------- compaction, idle, queued


async def r14(cell: Cell) -> None:
    cell.start_worker()
    for text in ("one", "two"):
        await cell.send(text)
        await cell.idle()
    await cell.send("three")  # R14_MAX_ITEMS: now over the limit, compaction first
    await cell.until_ledger("summary", cell.agent)
    await cell.interrupt()
    snap = await cell.idle()
    summaries = cell.ledger.runs("summary", cell.agent, "started")
    assert [run.attempt for run in summaries] == [1, 2]  # the same summary call, again
    assert [run.attempt for run in cell.ledger.runs("model", cell.agent, "started")] == [1, 1, 1]
    assert len(cell.committed("summary_updated")) == 1
    assert cell.step_attempts("CompactContext") == [FAILED, COMPLETED]
    stored = snap["summary"]["text"]
    assert stored == cell.ledger.runs("summary", cell.agent, "finished")[0].data
    assert last_model_call(cell).data["summary"] == stored
    assert R14_MAX_ITEMS < len(summaries[0].data["history"]) + 1


async def r15(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("hello")
    await cell.idle()
    await cell.interrupt()
    snap = await cell.snapshot()
    assert (snap["status"], snap["waiting_for"], snap["current_turn"]) == ("idle", "AwaitUserMessage", None)
    await cell.send("next")
    snap = await cell.idle()
    assert [t["status"] for t in snap["turns"]] == ["completed", "completed"]
    assert [run.attempt for run in cell.ledger.runs("model", cell.agent, "started")] == [1, 1]
    assert cell.step_attempts("RunModel") == [COMPLETED, COMPLETED]


async def r16(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("one")
    await cell.idle()
    if cell.worker_kill:
        await cell.fail()  # the Worker dies; the next step is queued while none runs
    else:
        assert cell.worker is not None
        cell.worker.kill()  # no Worker, so the step stays queued through the node's failure
    await cell.send("two")
    queued = await cell.until(lambda s: _model_step(s) is not None, "the queued model step")
    assert_queued_unattempted(queued)
    if not cell.worker_kill:
        await cell.interrupt()
        assert_queued_unattempted(await cell.snapshot())
        cell.start_worker()
    else:
        await cell.recover()
    await cell.idle()
    assert cell.step_attempts("RunModel") == [COMPLETED, COMPLETED]
    started = [e.data["attempt"] for e in cell.committed("attempt_started")]
    assert started == [1, 1]  # the queued step ran as attempt 1
    assert cell.ledger.count("model", cell.agent) == 2


def _model_step(snap: dict, turn_number: int = 2) -> dict | None:
    turn = snap["current_turn"]
    return (
        None
        if turn is None or turn["number"] != turn_number
        else next((s for s in turn["steps"] if s["kind"] == "RunModel"), None)
    )


def assert_queued_unattempted(snap: dict, turn_number: int = 2) -> None:
    step = _model_step(snap, turn_number)
    assert step is not None and (step["status"], step["attempts"]) == ("queued", []), step


async def r16_busy(cell: Cell) -> None:
    """A Worker with one slot runs a write; two sessions' model steps queue behind it."""
    cell.start_worker(max_concurrency=1)
    await cell.send("go")
    await cell.until_ledger("tool", "put_item", "beat")  # the Worker's one slot is busy
    others = [await cell.open_another() for _ in range(2)]
    for n, sid in enumerate(others):
        await cell.client.send_message(sid, f"m{n}")
    for sid in others:
        await eventually(functools.partial(_queued_in, cell, sid), f"the model step of {sid} queued", DEADLINE_S)
    await cell.fail()  # SIGKILL: a tool running, two steps queued
    for sid in others:
        assert_queued_unattempted((await cell.client.get_session(sid)).raw, turn_number=1)
    await cell.recover()
    snap = await cell.idle()
    for n, sid in enumerate(others):
        await cell.idle(sid)
        assert cell.step_attempts("RunModel", sid) == [COMPLETED]  # attempt 1, the only one
        assert [e.data["attempt"] for e in cell.committed("attempt_started", sid)] == [1]
        assert len(model_calls_for(cell, f"m{n}")) == 1
    call = call_of(snap, "c1")  # the running write follows R04
    assert (call["status"], attempts(call["steps"], "CallTool")) == ("succeeded", [FAILED, COMPLETED])
    assert_ran_again_with_the_key(cell, "put_item", "c1")


async def _queued_in(cell: Cell, sid: str) -> bool:
    snap = (await cell.client.get_session(sid)).raw
    step = _model_step(snap, turn_number=1)
    return step is not None and step["status"] == "queued"


def model_calls_for(cell: Cell, text: str) -> list[Run]:
    """The model calls whose history holds the user message `text`."""
    return [
        run
        for run in cell.ledger.runs("model", cell.agent, "started")
        if any(item["type"] == "user" and item.get("text") == text for item in run.data["history"])
    ]


# ---------------------------------------------------------------- the rows the seed left untested


async def r17(cell: Cell) -> None:
    start_before_first_heartbeat(cell, "CallTool", "PollToolTask", "CompactContext")
    await cell.send("go")
    for kind, name in (("tool", "lookup"), ("poll", "build")):
        started = (await cell.until_ledger(kind, name))[0]
        await interrupt_before_first_heartbeat(cell, started.at)
    snap = await cell.idle()
    assert attempts(call_of(snap, "r")["steps"], "CallTool") == [FAILED, COMPLETED]
    assert_ran_again_with_the_key(cell, "lookup", "r")
    assert_one_task_polled(cell, snap, polls=2)
    assert attempts(call_of(snap, "t")["steps"], "PollToolTask") == [FAILED, COMPLETED]
    await cell.send("more")  # over the compaction limit
    started = (await cell.until_ledger("summary", cell.agent))[0]
    await interrupt_before_first_heartbeat(cell, started.at)
    snap = await cell.idle()
    assert [run.attempt for run in cell.ledger.runs("summary", cell.agent, "started")] == [1, 2]
    assert cell.step_attempts("CompactContext") == [FAILED, COMPLETED]
    assert len(cell.committed("summary_updated")) == 1 and snap["summary"] is not None


async def r18(cell: Cell) -> None:
    if cell.worker_kill:
        await r18_waits_end_while_no_worker_runs(cell)
    else:
        await r18_node_dies_after_each_wait_ended(cell)
    snap = await cell.idle()
    assert call_of(snap, "a")["status"] == "succeeded" and call_of(snap, "q")["output"] == "yes"
    assert call_of(snap, "z")["status"] == "succeeded"
    assert [(r.key, r.attempt) for r in cell.ledger.runs("tool", "wire_money", "started")] == [(f"{cell.sid}:a", 1)]
    assert len(cell.committed("approval_decided")) == 1 and len(cell.committed("question_answered")) == 1
    assert len([e for e in cell.committed("timer_fired") if e.data["purpose"] == "sleep"]) == 1
    question_id = cell.committed("question_answered")[0].data["question_id"]
    assert (await cell.client.approve(cell.sid, "a"))["noop"] is True  # still recorded, once
    assert (await cell.client.answer(cell.sid, question_id, "yes"))["noop"] is True


async def r18_waits_end_while_no_worker_runs(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    snap = await cell.until(lambda s: s["pending_approvals"] and s["pending_questions"], "the three waits")
    await cell.fail()
    await cell.client.approve(cell.sid, "a")
    await cell.client.answer(cell.sid, snap["pending_questions"][0]["question_id"], "yes")
    await cell.until(lambda s: call_of(s, "z")["status"] == "succeeded", "the timer to fire")
    snap = await cell.snapshot()  # ended and recorded; the approved tool is queued, unrun
    assert snap["pending_approvals"] == [] and snap["pending_questions"] == []
    assert cell.ledger.count("tool", "wire_money") == 0
    await cell.recover()


async def r18_node_dies_after_each_wait_ended(cell: Cell) -> None:
    await cell.column.arm(WAIT_POINT)
    cell.start_worker()
    await cell.send("go")
    await cell.fail()  # the sleep timer fired on the armed node
    await cell.recover(arm=WAIT_POINT)
    await cell.until(lambda s: s["pending_approvals"], "the approval request")
    decided = asyncio.create_task(cell.client.approve(cell.sid, "a"))
    await cell.fail()  # right after the approval committed
    await cell.recover(arm=WAIT_POINT)
    assert (await decided)["noop"] is True  # the client's retry finds the decision recorded
    snap = await cell.until(lambda s: s["pending_questions"], "the question")
    answered = asyncio.create_task(cell.client.answer(cell.sid, snap["pending_questions"][0]["question_id"], "yes"))
    await cell.fail()
    await cell.recover()
    assert (await answered)["noop"] is True


async def result_in_flight(cell: Cell) -> dict:
    """The tool's result is sent, and the column's process dies at its RESULT_IN_FLIGHT
    point; returns the idle snapshot once the call has its outcome."""
    failpoint = {
        "server_restart": "server.complete.before-propose@2",
        "takeover": "server.complete.after-commit@2",
    }  # the 2nd result is the tool's
    if cell.worker_kill:
        cell.start_worker(failpoints="worker.complete.after-send@2")
    else:
        await cell.column.arm(failpoint[cell.column.name])
        cell.start_worker()
    await cell.send("go")
    await cell.fail()
    if cell.worker_kill:
        assert cell.worker is not None
        cell.worker.failpoints = ""
    await cell.recover()
    return await cell.idle()


async def r19(cell: Cell) -> None:
    snap = await result_in_flight(cell)
    call = call_of(snap, "c1")
    assert (call["status"], call["output"]) == ("succeeded", "done")
    if cell.column.name == "server_restart":  # not committed: the attempt failed, the read ran again
        assert attempts(call["steps"], "CallTool") == [FAILED, COMPLETED]
        assert_ran_again_with_the_key(cell, "lookup", "c1", finished=[1, 2])  # attempt 1's result was lost
    else:  # committed: it stands, and ran once
        assert attempts(call["steps"], "CallTool") == [COMPLETED]
        assert [(r.key, r.attempt) for r in cell.ledger.runs("tool", "lookup", "finished")] == [(f"{cell.sid}:c1", 1)]
        assert cell.ledger.count("tool", "lookup") == 1


async def r19_write(cell: Cell) -> None:
    snap = await result_in_flight(cell)
    call = call_of(snap, "c1")
    key = f"{cell.sid}:c1"
    assert [(r.key, r.attempt) for r in cell.ledger.runs("tool", "send_email", "started")] == [(key, 1)]
    assert [r.attempt for r in cell.ledger.runs("tool", "send_email", "finished")] == [1]  # never again
    if cell.column.name == "server_restart":  # not committed: the attempt failed
        assert (call["status"], call["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")
        assert not call["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
        assert attempts(call["steps"], "CallSingleAttemptTool") == [FAILED]
        assert results_seen(last_model_call(cell)) == {"c1": "outcome_unknown"}
    else:  # committed: it stands
        assert (call["status"], call["output"]) == ("succeeded", "done")
        assert attempts(call["steps"], "CallSingleAttemptTool") == [COMPLETED]


async def r20(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    await cell.until_ledger("tool", "search")
    await cell.interrupt()
    snap = await cell.idle()
    call = call_of(snap, "i1")
    assert (call["status"], call["step_kind"], call["steps"]) == ("succeeded", "RunModel", [])
    assert call["output"] == ["hit"]
    assert [run.attempt for run in cell.ledger.runs("tool", "search", "started")] == [1, 2]  # at-least-once
    assert cell.step_attempts("RunModel") == [FAILED, COMPLETED, COMPLETED]


# ---------------------------------------------------------------- a call that never ran


def seen_by_the_next_model_call(cell: Cell, call_id: str) -> dict:
    """The tool result of `call_id` as the last model call saw it."""
    history = last_model_call(cell).data["history"]
    return next(item for item in history if item["type"] == "tool_result" and item["call_id"] == call_id)


def assert_not_run(cell: Cell, snap: dict, tool: str) -> dict:
    """NOT_STARTED: failed, with the not-run prefix in the record and in what the model saw."""
    call = call_of(snap, "c1")
    assert (call["status"], call["attempt_progress"]) == ("failed", "NOT_STARTED")
    assert call["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX + ": "), call["error"]
    seen = seen_by_the_next_model_call(cell, "c1")
    assert (seen["status"], seen["error"]) == ("failed", call["error"])
    assert cell.ledger.count("tool", tool) == 0
    return call


async def worker_refused(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("refused")
    call = assert_not_run(cell, await cell.idle(), "send_to")
    assert "unexpected" in call["error"]  # why the Worker refused the arguments
    assert attempts(call["steps"], "CallSingleAttemptTool") == [("failed", "NOT_STARTED")]


async def handout_lost(cell: Cell) -> None:
    await cell.column.arm(f"{HANDOUT_POINT}@2")  # the 1st hand-out is the model call, the 2nd the write
    cell.start_worker()
    await cell.send("handout")
    await cell.fail()  # the hand-out of the write committed; the node died before answering
    await cell.recover()
    snap = await cell.idle()
    call = call_of(snap, "c1")
    assert (call["status"], call["attempt_progress"]) == ("outcome_unknown", "NOT_COMPLETED")
    assert not call["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    assert attempts(call["steps"], "CallSingleAttemptTool") == [FAILED]
    assert seen_by_the_next_model_call(cell, "c1")["status"] == "outcome_unknown"
    assert cell.ledger.count("tool", "send_email") == 0  # it never ran, and the call says unknown


async def denied(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("denied")
    await cell.until(lambda s: [a["call_id"] for a in s["pending_approvals"]] == ["c1"], "the approval request")
    await cell.client.deny(cell.sid, "c1", reason="not today")
    call = assert_not_run(cell, await cell.idle(), "wire_money")
    assert call["error"] == f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: the user denied the tool call: not today"
    assert [s["kind"] for s in call["steps"]] == ["AwaitToolApproval"]


# ---------------------------------------------------------------- the exception: a cancelled attempt runs on


def single_attempt_of(snap: dict) -> list[dict]:
    return [a for s in call_of(snap, "c1")["steps"] if s["kind"] == "CallSingleAttemptTool" for a in s["attempts"]]


def assert_unknown_after_cancel(snap: dict) -> None:
    call = call_of(snap, "c1")
    assert (call["status"], call["attempt_progress"], call["output"]) == ("outcome_unknown", "NOT_COMPLETED", None)
    assert not call["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    assert snap["turns"][0]["status"] == "cancelled"


async def cancel_heard(cell: Cell) -> None:
    cell.start_worker()
    await cell.send("go")
    await cell.until_ledger("tool", "send_slowly")
    await cell.client.cancel(cell.sid)
    snap = await cell.until(lambda s: [a["status"] for a in single_attempt_of(s)] == ["failed"], "the attempt to end")
    assert "cancelled" in single_attempt_of(snap)[0]["error"]  # the Worker reported it stopped
    assert_unknown_after_cancel(snap)
    assert cell.ledger.runs("tool", "send_slowly", "finished") == []  # the tool still runs
    cell.ledger.record("signal", RELEASE, "sent")
    await cell.until_ledger("tool", "send_slowly", "finished")  # and does its work after all
    await cell.send("again")
    snap = await cell.idle()
    assert_unknown_after_cancel(snap)
    assert [a["status"] for a in single_attempt_of(snap)] == ["failed"]  # its result was dropped
    assert seen_by_the_next_model_call(cell, "c1")["status"] == "outcome_unknown"
    assert cell.ledger.count("tool", "send_slowly") == 1


async def cancel_late_result(cell: Cell) -> None:
    cell.start_worker(heartbeat_interval_s=SLOW_HEARTBEAT_S)  # the Worker does not hear of the cancel
    await cell.send("go")
    started = (await cell.until_ledger("tool", "send_slowly"))[0]
    await cell.client.cancel(cell.sid)
    assert_unknown_after_cancel(await cell.snapshot())
    cell.ledger.record("signal", RELEASE, "sent")
    snap = await cell.until(
        lambda s: [a["status"] for a in single_attempt_of(s)] in (["completed"], ["failed"]), "the attempt to end"
    )
    assert [a["status"] for a in single_attempt_of(snap)] == ["completed"], single_attempt_of(snap)  # accepted
    finished = cell.ledger.runs("tool", "send_slowly", "finished")
    assert finished[0].at - started.at < SERVER_RESTART_HEARTBEAT_TIMEOUT_MS / 1000, "the result came too late"
    assert_unknown_after_cancel(snap)  # the outcome recorded at the cancel stands
    assert cell.ledger.count("tool", "send_slowly") == 1
