"""The invariants of a robustness run, checked from outside the server.

Each check is a pure function of evidence gathered outside the server: what the clients
were acknowledged and what their reads returned (workload.Acknowledged), the final
session snapshots read through the API after healing, the tool ledger the Workers wrote
(tests/crash/ledger.py), the /readyz record (harness/readiness_record.py), and the dumps
of every node's state.db (replicas.py). Each returns the violations it finds, one line
each; tests/robustness/test_checker.py gives every check evidence that breaks it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dex_ha import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from harness.readiness_record import ProbeRow, overlapping_rounds
from tests.crash.agents import ROBUSTNESS_STEPS
from tests.crash.ledger import Run
from tests.crash.test_soak import check_call
from tests.robustness.replicas import StateDump, dumps_differ
from tests.robustness.workload import Acknowledged, Read, messages_in, pending_approvals_in

LOST = "acknowledged write lost"
STALE_READ = "read missed an acknowledged write"
RAN_TWICE = "single-attempt tool run twice"
CALL_OUTCOME = "tool call outcome"
REPLICAS = "replicas differ"
DENIAL = "denied call ran or not recorded denied"
DEADLINE = "outcome decided by a far deadline"
TWO_READY = "two nodes ready at once"
UNSETTLED = "session not settled"
INVARIANTS = (LOST, STALE_READ, RAN_TWICE, CALL_OUTCOME, DENIAL, DEADLINE, REPLICAS, TWO_READY, UNSETTLED)

SINGLE_ATTEMPT_TOOLS = frozenset(tool for tool, effect in ROBUSTNESS_STEPS.values() if effect == "write")
TIMER_TOOL = "sleep"  # the server's built-in timer: no Worker runs it, so no ledger row
SETTLED_TURNS = ("completed", "failed")
DENIED_ERROR = f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: the user denied the tool call"
# Every step's start_to_close timeout is minutes long (dex_ha/engine/kinds.py); no run of the
# suite comes near one, so an outcome it decides was judged by a wall clock that jumped.
FAR_DEADLINE_ERROR = "start_to_close"


@dataclass(frozen=True)
class Evidence:
    acked: Acknowledged
    snapshots: dict[str, dict[str, Any] | None]  # session -> final snapshot (None: 404)
    tool_runs: list[Run]  # the ledger's tool rows
    readiness: list[ProbeRow]
    dumps: dict[str, StateDump]  # node -> its state after every node stopped


def check_acknowledged(acked: Acknowledged, snapshots: dict[str, dict[str, Any] | None]) -> list[str]:
    """Every acknowledged session, message, approval and denial is in the final snapshots."""
    lost = []
    for session_id in acked.sessions:
        snapshot = snapshots.get(session_id)
        if snapshot is None:
            lost.append(f"session {session_id} was acknowledged, and is not found after healing")
            continue
        held = messages_in(snapshot)
        lost += [
            f"message {m} of {session_id} was acknowledged, and is lost"
            for m in acked.messages[session_id]
            if m not in held
        ]
        pending = pending_approvals_in(snapshot)
        lost += [
            f"{decision} of {session_id}:{c} was acknowledged, and the call still waits for approval"
            for decision, calls in (("approval", acked.approvals), ("denial", acked.denials))
            for c in calls[session_id]
            if c in pending
        ]
    return lost


def check_reads(reads: Iterable[Read]) -> list[str]:
    """Every read sees what was acknowledged to its session before it was sent."""
    stale = []
    for read in reads:
        if not read.found:
            stale.append(f"a read of {read.session_id} answered 404 after the session was acknowledged")
            continue
        stale += [
            f"a read of {read.session_id} missed acknowledged message {m}"
            for m in sorted(read.acked_messages - read.seen_messages)
        ]
        stale += [
            f"a read of {read.session_id} shows {c} waiting for approval after its approval was acknowledged"
            for c in sorted(read.acked_approvals & read.pending_approvals)
        ]
    return stale


def check_single_attempt(runs: Iterable[Run]) -> list[str]:
    """No single-attempt tool started twice for one call (the ledger, whatever the server says)."""
    starts = Counter(run.call_id for run in runs if run.moment == "started" and run.name in SINGLE_ATTEMPT_TOOLS)
    return [f"{call}: the single-attempt tool started {n} times" for call, n in sorted(starts.items()) if n > 1]


def check_calls(snapshots: dict[str, dict[str, Any] | None], runs: list[Run]) -> list[str]:
    """Each call ends in a status its effect allows and agrees with the ledger (the soak's
    rules, tests/crash/test_soak.check_call); a timer fired; no tool ran for a call the
    server does not have."""
    started: dict[str | None, list[Run]] = {}
    for run in runs:
        if run.moment == "started":
            started.setdefault(run.call_id, []).append(run)
    finished = {run.call_id for run in runs if run.moment == "finished"}
    problems = []
    known = set()
    for session_id, snapshot in snapshots.items():
        for call in (snapshot or {}).get("tool_calls", []):
            identity = f"{session_id}:{call['call_id']}"
            known.add(identity)
            if call["name"] == TIMER_TOOL:
                if call["status"] != "succeeded":
                    problems.append(f"{identity}: a timer ended {call['status']}")
                continue
            ran = started.get(identity, [])
            if call["effect"] == "write":
                ran = ran[:1]  # a second run is check_single_attempt's, reported once
            problems += check_call(
                identity, call["effect"], call["status"], call.get("error") or "", ran, identity in finished
            )
    problems += [
        f"{call}: the ledger has a run of a call no session holds" for call in sorted(set(started) - known, key=str)
    ]
    return problems


def check_denials(acked: Acknowledged, snapshots: dict[str, dict[str, Any] | None], runs: list[Run]) -> list[str]:
    """A denied call records failed with the not-run prefix and its tool never ran (the
    ledger has no run); an approved call is never recorded as denied."""
    started = Counter(run.call_id for run in runs if run.moment == "started")
    problems = []
    for session_id in acked.sessions:
        calls = {call["call_id"]: call for call in (snapshots.get(session_id) or {}).get("tool_calls", [])}
        for call_id in acked.denials[session_id]:
            identity = f"{session_id}:{call_id}"
            call = calls.get(call_id)
            if call is None:
                problems.append(f"{identity}: denied, and the session has no such call")
                continue
            if call["status"] != "failed" or not (call.get("error") or "").startswith(DENIED_ERROR):
                problems.append(f"{identity}: denied, and recorded {call['status']}: {call.get('error')!r}")
            if started[identity]:
                problems.append(f"{identity}: denied, and the ledger has {started[identity]} run(s) of its tool")
        for call_id in acked.approvals[session_id]:
            error = (calls.get(call_id) or {}).get("error") or ""
            if error.startswith(DENIED_ERROR):
                problems.append(f"{session_id}:{call_id}: approved, and recorded as denied: {error!r}")
    return problems


def check_far_deadlines(snapshots: dict[str, dict[str, Any] | None]) -> list[str]:
    """No call and no turn ended by a start_to_close timeout: they are minutes long, and no
    run comes near one, so such an end means a wall-clock step decided an outcome."""
    problems = []
    for session_id, snapshot in snapshots.items():
        for call in (snapshot or {}).get("tool_calls", []):
            if FAR_DEADLINE_ERROR in (call.get("error") or ""):
                problems.append(f"{session_id}:{call['call_id']}: ended {call['status']}: {call['error']!r}")
        for turn in (snapshot or {}).get("turns", []):
            if FAR_DEADLINE_ERROR in (turn.get("error") or ""):
                problems.append(f"{session_id}: turn {turn['number']} ended {turn['status']}: {turn['error']!r}")
    return problems


def check_readiness(rows: Iterable[ProbeRow]) -> list[str]:
    """Never two nodes answering /readyz 200 in one round of the record."""
    return [f"round {r}: {' and '.join(nodes)} answered /readyz 200" for r, nodes in overlapping_rounds(rows)]


def check_settled(snapshots: dict[str, dict[str, Any] | None]) -> list[str]:
    """Every session is idle with its turns ended, or waits for a person (an approval, an answer)."""
    unsettled = []
    for session_id, snapshot in snapshots.items():
        if snapshot is None:
            continue  # a lost session is check_acknowledged's
        waits_for_person = snapshot["pending_approvals"] or snapshot["pending_questions"]
        idle = snapshot["status"] == "idle" and not snapshot["waiting_messages"]
        if not (idle or waits_for_person):
            unsettled.append(
                f"{session_id} is {snapshot['status']} with {len(snapshot['waiting_messages'])} waiting messages"
            )
        unsettled += [
            f"{session_id}: turn {t['number']} ended {t['status']}"
            for t in snapshot["turns"]
            if idle and t["status"] not in SETTLED_TURNS
        ]
    return unsettled


def check_all(evidence: Evidence) -> dict[str, list[str]]:
    """Invariant -> its violations (every invariant is a key, most with an empty list)."""
    return {
        LOST: check_acknowledged(evidence.acked, evidence.snapshots),
        STALE_READ: check_reads(evidence.acked.reads),
        RAN_TWICE: check_single_attempt(evidence.tool_runs),
        CALL_OUTCOME: check_calls(evidence.snapshots, evidence.tool_runs),
        DENIAL: check_denials(evidence.acked, evidence.snapshots, evidence.tool_runs),
        DEADLINE: check_far_deadlines(evidence.snapshots),
        REPLICAS: dumps_differ(evidence.dumps),
        TWO_READY: check_readiness(evidence.readiness),
        UNSETTLED: check_settled(evidence.snapshots),
    }


def operations_checked(evidence: Evidence) -> Counter[str]:
    """What the checks covered, by kind (the report's second table)."""
    ops: Counter[str] = Counter()
    acked = evidence.acked
    ops["sessions acknowledged"] = len(acked.sessions)
    ops["messages acknowledged"] = sum(len(m) for m in acked.messages.values())
    ops["approvals acknowledged"] = sum(len(a) for a in acked.approvals.values())
    ops["denials acknowledged"] = sum(len(d) for d in acked.denials.values())
    ops["snapshot reads"] = len(acked.reads)
    for snapshot in evidence.snapshots.values():
        for call in (snapshot or {}).get("tool_calls", []):
            kind = "timer" if call["name"] == TIMER_TOOL else call["effect"]
            ops[f"tool calls: {kind} {call['status']}"] += 1
    ops["tool runs in the ledger"] = sum(1 for run in evidence.tool_runs if run.moment == "started")
    ops["readiness rounds"] = len({row.round for row in evidence.readiness})
    ops["replica tables compared"] = sum(len(d.tables) for d in evidence.dumps.values())
    return ops
