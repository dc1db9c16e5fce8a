"""The consistency check's deterministic parts: the state hash, the cut after a
CheckStateHash entry, and the replicated alarm."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from dex_ha.engine import CheckStateHash, CreateSession, Engine, SetConsistencyAlarm, encode_command
from dex_ha.engine.store import state_hash

AT = 1_700_000_000_000


def _create(index: int, session_id: str, account: str = "account-1111") -> tuple[int, bytes]:
    cmd = CreateSession(at=AT + index, agent="a", session_id=session_id, metadata={"account": account})
    return index, encode_command(cmd)


def _hash_of(engine: Engine) -> str:
    return engine.open_state_hash()()


def test_the_same_log_gives_the_same_hash_and_any_changed_value_another(tmp_path: Path) -> None:
    a, b = Engine(str(tmp_path / "a.db")), Engine(str(tmp_path / "b.db"))
    try:
        a.apply_batch([_create(1, "s1"), _create(2, "s2")])
        for entry in (_create(1, "s1"), _create(2, "s2")):  # other batches, same log
            b.apply_batch([entry])
        assert _hash_of(a) == _hash_of(b)
        before = _hash_of(b)
        conn = sqlite3.connect(tmp_path / "b.db")  # what a flipped byte in a page does to a row
        conn.execute("UPDATE sessions SET metadata = replace(metadata, '1111', '9999')")
        conn.commit()
        conn.close()
        assert _hash_of(b) != before and _hash_of(b) != _hash_of(a)
    finally:
        a.close()
        b.close()


def test_sqlite_statistics_do_not_count(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "a.db"))
    try:
        engine.apply_batch([_create(1, "s1")])
        before = _hash_of(engine)
        engine._conn.execute("ANALYZE")  # node-local: sqlite_stat1 differs between nodes
        assert _hash_of(engine) == before
    finally:
        engine.close()


def test_a_check_in_the_middle_of_a_batch_sees_the_state_at_its_own_index(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path / "a.db"))
    seen: dict[int, object] = {}
    pending = []

    def on_check(index: int) -> None:
        seen[index] = engine.applied_index()
        pending.append((index, engine.open_state_hash()))  # hashed later, as a worker thread would

    engine.on_state_check = on_check
    reference = Engine(":memory:")
    try:
        batch = [_create(1, "s1"), (2, encode_command(CheckStateHash(at=AT))), _create(3, "s3"), _create(4, "s4")]
        results = engine.apply_batch(batch)
        assert [r.index for r in results] == [1, 2, 3, 4] and all(r.ok for r in results)
        assert seen == {2: 2}, "the check must fire after its own transaction, before entry 3"
        reference.apply_batch(batch[:2])
        ((index, hash_later),) = pending
        assert hash_later() == _hash_of(reference)  # entries 3 and 4 are not in it
        assert _hash_of(engine) != _hash_of(reference)
    finally:
        engine.close()
        reference.close()


def test_the_alarm_is_replicated_state_raised_and_cleared(tmp_path: Path) -> None:
    engine = Engine(":memory:")
    try:
        raise_ = SetConsistencyAlarm(at=AT, node_id="n2", index=7, raised=True, found="ab", expected="cd")
        assert engine.apply(1, encode_command(raise_)).ok
        assert engine.consistency_alarms() == {"n2": 7}
        clear = SetConsistencyAlarm(at=AT, node_id="n2", index=9, raised=False)
        assert engine.apply(2, encode_command(clear)).ok
        assert engine.consistency_alarms() == {}
    finally:
        engine.close()


def test_state_hash_orders_rows_by_key_not_by_insertion() -> None:
    one, two = sqlite3.connect(":memory:"), sqlite3.connect(":memory:")
    for conn, order in ((one, (1, 2)), (two, (2, 1))):
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        conn.execute("CREATE TABLE u (a TEXT, b TEXT)")  # no primary key: every column orders
        for k in order:
            conn.execute("INSERT INTO t VALUES (?, ?)", (k, f"v{k}"))
            conn.execute("INSERT INTO u VALUES (?, ?)", (f"a{k}", "b"))
    assert state_hash(one) == state_hash(two)
