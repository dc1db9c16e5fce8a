"""The checker can fail: each invariant check, given evidence that breaks it, reports a
violation, and given the same evidence unbroken, reports none. Synthetic evidence only: no
cluster, no process."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from dex_ha.server.node import STATE_DB
from harness.readiness_record import ProbeRow
from tests.crash.ledger import Ledger, Run
from tests.robustness import checker
from tests.robustness.replicas import dump_state, dumps_differ
from tests.robustness.workload import Acknowledged, Read

SID = "s1-0"


def snapshot(
    messages: list[str] = ["m0", "m1"],  # noqa: B006  (never mutated)
    waiting: list[str] = [],  # noqa: B006
    pending_approvals: list[str] = [],  # noqa: B006
    status: str = "idle",
    turn_status: str = "completed",
    calls: list[dict[str, Any]] = [],  # noqa: B006
) -> dict[str, Any]:
    """A session snapshot as GET /v1/sessions/{id} answers it (the fields the checks read)."""
    return {
        "status": status,
        "turns": [{"number": i + 1, "message_id": m, "status": turn_status} for i, m in enumerate(messages)],
        "waiting_messages": [{"message_id": m} for m in waiting],
        "pending_approvals": [{"call_id": c} for c in pending_approvals],
        "pending_questions": [],
        "tool_calls": calls,
    }


def acknowledged(
    messages: list[str] = ["m0", "m1"],  # noqa: B006  (never mutated)
    approvals: list[str] = [],  # noqa: B006
    denials: list[str] = [],  # noqa: B006
) -> Acknowledged:
    acked = Acknowledged(sessions=[SID])
    acked.messages[SID] = list(messages)
    acked.approvals[SID] = list(approvals)
    acked.denials[SID] = list(denials)
    return acked


def run(name: str, call: str, moment: str = "started", key: str | None = None) -> Run:
    return Run(0, "tool", name, moment, f"{SID}:{call}", key or f"{SID}:{call}", 1, {}, 1, 0.0)


def call(call_id: str, name: str, effect: str, status: str = "succeeded", error: str | None = None) -> dict[str, Any]:
    return {"call_id": call_id, "name": name, "effect": effect, "status": status, "error": error}


# ---------------------------------------------------------------- acknowledged writes


def test_every_acknowledged_write_found_is_no_violation() -> None:
    assert checker.check_acknowledged(acknowledged(approvals=["c1"]), {SID: snapshot()}) == []
    queued = snapshot(messages=["m0"], waiting=["m1"])  # a waiting message is kept too
    assert checker.check_acknowledged(acknowledged(), {SID: queued}) == []


def test_a_missing_acknowledged_message_is_a_violation() -> None:
    [line] = checker.check_acknowledged(acknowledged(), {SID: snapshot(messages=["m0"])})
    assert "message m1" in line and "lost" in line


def test_a_missing_acknowledged_session_is_a_violation() -> None:
    [line] = checker.check_acknowledged(acknowledged(), {SID: None})
    assert f"session {SID}" in line


def test_an_acknowledged_approval_still_pending_is_a_violation() -> None:
    [line] = checker.check_acknowledged(acknowledged(approvals=["c1"]), {SID: snapshot(pending_approvals=["c1"])})
    assert "c1" in line and "approval" in line


def test_an_acknowledged_denial_still_pending_is_a_violation() -> None:
    [line] = checker.check_acknowledged(acknowledged(denials=["c1"]), {SID: snapshot(pending_approvals=["c1"])})
    assert "c1" in line and "denial" in line


# ---------------------------------------------------------------- reads


def test_a_read_that_misses_an_acknowledged_write_is_a_violation() -> None:
    fresh = Read(SID, frozenset({"m0"}), frozenset({"c1"}), True, frozenset({"m0", "m1"}), frozenset())
    assert checker.check_reads([fresh]) == []
    stale_message = Read(SID, frozenset({"m0", "m1"}), frozenset(), True, frozenset({"m0"}), frozenset())
    stale_approval = Read(SID, frozenset(), frozenset({"c1"}), True, frozenset(), frozenset({"c1"}))
    not_found = Read(SID, frozenset(), frozenset(), False)
    lines = checker.check_reads([stale_message, stale_approval, not_found])
    assert len(lines) == 3
    assert "missed acknowledged message m1" in lines[0]
    assert "c1" in lines[1] and "404" in lines[2]


# ---------------------------------------------------------------- tools


def test_a_single_attempt_tool_run_twice_is_a_violation(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")  # the ledger's own rows, as the Workers write them
    for attempt in (1, 2):
        ledger.record("tool", "send_note", "started", call_id=f"{SID}:m0-write", key=f"{SID}:m0-write", attempt=attempt)
    ledger.record("tool", "put_item", "started", call_id=f"{SID}:m0-idem", attempt=1)
    ledger.record("tool", "put_item", "started", call_id=f"{SID}:m0-idem", attempt=2)  # idempotent: may repeat
    [line] = checker.check_single_attempt(ledger.runs("tool"))
    assert "m0-write" in line and "2 times" in line
    ledger.close()


def test_call_outcomes_agree_with_the_ledger() -> None:
    runs = [run("send_note", "m0-write"), run("send_note", "m0-write", "finished")]
    calls = [call("m0-write", "send_note", "write"), call("m0-sleep", "sleep", "read")]
    assert checker.check_calls({SID: snapshot(calls=calls)}, runs) == []


def test_a_call_outcome_the_ledger_contradicts_is_a_violation() -> None:
    never_finished = [run("send_note", "m0-write")]
    assert checker.check_calls({SID: snapshot(calls=[call("m0-write", "send_note", "write")])}, never_finished)
    wrong_key = [run("put_item", "m0-idem", key="other"), run("put_item", "m0-idem", "finished")]
    assert checker.check_calls({SID: snapshot(calls=[call("m0-idem", "put_item", "idempotent_write")])}, wrong_key)
    failed_timer = [call("m0-sleep", "sleep", "read", status="failed")]
    assert checker.check_calls({SID: snapshot(calls=failed_timer)}, []) == [f"{SID}:m0-sleep: a timer ended failed"]
    [line] = checker.check_calls({SID: snapshot()}, [run("send_note", "m9-write")])
    assert "no session holds" in line


DENIED = f"{checker.DENIED_ERROR}: denied by the robustness workload"


def test_a_denied_call_recorded_failed_with_the_prefix_and_never_run_is_no_violation() -> None:
    denied = call("m0-approve", "wire_money", "write", status="failed", error=DENIED)
    approved = call("m1-approve", "wire_money", "write")
    acked = acknowledged(approvals=["m1-approve"], denials=["m0-approve"])
    runs = [run("wire_money", "m1-approve"), run("wire_money", "m1-approve", "finished")]
    assert checker.check_denials(acked, {SID: snapshot(calls=[denied, approved])}, runs) == []


def test_a_denied_call_that_ran_or_is_not_recorded_denied_is_a_violation() -> None:
    acked = acknowledged(denials=["m0-approve"])
    denied = call("m0-approve", "wire_money", "write", status="failed", error=DENIED)
    [ran] = checker.check_denials(acked, {SID: snapshot(calls=[denied])}, [run("wire_money", "m0-approve")])
    assert "m0-approve" in ran and "1 run(s)" in ran
    no_prefix = call("m0-approve", "wire_money", "write", status="failed", error="the user denied the tool call")
    [line] = checker.check_denials(acked, {SID: snapshot(calls=[no_prefix])}, [])
    assert "denied, and recorded failed" in line
    succeeded = call("m0-approve", "wire_money", "write")
    assert checker.check_denials(acked, {SID: snapshot(calls=[succeeded])}, [])
    assert checker.check_denials(acked, {SID: snapshot()}, [])  # the denied call is missing


def test_an_approved_call_recorded_as_denied_is_a_violation() -> None:
    acked = acknowledged(approvals=["m0-approve"])
    denied = call("m0-approve", "wire_money", "write", status="failed", error=DENIED)
    [line] = checker.check_denials(acked, {SID: snapshot(calls=[denied])}, [])
    assert "approved, and recorded as denied" in line


def test_an_outcome_decided_by_a_start_to_close_timeout_is_a_violation() -> None:
    timed_out = "the outcome is unknown: the tool may have run and will not run again "
    timed_out += "(the attempt ran past its start_to_close timeout)"
    killed = "the outcome is unknown: the tool may have run and will not run again (heartbeat timeout)"
    calls = [
        call("m0-write", "send_note", "write", status="outcome_unknown", error=timed_out),
        call("m1-write", "send_note", "write", status="outcome_unknown", error=killed),
    ]
    [line] = checker.check_far_deadlines({SID: snapshot(calls=calls)})
    assert "m0-write" in line and "outcome_unknown" in line
    turn_failed = snapshot(turn_status="failed")
    turn_failed["turns"][0]["error"] = "run_model failed: the attempt ran past its start_to_close timeout"
    [line] = checker.check_far_deadlines({SID: turn_failed})
    assert "turn 1 ended failed" in line


# ---------------------------------------------------------------- readiness


def test_two_nodes_ready_in_one_round_is_a_violation() -> None:
    handover = [ProbeRow(1, 0.0, "n1", 200), ProbeRow(1, 0.0, "n2", 503), ProbeRow(2, 0.1, "n1", None)]
    handover += [ProbeRow(2, 0.1, "n2", 200)]
    assert checker.check_readiness(handover) == []
    overlap = handover + [ProbeRow(3, 0.2, "n1", 200), ProbeRow(3, 0.2, "n2", 200)]
    assert checker.check_readiness(overlap) == ["round 3: n1 and n2 answered /readyz 200"]


# ---------------------------------------------------------------- settled sessions


def test_a_session_still_running_after_healing_is_a_violation() -> None:
    waits_for_approval = snapshot(status="running", turn_status="running", pending_approvals=["c1"])
    assert checker.check_settled({SID: snapshot(), "s1-1": waits_for_approval}) == []
    running = snapshot(status="running", turn_status="running")
    assert checker.check_settled({SID: running}) == [f"{SID} is running with 0 waiting messages"]
    assert checker.check_settled({SID: snapshot(turn_status="cancelled")})


# ---------------------------------------------------------------- replicas


def state_db(directory: Path, applied: int, accounts: list[str]) -> Path:
    directory.mkdir()
    db = sqlite3.connect(directory / STATE_DB)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    db.execute("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, metadata TEXT)")
    db.execute("INSERT INTO meta VALUES ('applied_index', ?), ('fenced_term', 3)", (applied,))
    db.executemany("INSERT INTO sessions VALUES (?, ?)", [(f"s{i}", a) for i, a in enumerate(accounts)])
    db.commit()
    db.close()
    return directory


def test_equal_replicas_compare_equal_and_a_changed_row_is_a_violation(tmp_path: Path) -> None:
    dumps = {n: dump_state(state_db(tmp_path / n, 7, ["account-1111"])) for n in ("n1", "n2")}
    assert dumps_differ(dumps) == []
    dumps["n3"] = dump_state(state_db(tmp_path / "n3", 7, ["account-9999"]))
    [line] = dumps_differ(dumps)
    assert "table sessions" in line and "account-9999" in line and "n3" in line


def test_replicas_at_different_applied_indexes_are_not_compared(tmp_path: Path) -> None:
    dumps = {"n1": dump_state(state_db(tmp_path / "n1", 7, [])), "n2": dump_state(state_db(tmp_path / "n2", 8, []))}
    [line] = dumps_differ(dumps)
    assert "different applied indexes" in line


def test_check_all_names_every_invariant() -> None:
    evidence = checker.Evidence(acknowledged(), {SID: snapshot()}, [], [], {})
    assert checker.check_all(evidence) == {name: [] for name in checker.INVARIANTS}
