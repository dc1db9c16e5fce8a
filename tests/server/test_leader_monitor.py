"""The leader's heartbeat monitor must not fail an attempt in the moment between its
hand-out's commit and the poll answer that registers it (found by the crash matrix: a
fresh attempt failed as heartbeat_timeout within milliseconds of its hand-out)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from dex_ha.engine import ApplyResult, HeartbeatLost, RunningAttempt
from dex_ha.server.leader import LeaderTerm, wall_ms
from dex_ha.server.metrics import ServerMetrics

TERM = 3


def leader_with(attempt: RunningAttempt, proposed: list[Any]) -> LeaderTerm:
    reads = SimpleNamespace(running_attempts=lambda term=None, term_lt=None: [attempt])

    async def propose(cmd: Any) -> ApplyResult:
        proposed.append(cmd)
        return ApplyResult(index=1, ok=True)

    leader = LeaderTerm(TERM, SimpleNamespace(reads=reads), propose, ServerMetrics(), heartbeat_timeout_ms=1_000)
    leader._started_mono = time.monotonic() - 60  # a leader of long standing
    return leader


def running(started_at: int) -> RunningAttempt:
    return RunningAttempt(
        step_id="st1",
        attempt=2,
        term=TERM,
        worker_id="w",
        session_id="s1",
        kind="CallTool",
        started_at=started_at,
        deadline_at=None,
        cancel_requested=False,
    )


async def test_an_attempt_handed_out_just_now_and_not_yet_registered_is_not_failed() -> None:
    proposed: list[Any] = []
    await leader_with(running(started_at=wall_ms()), proposed)._fail_silent_and_late_attempts()
    assert proposed == []


async def test_an_unregistered_attempt_silent_past_the_timeout_is_failed() -> None:
    proposed: list[Any] = []
    await leader_with(running(started_at=wall_ms() - 5_000), proposed)._fail_silent_and_late_attempts()
    assert [type(cmd) for cmd in proposed] == [HeartbeatLost]
