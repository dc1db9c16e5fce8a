"""A poll's hand-outs (StartQueuedAttempts): the steps at the heads of the poll's agents'
queues as they are when the entry applies, whichever session they belong to.

The leader counts the queued steps when it matches a poll, but results applied before the
poll's entry take the head of the same queue (eager dispatch). A hand-out that named its
steps then missed them all under a backlog; one that takes the head when it applies
cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

from dex_ha.engine import Engine, StartedAttempt, StartQueuedAttempts
from dex_ha.engine.handlers import MAX_QUEUED_HANDOUTS
from tests.engine.driver import AGENT, Driver
from tests.engine.test_eager_dispatch import complete_eagerly, model_result


def poll_handout(d: Driver, n: int, agents: list[str] | None = None, worker: str = "w2") -> list[StartedAttempt]:
    result = d.ok(
        StartQueuedAttempts(
            at=d.at,
            worker_id=worker,
            term=d.term,
            agents=agents or [AGENT],
            token_secrets=[f"secret-{d.index}-{i}" for i in range(n)],
        )
    )
    return list(result.accepted_value().started)


def queue_model_steps(d: Driver, sessions: list[str]) -> None:
    for sid in sessions:
        d.create(sid)
        d.send(session_id=sid)


def test_a_poll_gets_the_steps_at_the_head_when_its_entry_applies(tmp_path: Path) -> None:
    """The leader counted s1, s2, s3 queued; a result took s1 before the poll's entry
    applied: the poll gets s2 and s3, not nothing."""
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    queue_model_steps(d, ["s0"])
    running = d.hand_out("RunModel")
    queue_model_steps(d, ["s1", "s2", "s3"])
    assert d.engine.count_queued(AGENT, 100) == 3  # what the leader read for the poll
    eager = complete_eagerly(d, running, {"content": "done", "tool_calls": []}, worker="w1", limit=1)
    assert [s.session_id for s in eager.value.started] == ["s1"]

    started = poll_handout(d, 2)
    assert [(s.session_id, s.kind, s.worker_id) for s in started] == [
        ("s2", "RunModel", "w2"),
        ("s3", "RunModel", "w2"),
    ]
    assert [s.token_secret for s in started] == [f"secret-{d.index - 1}-0", f"secret-{d.index - 1}-1"]
    assert d.queued() == []
    assert {a.step_id for a in d.engine.running_attempts()} == {s.step_id for s in [*eager.value.started, *started]}


def test_it_takes_the_agents_in_the_order_the_poll_names_them_and_no_more_than_asked(tmp_path: Path) -> None:
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    d.register(name="other")
    queue_model_steps(d, ["a1", "a2"])
    d.create("b1", agent="other")
    d.send(session_id="b1")

    started = poll_handout(d, 2, agents=["other", AGENT])
    assert [s.session_id for s in started] == ["b1", "a1"]
    assert [s.session_id for s in d.queued()] == ["a2"]


def test_with_fewer_steps_queued_than_asked_it_starts_those_and_with_none_nothing(tmp_path: Path) -> None:
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    queue_model_steps(d, ["s1"])
    assert [s.session_id for s in poll_handout(d, 5)] == ["s1"]
    before = d.engine.logical_dump(include_applied_index=False)
    assert poll_handout(d, 5) == []
    assert d.engine.logical_dump(include_applied_index=False) == before


@pytest.mark.parametrize(
    "agents, secrets, why",
    [
        ([], 1, "agents must not be empty"),
        ([AGENT], 0, "token_secrets must hold"),
        ([AGENT], MAX_QUEUED_HANDOUTS + 1, "token_secrets must hold"),
        (["x" * 201], 1, "agents must be 1 to"),
    ],
)
def test_a_malformed_poll_handout_is_rejected_and_changes_nothing(
    tmp_path: Path, agents: list[str], secrets: int, why: str
) -> None:
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    queue_model_steps(d, ["s1"])
    before = d.engine.logical_dump(include_applied_index=False)
    result = d.apply(
        StartQueuedAttempts(at=d.at, worker_id="w", term=d.term, agents=agents, token_secrets=["s"] * secrets)
    )
    assert not result.ok and result.code == "invalid" and why in result.reason
    assert d.engine.logical_dump(include_applied_index=False) == before


def test_replaying_the_log_gives_the_same_state(tmp_path: Path) -> None:
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    queue_model_steps(d, ["s1", "s2"])
    first = poll_handout(d, 1)
    d.complete(first[0].step_id, model_result(("c1", "lookup")))
    poll_handout(d, 3)
    replica = Engine(str(tmp_path / "replica.db"), durable=False)
    replica.apply_batch(d.log)
    assert replica.logical_dump() == d.engine.logical_dump()
