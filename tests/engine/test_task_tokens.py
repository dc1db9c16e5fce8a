"""The token secret of an attempt: the leader draws it and puts it in the hand-out command
(StartAttempts, or CompleteAttempt's eager dispatch); the engine stores it with the attempt
and `attempt_state` answers only for the right secret. The engine itself draws nothing, so
replaying the log gives the same secrets on every node (a new leader honours the tokens of
the old one).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from dex_ha.engine import CompleteAttempt, Engine, Handout, StartAttempts
from dex_ha.engine.schema import SCHEMA_VERSION
from tests.engine.driver import UNDO_SCHEMA_4, Driver, running_model_step


def test_the_secret_in_the_hand_out_is_stored_and_checked(tmp_path: Path) -> None:
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    d.create()
    d.send()
    step = d.next_step("RunModel")
    result = d.ok(
        StartAttempts(at=d.at, handouts=[Handout(step_id=step, worker_id="w-a", term=d.term, token_secret="s3cret")])
    )
    [started] = result.accepted_value().started
    assert started.token_secret == "s3cret"  # what the leader builds the token from

    state = d.engine.attempt_state(step, 1, d.term, "s3cret")
    assert state is not None and state.worker_id == "w-a" and state.current and state.status == "running"
    for wrong in ("s3creT", "s3cre", "", "s3cret-"):
        assert d.engine.attempt_state(step, 1, d.term, wrong) is None
    assert d.engine.attempt_state(step, 2, d.term, "s3cret") is None  # the secret is the attempt's
    # The secret never leaves the engine in what clients see.
    snapshot, events = str(d.snap()), str(d.engine.events("s1"))
    assert "s3cret" not in snapshot and "s3cret" not in events


def test_an_attempt_of_an_earlier_term_still_answers_to_its_token_but_is_not_current(tmp_path: Path) -> None:
    d, step = running_model_step(tmp_path / "e.db", worker="w-a")
    term, secret = d.term, d.secrets[step]
    d.takeover()  # the new active node fails the attempt: its token now gets 409, not 404
    state = d.engine.attempt_state(step, 1, term, secret)
    assert state is not None and state.status == "failed" and not state.current and state.worker_id == "w-a"


def test_eager_hand_outs_take_the_secrets_of_the_complete_command(tmp_path: Path) -> None:
    d, step = running_model_step(tmp_path / "e.db")
    a = d.running(step)
    result = {"content": "", "tool_calls": [{"id": f"c{i}", "name": "lookup", "arguments": {}} for i in (1, 2)]}
    started = (
        d.ok(
            CompleteAttempt(
                at=d.at,
                step_id=step,
                attempt=a.attempt,
                term=a.term,
                result=result,
                next_worker_id="w-b",
                next_max=2,
                next_token_secrets=["first", "second"],
            )
        )
        .accepted_value()
        .started
    )
    assert [s.token_secret for s in started] == ["first", "second"]
    for s, secret in zip(started, ("first", "second")):
        state = d.engine.attempt_state(s.step_id, 1, d.term, secret)
        assert state is not None and state.worker_id == "w-b"
        assert d.engine.attempt_state(s.step_id, 1, d.term, "first" if secret == "second" else "second") is None


def test_a_complete_with_the_wrong_number_of_secrets_is_rejected_and_changes_nothing(tmp_path: Path) -> None:
    d, step = running_model_step(tmp_path / "e.db")
    empty = {"content": "", "tool_calls": []}
    result = d.refused(
        d.complete_command(step, empty, next_worker_id="w1", next_max=2, next_token_secrets=["only-one"])
    )
    assert result.code == "invalid"


def test_a_hand_out_without_a_secret_answers_to_no_token(tmp_path: Path) -> None:
    """Entries written before schema 2 have no secret; replaying them must still start the
    attempt (every node the same), but no token can name it."""
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    d.create()
    d.send()
    step = d.next_step("RunModel")
    d.ok(StartAttempts(at=d.at, handouts=[Handout(step_id=step, worker_id="w", term=d.term)]))
    assert d.running(step).worker_id == "w"
    assert d.engine.attempt_state(step, 1, d.term, "") is None
    assert d.engine.attempt_state(step, 1, d.term, "None") is None


def test_replicas_replaying_the_log_store_the_same_secrets(tmp_path: Path) -> None:
    d, step = running_model_step(tmp_path / "e.db")
    replica = Engine(str(tmp_path / "replica.db"), durable=False)
    replica.apply_batch(d.log)
    assert replica.logical_dump() == d.engine.logical_dump()
    assert replica.attempt_state(step, 1, d.term, d.secrets[step]) is not None


def downgrade_to_schema_1(path: Path) -> None:
    """Make the database look as schema 1 wrote it: no token_secret column, no held_notes."""
    conn = sqlite3.connect(path)
    conn.executescript(
        UNDO_SCHEMA_4 + "ALTER TABLE attempts DROP COLUMN token_secret; DROP TABLE held_notes; PRAGMA user_version=1;"
    )
    conn.close()


def test_a_schema_1_data_dir_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "e.db"
    d, step = running_model_step(path)
    d.engine.close()
    downgrade_to_schema_1(path)

    engine = Engine(str(path), durable=False)
    assert engine._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    [running] = engine.running_attempts()
    assert running.step_id == step  # the state survived; the attempt has no secret
    assert engine.attempt_state(step, 1, d.term, d.secrets[step]) is None
    fresh = Engine(str(tmp_path / "fresh.db"), durable=False)
    columns = "SELECT name FROM pragma_table_info('attempts') ORDER BY cid"
    assert engine._conn.execute(columns).fetchall() == fresh._conn.execute(columns).fetchall()


def test_a_schema_1_snapshot_is_migrated_on_restore(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    d, step = running_model_step(old)
    index = d.engine.applied_index()
    d.engine.close()
    downgrade_to_schema_1(old)

    engine = Engine(str(tmp_path / "new.db"), durable=False)
    engine.restore(old.read_bytes(), index)
    assert engine._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert [a.step_id for a in engine.running_attempts()] == [step]
    assert engine.snapshot()  # a schema-2 snapshot can be taken from it
