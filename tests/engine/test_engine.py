"""Engine mechanics: idempotent apply by index, batches, restart, snapshots, encoding."""

from __future__ import annotations

import sqlite3

import pytest

from dex_ha.engine import (
    STEP_KINDS,
    CancelTurn,
    CompleteAttempt,
    CreateSession,
    Engine,
    Handout,
    StartAttempts,
    copy_to_bytes,
    decode_command,
    encode_command,
    handlers,
)
from dex_ha.engine.commands import COMMAND_TYPES
from tests.engine.driver import Driver


def busy_driver(path: str) -> Driver:
    d = Driver(path)
    d.register(compaction={"max_items": 4})
    for sid in ("a", "b"):
        d.create(sid)
        d.send("go", session_id=sid)
    step = d.hand_out("RunModel")
    d.model(step, "", [("c1", "put_item", {}), ("c2", "wire_money", {})])
    d.worker_kill(d.hand_out("CallTool"))
    return d


def test_an_index_at_or_below_the_applied_one_is_a_noop(tmp_path):
    d = busy_driver(str(tmp_path / "e.db"))
    dump = d.engine.logical_dump()
    for index, data in d.log:
        result = d.engine.apply(index, data)
        assert result.ok and result.code == "already_applied"
    assert d.engine.logical_dump() == dump


def test_an_empty_entry_only_moves_the_applied_index(tmp_path):
    d = busy_driver(str(tmp_path / "e.db"))
    before = d.engine.logical_dump(include_applied_index=False)
    result = d.engine.apply(d.index + 1, b"")
    assert result.ok and result.noop and d.engine.applied_index() == d.index + 1
    assert d.engine.logical_dump(include_applied_index=False) == before


def test_apply_batch_equals_one_by_one(tmp_path):
    d = busy_driver(str(tmp_path / "e.db"))
    other = Engine(str(tmp_path / "batch.db"), durable=False)
    results = other.apply_batch(d.log)
    assert other.logical_dump() == d.engine.logical_dump()
    assert all(r.ok for r in results) and other.applied_index() == d.index
    assert [r.code for r in other.apply_batch(d.log[:3])] == ["already_applied"] * 3


def test_a_restart_resumes_exactly_at_the_applied_index(tmp_path):
    path = str(tmp_path / "e.db")
    d = busy_driver(path)
    dump = d.engine.logical_dump()
    d.engine.close()
    reopened = Engine(path)
    assert reopened.applied_index() == d.index and reopened.logical_dump() == dump
    reopened.close()


def test_a_crash_inside_a_batch_keeps_neither_change_nor_index(tmp_path, monkeypatch):
    path = str(tmp_path / "e.db")
    d = busy_driver(path)
    dump = d.engine.logical_dump()

    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setitem(handlers.HANDLERS, CreateSession, disk_full)
    with pytest.raises(sqlite3.OperationalError):
        d.engine.apply_batch([(d.index + 1, b""), (d.index + 2, encode_command(CreateSession(at=1, agent="helper")))])
    assert d.engine.logical_dump() == dump


def test_writes_kept_for_a_rolled_back_batch_never_reach_a_later_one(tmp_path, monkeypatch):
    """Events and counters are written at the end of the transaction: those of an entry
    that applied in a batch that then failed go with the rollback, not into the next batch."""
    d = busy_driver(str(tmp_path / "e.db"))
    dump = d.engine.logical_dump(include_applied_index=False)

    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setitem(handlers.HANDLERS, CancelTurn, disk_full)
    with pytest.raises(sqlite3.OperationalError):
        d.engine.apply_batch(
            [
                (d.index + 1, encode_command(CreateSession(at=1, session_id="s8", agent="helper"))),
                (d.index + 2, encode_command(CancelTurn(at=1, session_id="a"))),
            ]
        )
    monkeypatch.undo()
    assert d.engine.apply(d.index + 1, b"").ok
    assert d.engine.logical_dump(include_applied_index=False) == dump
    assert d.engine.events("s8") == []


def test_snapshot_and_restore_give_the_same_state(tmp_path):
    d = busy_driver(str(tmp_path / "e.db"))
    data = d.engine.snapshot()
    fresh = Engine(str(tmp_path / "fresh.db"), durable=False)
    fresh.apply(1, b"")  # whatever it held is replaced
    fresh.restore(data, d.index)
    assert fresh.logical_dump() == d.engine.logical_dump() and fresh.applied_index() == d.index
    assert fresh._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    fresh.close()
    reopened = Engine(str(tmp_path / "fresh.db"))
    assert reopened.logical_dump() == d.engine.logical_dump()
    with pytest.raises(ValueError):
        reopened.restore(data, d.index + 5)
    with pytest.raises(ValueError):
        reopened.restore(b"not sqlite at all" * 100, d.index)
    assert reopened.logical_dump() == d.engine.logical_dump()


def test_two_engines_in_one_process_are_independent(tmp_path):
    one = Engine(str(tmp_path / "1.db"), durable=False)
    two = Engine(str(tmp_path / "2.db"), durable=False)
    one.apply(1, encode_command(CreateSession(at=1, session_id="x", agent="a")))
    assert two.get_agent_snapshot("x") is None and one.get_agent_snapshot("x") is not None


def test_every_command_round_trips_through_its_encoding():
    from dex_ha.engine import commands as c

    samples = [
        c.CreateSession(at=1, agent="a", session_id="s", metadata={"k": [1, "x"]}),
        c.RegisterAgent(at=1, name="a", definition={"tools": []}),
        c.SendMessage(at=1, session_id="s", text="t", message_id="m", mode="steer"),
        c.CancelTurn(at=1, session_id="s", reason="r"),
        c.DeleteSession(at=1, session_id="s", namespace="team"),
        c.ExpireSessions(at=1, cutoff_at=0, session_ids=["s", "t"]),
        c.StartAttempts(at=1, handouts=[Handout(step_id="st", worker_id="w", term=3, token_secret="ab12")]),
        c.StartQueuedAttempts(at=1, worker_id="w", term=3, agents=["a", "b"], token_secrets=["ab12", "ef56"]),
        c.CompleteAttempt(
            at=1,
            step_id="st",
            attempt=1,
            term=1,
            result={"status": "ok", "output": None},
            next_worker_id="w",
            next_max=1,
            next_token_secrets=["cd34"],
        ),
        c.FailAttempt(at=1, step_id="st", attempt=1, term=1, error="e", retryable=False),
        c.ReportResults(
            at=1,
            reports=[
                c.ReportItem(step_id="st", attempt=1, term=1, outcome="complete", result={"status": "ok"}),
                c.ReportItem(step_id="s2", attempt=2, term=1, outcome="fail", error="e", not_started=True),
            ],
            next_worker_id="w",
            next_term=1,
            next_agents=["a"],
            next_token_secrets=["ef56"],
            namespace="team",
        ),
        c.HeartbeatLost(at=1, step_id="st", attempt=1, term=1, silent_ms=1000),
        c.AttemptTimedOut(at=1, step_id="st", attempt=1, term=1),
        c.FailHeldAttempts(at=1, term=2),
        c.FireTimer(at=1, timer_id="tm"),
        c.DecideApproval(at=1, session_id="s", call_id="c", approved=False, reason="no"),
        c.AnswerQuestion(at=1, session_id="s", question_id="q", answer={"any": ["json"]}),
        c.ReconcileToolCall(at=1, session_id="s", call_id="c", outcome="succeeded", result=1),
        c.CheckStateHash(at=1),
        c.SetConsistencyAlarm(at=1, node_id="n2", index=7, raised=True, found="ab", expected="cd"),
        c.SetClusterVersion(at=1, version=2),
    ]
    assert {type(s).__name__ for s in samples} == set(COMMAND_TYPES)
    for cmd in samples:
        assert decode_command(encode_command(cmd)) == cmd


def test_the_step_kind_table_holds_the_contract_kinds():
    assert set(STEP_KINDS) == {
        "RunModel",
        "CallTool",
        "CallSingleAttemptTool",
        "AwaitToolApproval",
        "AwaitQuestionAnswer",
        "AwaitTimer",
        "PollToolTask",
        "CompactContext",
        "AwaitUserMessage",
    }
    model = STEP_KINDS["RunModel"]
    assert (model.max_attempts, model.retry_window_ms, model.backoff_initial_ms, model.backoff_factor) == (
        3,
        30 * 60_000,
        1_000,
        2,
    )
    assert STEP_KINDS["CallSingleAttemptTool"].max_attempts == 1


def test_a_handout_batch_stays_one_entry(tmp_path):
    d = busy_driver(str(tmp_path / "e.db"))
    before = d.index
    d.send("more", session_id="b")
    queued = [s.step_id for s in d.queued()]
    d.ok(StartAttempts(at=d.at, handouts=[Handout(step_id=s, worker_id="w", term=d.term) for s in queued]))
    assert d.index == before + 2


def test_a_command_refused_after_it_wrote_keeps_nothing(tmp_path):
    """A model result reusing a call id is found by the table's key after the assistant
    message was written: the batch is applied again with savepoints, and the refused
    entry keeps nothing while its neighbours in the batch apply."""
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    d.create()
    d.send("go")
    d.run_model("", [("c1", "lookup", {})])
    d.complete(d.hand_out("CallTool"), {"status": "ok", "output": 1})
    model = d.hand_out("RunModel")
    attempt = d.running(model)
    reuse = encode_command(
        CompleteAttempt(
            at=d.at,
            step_id=model,
            attempt=attempt.attempt,
            term=attempt.term,
            result={"content": "", "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {}}]},
        )
    )
    create = encode_command(CreateSession(at=d.at, session_id="s9", agent="helper"))
    before = d.engine.logical_dump(include_applied_index=False)
    results = d.engine.apply_batch([(d.index + 1, create), (d.index + 2, reuse), (d.index + 3, b"")])
    assert [r.code for r in results] == ["ok", "invalid", "ok"]
    expected = Engine(str(tmp_path / "expected.db"), durable=False)
    expected.apply_batch(d.log + [(d.index + 1, create)])
    after = d.engine.logical_dump(include_applied_index=False)
    assert after == expected.logical_dump(include_applied_index=False) != before
    assert d.engine.applied_index() == d.index + 3


def test_an_engine_bug_is_refused_as_internal_and_keeps_nothing(tmp_path, monkeypatch):
    d = busy_driver(str(tmp_path / "e.db"))

    def buggy(ctx, cmd):
        ctx.store.update("sessions", {"session_id": cmd.session_id}, status="broken")
        raise KeyError("oops")

    monkeypatch.setitem(handlers.HANDLERS, CancelTurn, buggy)
    before = d.engine.logical_dump(include_applied_index=False)
    result = d.apply(CancelTurn(at=d.at, session_id="a"))
    assert (result.ok, result.code, result.http_status) == (False, "internal", 500)
    assert d.engine.logical_dump(include_applied_index=False) == before


def test_snapshot_copier_runs_in_a_thread_while_applies_go_on(tmp_path):
    """The copy is one consistent state at the index it reports, though the engine kept
    applying while the copier ran on another thread."""
    import threading

    d = busy_driver(str(tmp_path / "e.db"))
    copier = d.engine.snapshot_copier()
    result: list[tuple[int, bytes]] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        result.append(copy_to_bytes(copier))

    t = threading.Thread(target=run)
    t.start()
    started.wait(5)
    base = d.index
    for i in range(200):  # keep writing while the copy runs
        d.engine.apply(base + 1 + i, encode_command(CreateSession(at=1, agent="helper", session_id=f"late{i}")))
    t.join(30)
    assert not t.is_alive() and result
    index, data = result[0]
    assert base <= index <= base + 200
    fresh = Engine(str(tmp_path / "fresh.db"), durable=False)
    fresh.restore(data, index)
    late = [r for r in fresh.logical_dump()["sessions"] if str(r[0]).startswith("late")]
    assert len(late) == index - base  # exactly the entries up to the copy's index
    fresh.close()


def test_tool_call_outcome_counts_only_grow_and_count_a_settlement(tmp_path) -> None:
    """stats()["tool_calls"] feeds a Prometheus counter: reconciling an outcome_unknown call
    adds a `succeeded` and leaves `outcome_unknown` as it was (a counter never decreases)."""
    from tests.engine.driver import Driver

    d = Driver(str(tmp_path / "counts.db"))
    d.register()
    d.create()
    d.send()
    d.run_model(calls=[("c1", "send_email", {}), ("c2", "lookup", {})])
    d.complete(d.hand_out("CallTool", call_id="c2"), {"status": "ok", "output": 1})
    d.worker_kill(d.hand_out("CallSingleAttemptTool", call_id="c1"))
    assert d.engine.stats()["tool_calls"] == {"succeeded": 1, "outcome_unknown": 1}
    d.reconcile("c1", "succeeded", result={"sent": True})
    assert d.engine.stats()["tool_calls"] == {"succeeded": 2, "outcome_unknown": 1}
    d.reconcile("c1", "succeeded", result={"sent": True})  # a repeat changes nothing
    assert d.engine.stats()["tool_calls"] == {"succeeded": 2, "outcome_unknown": 1}


def test_the_wal_goes_back_into_the_database_file_on_the_checkpoint_thread(tmp_path) -> None:
    """With `checkpoint_every_s` the applying connection never checkpoints (SQLite would do
    it inside a COMMIT, on the Raft thread); the checkpoint thread copies the WAL into the
    database file. Evidence from outside the engine: the database file alone, copied
    without its -wal, holds the applied index."""
    import shutil
    import time

    path = tmp_path / "e.db"
    engine = Engine(str(path), durable=True, checkpoint_every_s=0.02)
    try:
        assert engine._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        checkpointer = engine._checkpointer
        assert checkpointer is not None  # checkpoint_every_s starts one
        checkpoints_before = checkpointer.checkpoints
        for i in range(1, 201):
            engine.apply(i, encode_command(CreateSession(at=1, agent="helper", session_id=f"s{i}")))
        deadline = time.monotonic() + 10
        while True:
            main_file_only = tmp_path / "copy.db"
            shutil.copyfile(path, main_file_only)  # no -wal beside it: only what was checkpointed
            copy = sqlite3.connect(main_file_only)
            try:
                row = copy.execute("SELECT value FROM meta WHERE key = 'applied_index'").fetchone()
            except sqlite3.OperationalError:  # not even the schema is in the file yet
                row = None
            finally:
                copy.close()
            if row is not None and row[0] == 200:
                break
            assert time.monotonic() < deadline, f"the database file holds applied index {row}, not 200"
            time.sleep(0.02)
        assert checkpointer.checkpoints > checkpoints_before
    finally:
        engine.close()
    assert not checkpointer._thread.is_alive()  # close() stopped it


def _wal_restarts(wal_path) -> int:
    """The WAL header's checkpoint sequence number: SQLite adds one each time the WAL
    starts over from its beginning."""
    with open(wal_path, "rb") as f:
        header = f.read(16)
    return int.from_bytes(header[12:16], "big") if len(header) == 16 else 0


def test_the_wal_starts_over_while_entries_keep_applying(tmp_path) -> None:
    """SQLite rewinds the WAL only when a write begins with every frame copied back; under
    writes that never pause, a checkpoint on another thread never sees that, and the WAL
    grows without bound (600 MB a minute on a loaded node). Past its restart size the
    checkpoint thread copies the last frames while it holds off writes, so the WAL starts
    over. Evidence from the file itself: the WAL header's restart counter."""
    import time

    path = tmp_path / "e.db"
    engine = Engine(str(path), durable=True, checkpoint_every_s=0.01, wal_restart_after_frames=64)
    wal = tmp_path / "e.db-wal"
    try:
        engine.apply(1, encode_command(CreateSession(at=1, agent="helper", session_id="s1")))
        restarts_before = _wal_restarts(wal)
        index, deadline = 1, time.monotonic() + 30
        while _wal_restarts(wal) < restarts_before + 3:  # writes never pause in this loop
            index += 1
            engine.apply(index, encode_command(CreateSession(at=1, agent="helper", session_id=f"s{index}")))
            assert time.monotonic() < deadline, (
                f"the WAL did not start over 3 times in {index} entries: it holds {wal.stat().st_size} bytes"
            )
    finally:
        engine.close()


def test_a_snapshot_goes_to_its_file_without_passing_through_memory(tmp_path) -> None:
    """The copier writes the copy into the file it is given: taking a snapshot of a state
    of tens of MB allocates a small fraction of that in Python (the node takes one every
    few thousand entries, and a state may be larger than the memory it should use), and
    the file restores to the same state."""
    import tracemalloc

    d = Driver(str(tmp_path / "e.db"))
    d.register()
    for i in range(40):
        d.create(f"big{i}")
        d.send("x" * 500_000, session_id=f"big{i}")  # 40 messages of 500 kB: a 20 MB state
    target = tmp_path / "snapshot.db"
    target.touch()  # the node hands the copier a new, empty file
    copy = d.engine.snapshot_copier()
    tracemalloc.start()
    try:
        index = copy(target)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = target.stat().st_size
    assert index == d.engine.applied_index() and size > 20_000_000
    assert peak < size / 10, f"the copy of a {size}-byte state peaked at {peak} bytes of Python memory"
    fresh = Engine(str(tmp_path / "fresh.db"), durable=False)
    fresh.restore(target.read_bytes(), index)
    assert fresh.logical_dump() == d.engine.logical_dump()
    fresh.close()


def test_every_public_query_is_marked_to_run_in_a_read_transaction() -> None:
    """A query added to Queries without @read_transaction would run on a reader without its
    own transaction, and could see half of an apply: none is."""
    from dex_ha.engine.queries import Queries

    public = {name: fn for name, fn in vars(Queries).items() if callable(fn) and not name.startswith("_")}
    assert public, "Queries has no public query: the check looks at the wrong class"
    unmarked = sorted(name for name, fn in public.items() if not getattr(fn, "is_read_transaction", False))
    assert not unmarked, f"queries without @read_transaction: {unmarked}"


def test_a_reader_runs_each_query_in_one_read_transaction_and_the_engine_opens_none(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dex_ha.engine import EngineReader

    path = str(tmp_path / "state.db")
    d = Driver(path)
    d.register()
    d.create("s1")
    reader = EngineReader(path)
    try:
        seen: list[tuple[str, bool]] = []
        for who, engine in (("reader", reader), ("engine", d.engine)):
            store_meta = engine._store.meta

            def meta(*args, _who=who, _engine=engine, _meta=store_meta):
                seen.append((_who, _engine._conn.in_transaction))
                return _meta(*args)

            monkeypatch.setattr(engine._store, "meta", meta)
            assert engine.applied_index() == d.index
            assert engine.get_agent_snapshot("s1") is not None  # several statements, nested queries
        assert ("reader", True) in seen and ("reader", False) not in seen, seen
        assert ("engine", True) not in seen, seen  # outside an apply the engine opens no transaction
        assert not reader._conn.in_transaction  # and the reader closed its own
    finally:
        reader.close()
