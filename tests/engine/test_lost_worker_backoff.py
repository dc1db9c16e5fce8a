"""A lost Worker's retry backoff counts from when the Worker was last heard from.

HeartbeatLost carries `silent_ms`: how long the leader had not heard from the Worker when it
failed the attempt (a closed channel's grace, a heartbeat timeout). That much of the
backoff has passed already, so a Worker found dead after the channel's 1 s grace has its
RunModel step queued again at once instead of after one more second (RunModel's first
backoff is 1 s).
"""

from __future__ import annotations

import pytest

from dex_ha.engine import HeartbeatLost
from dex_ha.engine.kinds import STEP_KINDS
from tests.engine.driver import Driver

FIRST_BACKOFF_MS = STEP_KINDS["RunModel"].backoff_initial_ms


@pytest.fixture
def d(tmp_path):
    driver = Driver(str(tmp_path / "engine.db"))
    driver.register()
    driver.create()
    driver.send("go")
    yield driver
    driver.engine.close()


def lose_the_worker(d: Driver, silent_ms: int) -> None:
    step_id = d.hand_out("RunModel")
    attempt = d.running(step_id)
    d.tick(silent_ms)
    d.ok(HeartbeatLost(at=d.at, step_id=step_id, attempt=attempt.attempt, term=attempt.term, silent_ms=silent_ms))


@pytest.mark.parametrize(
    ("silent_ms", "backoff_left_ms"),
    [
        (0, FIRST_BACKOFF_MS),  # entries written before the field: the whole backoff
        (FIRST_BACKOFF_MS // 4, FIRST_BACKOFF_MS - FIRST_BACKOFF_MS // 4),
        (FIRST_BACKOFF_MS, 0),  # the channel's grace covered it
        (30_000, 0),  # a heartbeat timeout: never a negative due time
    ],
)
def test_the_backoff_left_is_what_the_silence_did_not_cover(d: Driver, silent_ms: int, backoff_left_ms: int) -> None:
    assert FIRST_BACKOFF_MS > 0
    lose_the_worker(d, silent_ms)
    timer = d.engine.next_timer()
    assert timer is not None and timer.purpose == "backoff"
    assert timer.due_at == d.at + backoff_left_ms


def test_a_fully_covered_backoff_queues_the_step_when_its_timer_fires_now(d: Driver) -> None:
    lose_the_worker(d, FIRST_BACKOFF_MS)
    assert d.fire_due() == 1  # due at `at`: nothing more to wait
    assert d.next_step("RunModel")  # queued again for the next Worker
