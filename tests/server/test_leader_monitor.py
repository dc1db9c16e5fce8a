"""The leader's heartbeat monitor must not fail an attempt in the moment between its
hand-out's commit and the poll answer that registers it (found by the crash matrix: a
fresh attempt failed as heartbeat_timeout within milliseconds of its hand-out)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from dex_ha.engine import ApplyResult, AttemptTimedOut, HeartbeatLost, RunningAttempt
from dex_ha.server.leader import ActiveClock, HandedOutAttempt, LeaderTerm
from dex_ha.server.metrics import ServerMetrics
from dex_ha.server.replica import Replica

TERM = 3


def leader_with(attempt: RunningAttempt, proposed: list[Any]) -> LeaderTerm:
    reads = SimpleNamespace(running_attempts=lambda term=None, term_lt=None: [attempt])

    async def propose(cmd: Any) -> ApplyResult:
        proposed.append(cmd)
        return ApplyResult(index=1, ok=True)

    replica = cast(Replica, SimpleNamespace(reads=reads))  # a stand-in: the monitor reads only `reads`
    leader = LeaderTerm(TERM, replica, propose, ServerMetrics(), clock=ActiveClock(), heartbeat_timeout_ms=1_000)
    leader._started_mono = time.monotonic() - 60  # a leader of long standing
    return leader


def running(started_at: int, deadline_at: int | None = None) -> RunningAttempt:
    return RunningAttempt(
        step_id="st1",
        attempt=2,
        term=TERM,
        worker_id="w",
        session_id="s1",
        kind="CallTool",
        started_at=started_at,
        deadline_at=deadline_at,
        cancel_requested=False,
    )


async def test_an_attempt_handed_out_just_now_and_not_yet_registered_is_not_failed() -> None:
    proposed: list[Any] = []
    await leader_with(running(started_at=int(time.time() * 1000)), proposed)._fail_silent_and_late_attempts()
    assert proposed == []


async def test_an_unregistered_attempt_silent_past_the_timeout_is_failed() -> None:
    proposed: list[Any] = []
    await leader_with(running(started_at=int(time.time() * 1000) - 5_000), proposed)._fail_silent_and_late_attempts()
    assert [type(cmd) for cmd in proposed] == [HeartbeatLost]


@pytest.mark.parametrize("step_s", [3600, -3600])
async def test_a_wall_clock_step_on_the_active_node_changes_no_deadline(monkeypatch, step_s: int) -> None:
    """A registered attempt heartbeating, 10 s into a 60 s start_to_close: a step of the wall
    clock by an hour either way neither times it out nor makes it outlive its deadline."""
    proposed: list[Any] = []
    clock = ActiveClock()
    handed_out = clock.now_ms()
    leader = leader_with(running(started_at=handed_out, deadline_at=handed_out + 60_000), proposed)
    leader.clock = clock
    leader.running[("st1", 2)] = HandedOutAttempt("st1", 2, "s1", "CallTool", "w1", time.monotonic(), None, "t1")
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + step_s)
    await leader._fail_silent_and_late_attempts()
    assert proposed == []
    # Elapsed time still counts: 61 s later on the monotonic clock, the deadline has passed.
    real_monotonic = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + 61)
    leader.running[("st1", 2)].last_seen = time.monotonic()
    await leader._fail_silent_and_late_attempts()
    assert [type(cmd) for cmd in proposed] == [AttemptTimedOut]
