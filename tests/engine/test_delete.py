"""Deleting sessions (DeleteSession) and retention (ExpireSessions): every row of the
session goes, in every table; only ended sessions go; the same on every replay."""

from __future__ import annotations

import os
import sqlite3

from dex_ha.engine import MAX_EXPIRED_PER_ENTRY, DeleteSession, Engine, ExpireSessions, SendMessage
from dex_ha.engine.results import SessionDeleted, SessionsExpired
from dex_ha.engine.schema import SESSION_TABLES
from dex_ha.engine.store import state_hash
from tests.engine.driver import Driver

DAY_MS = 86_400_000


def session_rows(engine: Engine, session_id: str) -> dict[str, int]:
    """Rows of the session in every table that holds rows of sessions (attempts by their step)."""
    conn = engine._conn
    counts = {}
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if "session_id" in columns:
            counts[table] = conn.execute(
                f"SELECT COUNT(*) FROM {table} WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
    counts["attempts"] = conn.execute(
        "SELECT COUNT(*) FROM attempts WHERE step_id IN (SELECT step_id FROM steps WHERE session_id = ?)", (session_id,)
    ).fetchone()[0]
    return counts


def rich_session(d: Driver, session_id: str) -> None:
    """A session with rows in most tables: messages, turns, history, tool calls, steps,
    attempts, a backoff timer, an approval, a question, events."""
    d.create(session_id)
    d.send("go", session_id=session_id)
    d.model(
        d.hand_out("RunModel"),
        "",
        [
            (f"{session_id}-c1", "put_item", {}),
            (f"{session_id}-c2", "wire_money", {}),
            (f"{session_id}-q", "ask_user", {"question": "which?"}),
        ],
    )
    d.worker_kill(d.hand_out("CallTool", call_id=f"{session_id}-c1"))  # a failed attempt: a backoff timer


def delete(d: Driver, session_id: str, namespace: str = "default"):
    return d.apply(DeleteSession(at=d.at, session_id=session_id, namespace=namespace))


def test_deleting_an_ended_session_removes_every_row_of_it_and_nothing_else(tmp_path):
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    rich_session(d, "s1")
    rich_session(d, "s2")
    d.cancel("s1")
    d.cancel("s2")
    before = session_rows(d.engine, "s1")
    assert all(before[t] > 0 for t in ("messages", "turns", "history", "tool_calls", "steps", "timers", "attempts"))
    assert all(before[t] > 0 for t in ("approvals", "questions", "events", "sessions"))
    other = d.engine.logical_dump()

    result = delete(d, "s1")

    assert result.ok and result.value == SessionDeleted("s1")
    assert "s1" in result.event_sessions  # its event streams wake, and end
    assert set(session_rows(d.engine, "s1").values()) == {0}
    after = d.engine.logical_dump()
    for table in SESSION_TABLES:  # the other session's rows are all there still
        kept = [row for row in other[table] if "s1" not in repr(row)]
        assert [row for row in after[table] if "s1" not in repr(row)] == kept
    assert d.engine.get_agent_snapshot("s1") is None
    assert dict(d.engine._conn.execute("SELECT name, value FROM counters WHERE name LIKE 'sessions.%'")) == {
        "sessions.deleted": 1
    }


def test_every_table_with_rows_of_a_session_is_deleted_from(tmp_path):
    """A new table with a session_id column must join SESSION_TABLES, or deletion leaves rows."""
    engine = Engine(str(tmp_path / "e.db"), durable=False)
    with_session = {
        table
        for (table,) in engine._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        if "session_id" in {row[1] for row in engine._conn.execute(f"PRAGMA table_info({table})")}
    }
    assert with_session == set(SESSION_TABLES)


def test_a_running_session_is_refused_and_a_missing_or_foreign_one_is_not_found(tmp_path):
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    rich_session(d, "s1")
    running = delete(d, "s1")
    assert (running.ok, running.http_status) == (False, 409)
    assert "running" in running.reason and "cancel" in running.reason
    assert delete(d, "s1", namespace="other").http_status == 404  # another namespace's: not found
    d.cancel("s1")
    assert delete(d, "s1").ok
    again = delete(d, "s1")  # a repeat: the session is gone
    assert (again.ok, again.http_status) == (False, 404)
    assert delete(d, "never").http_status == 404


def test_events_of_an_earlier_entry_of_the_same_batch_do_not_outlive_the_session(tmp_path):
    """Events are written at the end of a batch: a delete later in the batch drops them too,
    so a node that applied the entries in one batch equals one that applied them one by one."""
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    d.create("s1")
    d.apply(DeleteSession(at=d.at, session_id="s1"))
    batched = Engine(str(tmp_path / "batched.db"), durable=False)
    assert all(r.ok for r in batched.apply_batch(d.log))
    assert batched.logical_dump() == d.engine.logical_dump()
    assert set(session_rows(batched, "s1").values()) == {0}


def expire(d: Driver, cutoff_at: int, session_ids: list[str]):
    return d.apply(ExpireSessions(at=d.at, cutoff_at=cutoff_at, session_ids=session_ids))


def test_retention_picks_only_idle_sessions_last_active_before_the_cutoff(tmp_path):
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    d.create("old-idle")
    rich_session(d, "old-running")
    d.tick(10 * DAY_MS)
    d.create("new-idle")
    cutoff = d.at - DAY_MS

    assert d.engine.expired_sessions(cutoff, 100) == ["old-idle"]
    # Named anyway (a leader's stale read): the running and the recent one stay.
    result = expire(d, cutoff, ["old-idle", "old-running", "new-idle", "missing"])
    assert result.ok and result.value == SessionsExpired(("old-idle",))
    assert d.engine.get_agent_snapshot("old-running") is not None
    assert d.engine.get_agent_snapshot("new-idle") is not None
    assert d.engine.stats()["sessions_deleted"] == {"expired": 1}
    # Nothing left to expire: a no-op, not a refusal.
    assert expire(d, cutoff, ["old-idle"]).noop


def test_retention_batches_are_bounded_and_oldest_first(tmp_path):
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    for n in range(MAX_EXPIRED_PER_ENTRY + 5):
        d.create(f"s{n:03d}")
        d.tick(1)
    cutoff = d.at + 1
    first = d.engine.expired_sessions(cutoff, MAX_EXPIRED_PER_ENTRY)
    assert first == [f"s{n:03d}" for n in range(MAX_EXPIRED_PER_ENTRY)]
    too_many = expire(d, cutoff, [*first, "s100"])
    assert (too_many.ok, too_many.http_status) == (False, 400)
    assert expire(d, cutoff, first).value == SessionsExpired(tuple(first))
    assert d.engine.expired_sessions(cutoff, MAX_EXPIRED_PER_ENTRY) == [f"s{n:03d}" for n in range(100, 105)]


def test_deletions_replay_to_the_same_state(tmp_path):
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    for sid in ("a", "b", "c"):
        rich_session(d, sid)
        d.cancel(sid)
    delete(d, "a")
    d.tick(DAY_MS)
    expire(d, d.at, ["b"])
    replayed = Engine(str(tmp_path / "replay.db"), durable=False)
    for index, data in d.log:
        replayed.apply(index, data)
    assert replayed.logical_dump() == d.engine.logical_dump()
    assert set(replayed.logical_dump()["sessions"][0][:1]) == {"c"}


def test_deleted_sessions_free_the_file_and_the_state_hash_is_unchanged_by_it(tmp_path):
    path = str(tmp_path / "e.db")
    d = Driver(path)
    d.register()
    big = "x" * 20_000
    for n in range(60):
        d.create(f"s{n}")
        d.ok(SendMessage(at=d.at, session_id=f"s{n}", text=big))
    d.engine._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    full = os.path.getsize(path)
    for n in range(60):
        d.cancel(f"s{n}")
        assert delete(d, f"s{n}").ok
    d.engine._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert os.path.getsize(path) < full / 4
    # A copy that never reclaimed has the same rows, hence the same hash.
    copy = Engine(str(tmp_path / "copy.db"), durable=False)
    copy.apply_batch(d.log)
    assert state_hash(copy._conn) == state_hash(d.engine._conn)


def without_auto_vacuum(path: str) -> None:
    """Make the database at `path` what a node of an earlier version wrote (auto_vacuum NONE)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA auto_vacuum=NONE")
    conn.execute("VACUUM")
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()


def auto_vacuum(engine: Engine) -> int:
    mode: int = engine._conn.execute("PRAGMA auto_vacuum").fetchone()[0]
    return mode


def test_a_database_of_an_earlier_version_is_made_reclaimable_when_opened_or_installed(tmp_path):
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    rich_session(d, "s1")
    dump = d.engine.logical_dump()
    d.engine.close()
    old = str(tmp_path / "e.db")
    without_auto_vacuum(old)
    opened = Engine(old, durable=False)
    assert auto_vacuum(opened) == 2 and opened.logical_dump() == dump
    # A snapshot from such a node: installed, it is converted too.
    opened.close()
    without_auto_vacuum(old)
    with open(old, "rb") as f:
        snapshot = f.read()
    fresh = Engine(str(tmp_path / "fresh.db"), durable=False)
    fresh.restore(snapshot, d.index)
    assert auto_vacuum(fresh) == 2 and fresh.logical_dump() == dump
