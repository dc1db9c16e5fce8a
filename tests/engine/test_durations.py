"""Durations that come from input (tool timeouts, sleeps, poll delays) and the backoff the
engine computes stay small enough that `at` + the duration is a 64-bit integer: a due time
or deadline SQLite cannot store would make the command fail to apply, and the leader
service that proposes it (dispatch, timers, monitor) would propose it again and again.
"""

from __future__ import annotations

import pytest

from dex_ha import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from dex_ha.engine import Handout, RegisterAgent, StartAttempts, StepKind
from dex_ha.engine.kinds import MAX_DURATION_MS, retry_decision
from tests.engine.driver import AGENT, Driver

INT64_MAX = 2**63 - 1


@pytest.fixture
def d(tmp_path):
    driver = Driver(str(tmp_path / "engine.db"))
    yield driver
    driver.engine.close()


@pytest.mark.parametrize("where", ["tool", "model"])
def test_a_start_to_close_timeout_over_ten_years_is_refused_naming_the_field(d, where):
    tool = {"name": "crawl", "effect": "read"}
    model: dict = {}
    (tool if where == "tool" else model)["start_to_close_ms"] = INT64_MAX
    result = d.apply(RegisterAgent(at=d.at, name=AGENT, definition={"tools": [tool], "model": model}))
    assert result.code == "invalid" and "start_to_close_ms must be at most" in result.reason
    (tool if where == "tool" else model)["start_to_close_ms"] = MAX_DURATION_MS
    assert d.apply(RegisterAgent(at=d.at, name=AGENT, definition={"tools": [tool], "model": model})).ok


def test_the_longest_timeout_still_hands_out(d):
    d.register([{"name": "crawl", "effect": "read", "start_to_close_ms": MAX_DURATION_MS}])
    d.create()
    d.send("go")
    d.run_model("", [("c1", "crawl", {})])
    step_id = d.next_step("CallTool")
    started = d.apply(StartAttempts(at=d.at, handouts=[Handout(step_id=step_id, worker_id="w1", term=d.term)]))
    assert started.ok and started.value.started[0].deadline_at == d.at + MAX_DURATION_MS


def test_a_sleep_longer_than_ten_years_fails_the_call_not_the_command(d):
    d.register()
    d.create()
    d.send("go")
    d.run_model("", [("z", "sleep", {"ms": INT64_MAX})])  # run_model asserts the result is ok
    assert d.call("z")["status"] == "failed"
    assert d.call("z")["error"].startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    assert d.engine.next_timer() is None


def test_a_poll_delay_longer_than_ten_years_is_an_invalid_result(d):
    d.register()
    d.create()
    d.send("go")
    d.run_model("", [("t", "build", {})])
    result = d.complete(d.hand_out("CallTool"), {"status": "task", "handle": "h", "poll_after_ms": INT64_MAX})
    assert result.code == "invalid" and "poll_after_ms" in result.reason


def test_backoff_stays_a_storable_duration_however_many_attempts_a_tool_allows():
    at = 1_700_000_000_000
    for attempts_used in (1, 2, 40, 80, 10_000):
        decision = retry_decision(
            StepKind.CALL_TOOL,
            max_attempts=10**9,
            attempts_used=attempts_used,
            retryable=True,
            first_handout_at=at,
            at=at,
        )
        assert decision.retry and at + decision.delay_ms <= INT64_MAX
    assert (
        retry_decision(
            StepKind.CALL_TOOL, max_attempts=3, attempts_used=2, retryable=True, first_handout_at=at, at=at
        ).delay_ms
        == 2_000
    )  # the usual backoff is unchanged
