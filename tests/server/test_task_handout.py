"""A Worker's task is built from the hand-out the apply reported, with no read of the
state on the leader's side: the reader connection's page cache is cold after every write,
and those reads cost more than the rest of the hand-out."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from dex_ha.engine import StartQueuedAttempts
from dex_ha.engine.kinds import DEFAULT_HEARTBEAT_TIMEOUT_MS
from dex_ha.server.leader import ActiveClock, LeaderTerm
from dex_ha.server.metrics import ServerMetrics
from dex_ha.server.replica import Replica
from dex_ha.server.task_tokens import TaskToken
from tests.engine.driver import AGENT, Driver


class NoReads:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the hand-out read the state: {name}")


async def test_a_task_is_built_from_its_hand_out_without_reading_the_state() -> None:
    d = Driver(":memory:")
    d.register()
    d.create("s1")
    d.send("hello")
    result = d.ok(StartQueuedAttempts(at=d.at, worker_id="w1", term=d.term, agents=[AGENT], token_secrets=["sec"]))
    [started] = result.accepted_value().started

    async def propose(cmd: Any) -> Any:
        raise AssertionError("nothing is proposed")

    replica = cast(Replica, SimpleNamespace(reads=NoReads()))  # a stand-in whose every read fails the test
    leader = LeaderTerm(
        d.term,
        replica,
        propose,
        ServerMetrics(),
        clock=ActiveClock(),
        heartbeat_timeout_ms=DEFAULT_HEARTBEAT_TIMEOUT_MS,
    )
    body = leader.task_for_handout(started, "w1")

    from_tables = d.engine.task_for(started.step_id, DEFAULT_HEARTBEAT_TIMEOUT_MS)
    assert from_tables is not None and from_tables.input["history"] == [{"type": "user", "text": "hello"}]
    token = TaskToken(started.step_id, 1, d.term, "sec")
    assert body == {**from_tables.as_json(), "task_token": str(token)}
    assert (started.step_id, 1) in leader.running  # its heartbeats are watched from now on
