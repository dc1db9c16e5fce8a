"""The Engine: applies committed log entries to the SQLite state, deterministically.

`apply(index, data)` never raises on a bad command: an undecodable entry or a command the
state refuses is rolled back and answered with `ok=False`, a machine code and a reason,
while the applied index still moves (every node refuses the same entry the same way).
The applied index is written in the same transaction as the change, so a restart resumes
exactly; an index at or below it is a no-op ("already_applied").
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dex_ha.engine.commands import (
    STATE_MACHINE_VERSION,
    CheckStateHash,
    Command,
    CommandDecodeError,
    NeedsUpgrade,
    SetClusterVersion,
    UnknownCommand,
    command_since,
    decode_command,
)
from dex_ha.engine.context import ApplyContext
from dex_ha.engine.handlers import HANDLERS
from dex_ha.engine.history_cache import DEFAULT_BUDGET_CHARS, HistoryCache
from dex_ha.engine.queries import Queries, R
from dex_ha.engine.results import ApplyResult, Rejected, accepted
from dex_ha.engine.schema import SCHEMA_VERSION
from dex_ha.engine.store import (
    APPLIED_INDEX,
    CLUSTER_VERSION,
    WAL_RESTART_AFTER_FRAMES,
    Store,
    WalCheckpointer,
    can_migrate,
    connect,
    init_schema,
    make_reclaimable,
    reclaim_free_pages,
    state_hash,
)

log = logging.getLogger("dex_ha.engine")

# Free pages given back to the file system after a batch of entries (reclaim_space): 8 MB
# of 4 KB pages, a few milliseconds; the rest after the next batches.
RECLAIM_PAGES_PER_BATCH = 2048


class Engine(Queries):
    """The session state machine of one node (the Raft `StateMachine`).

    Not thread-safe: the caller serialises apply, queries, snapshot and restore.
    """

    def __init__(
        self,
        path: str,
        durable: bool = True,
        checkpoint_every_s: float | None = None,
        wal_restart_after_frames: int = WAL_RESTART_AFTER_FRAMES,
        history_cache_chars: int = DEFAULT_BUDGET_CHARS,
        state_machine_version: int = STATE_MACHINE_VERSION,
    ) -> None:
        """Open or create the state at `path` (":memory:" for tests).

        durable=True runs SQLite with synchronous=NORMAL, False with OFF; neither fsyncs
        per command, because the Raft log is the durable record and the applied index
        commits with each change (see store.py). Feed committed entries to `apply_batch`
        in groups where possible: one transaction for many entries is much faster.
        `checkpoint_every_s`: checkpoint the WAL on a thread of its own at this interval
        instead of inside an apply (WalCheckpointer); a server sets it, close() stops it.
        Past `wal_restart_after_frames` pages in the WAL, that thread briefly holds off
        writes so that the WAL can start over.
        `history_cache_chars`: the budget of the history the engine keeps in memory to
        build tasks (history_cache.py).
        `state_machine_version`: the newest commands this engine applies (lower only in
        tests, to play an older release); a newer entry stops it (NeedsUpgrade), and so
        does a state whose cluster already moved past it.
        """
        self.path = path
        self.state_machine_version = state_machine_version
        self._conn = connect(path, durable)
        init_schema(self._conn)
        if path != ":memory:":
            make_reclaimable(self._conn, path)
        # Free pages to give back to the file system (sessions were deleted): reclaim_space.
        self._reclaim_pending = self._free_pages() > 0
        # Local, never replicated: tasks are built from it inside the apply of their hand-out.
        self._history_cache = HistoryCache(history_cache_chars)
        self._store = Store(self._conn, self._history_cache)
        # Held by every write transaction; the checkpoint thread holds it to let the WAL start over.
        self._write_lock = threading.Lock()
        self._checkpointer: WalCheckpointer | None = None
        # Called with the index of each CheckStateHash entry right after the transaction
        # that ends with it commits, before anything later applies (see open_state_hash).
        self.on_state_check: Callable[[int], None] | None = None
        self._state_check_at: int | None = None
        self._check_cluster_version()
        if checkpoint_every_s is not None and path != ":memory:":
            self._conn.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = WalCheckpointer(
                path, durable, checkpoint_every_s, self._write_lock, wal_restart_after_frames
            )

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
        self._conn.close()

    def wal_bytes(self) -> int:
        """The size of the write-ahead log file now (0 when there is none); any thread may ask.
        It stays near WAL_SIZE_LIMIT_BYTES at most while the checkpoint thread keeps up."""
        try:
            return os.stat(self.path + "-wal").st_size
        except FileNotFoundError:
            return 0

    def state_bytes(self) -> int:
        """The size of the database file now, without its write-ahead log; any thread may ask."""
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:  # ":memory:"
            return 0

    def trace_statements(self, callback: Callable[[str], object] | None) -> None:
        """For measurements (bench/engine_bench.py, tests): `callback(sql)` for every SQL
        statement this engine's connection runs, its parameters filled in; None stops it."""
        self._conn.set_trace_callback(callback)

    def reader(self) -> EngineReader:
        """The queries through a connection of their own, for another thread (see EngineReader)."""
        if self.path == ":memory:":
            raise ValueError("an in-memory engine has no second connection; read it directly")
        return EngineReader(self.path)

    # ---------------------------------------------------------- apply

    def apply(self, index: int, data: bytes) -> ApplyResult[Any]:
        """Apply one committed entry (empty `data`: a leader's no-op, only the index moves)."""
        return self.apply_batch([(index, data)])[0]

    def apply_batch(self, entries: Iterable[tuple[int, bytes]]) -> list[ApplyResult[Any]]:
        """Apply entries in log order in ONE transaction (the applied index is in it too).

        Fast path first: no savepoint per entry (a savepoint makes SQLite copy every page
        the entry touches). Handlers check before they write, so a refused command has
        usually written nothing. If one did write before refusing, or a handler failed
        unexpectedly, the whole transaction is rolled back and the batch applied again with
        a savepoint around each entry: the same results, and a refused entry keeps nothing.
        """
        entries = list(entries)
        results: list[ApplyResult[Any]] = []
        with self._write_lock:
            # A CheckStateHash entry ends its transaction (the rest go into the next one),
            # so that on_state_check sees the state exactly at its index.
            while len(results) < len(entries):
                results += self._apply_part(entries[len(results) :])
                index, self._state_check_at = self._state_check_at, None
                if index is not None and self.on_state_check is not None:
                    self.on_state_check(index)
            if self._reclaim_pending:
                self.reclaim_space()
        return results

    def reclaim_space(self, most_pages: int = RECLAIM_PAGES_PER_BATCH) -> None:
        """Give free pages (left by deleted sessions) back to the file system, at most
        `most_pages` at a time; later batches go on until none is left. A physical change
        only: no row changes, so the state hash does not either. Called with the write lock
        held (after a batch), or where nothing applies."""
        try:
            self._reclaim_pending = reclaim_free_pages(self._conn, most_pages) > 0
        except sqlite3.Error as exc:  # a full disk, say: the pages stay free and are reused
            log.warning("engine: could not give free pages back to the file system (%s); trying again later", exc)

    def _free_pages(self) -> int:
        free: int = self._conn.execute("PRAGMA freelist_count").fetchone()[0]
        return free

    def _apply_part(self, entries: list[tuple[int, bytes]]) -> list[ApplyResult[Any]]:
        try:
            return self._apply_in_transaction(entries, careful=False)
        except _ReplayCarefully:
            return self._apply_in_transaction(entries, careful=True)

    def _apply_in_transaction(self, entries: list[tuple[int, bytes]], careful: bool) -> list[ApplyResult[Any]]:
        """Apply `entries` up to the end or to the first CheckStateHash (included); one
        result per entry applied."""
        applied = self.applied_index()
        results: list[ApplyResult[Any]] = []
        self._state_check_at = None
        self._conn.execute("BEGIN")
        try:
            for index, data in entries:
                if index <= applied:
                    results.append(ApplyResult(index=index, ok=True, code="already_applied", noop=True))
                    continue
                results.append(self._apply_entry(index, data, careful))
                applied = index
                if self._state_check_at == index:
                    break
            self._store.write_buffered()
            self._store.set_meta(APPLIED_INDEX, applied)
            self._conn.execute("COMMIT")
            self._history_cache.committed()
            if self._store.take_deleted():
                self._reclaim_pending = True
        except BaseException:
            self._state_check_at = None
            self._store.discard_buffered()
            self._history_cache.rolled_back()
            # SQLite may have rolled the transaction back itself (it does on SQLITE_FULL in a
            # COMMIT): a ROLLBACK then fails and would hide the error that matters.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        return results

    def _check_cluster_version(self) -> None:
        """Refuse a state whose cluster runs a newer state machine than this engine: it
        holds, or will be sent, commands this engine cannot apply (NeedsUpgrade)."""
        cluster = self.cluster_version()
        if cluster > self.state_machine_version:
            raise NeedsUpgrade(self.applied_index(), SetClusterVersion.__name__, cluster, self.state_machine_version)

    def _apply_entry(self, index: int, data: bytes, careful: bool) -> ApplyResult[Any]:
        if not data:
            return accepted(index, noop=True)
        try:
            cmd = decode_command(data)
        except UnknownCommand as exc:  # a newer release wrote it: stop, never apply it as invalid
            raise NeedsUpgrade(index, exc.name, exc.since, self.state_machine_version) from None
        except CommandDecodeError as exc:
            return Rejected("invalid", str(exc)).result(index)
        self._check_version_of(index, cmd)
        if isinstance(cmd, CheckStateHash):
            self._state_check_at = index
        if careful:
            return self._run_in_savepoint(index, cmd)
        changes_before = self._conn.total_changes
        try:
            return self._run(index, cmd)
        except Rejected as rejected:
            if self._conn.total_changes != changes_before:
                raise _ReplayCarefully() from None  # it wrote before refusing
            return rejected.result(index)
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise _ReplayCarefully() from None
            raise  # disk full, I/O error...: the whole batch is rolled back; the node decides
        except Exception:
            raise _ReplayCarefully() from None

    def _check_snapshot_version(self, source: sqlite3.Connection, index: int) -> None:
        """A snapshot of a cluster that moved past this engine's state machine is never
        installed (NeedsUpgrade): the entries after it are ones this engine cannot apply."""
        row = source.execute("SELECT value FROM meta WHERE key = ?", (CLUSTER_VERSION,)).fetchone()
        if row is not None and int(row[0]) > self.state_machine_version:
            raise NeedsUpgrade(index, "a snapshot", int(row[0]), self.state_machine_version)

    def _check_version_of(self, index: int, cmd: Command) -> None:
        """Stop on a command of a newer state machine than this engine runs (NeedsUpgrade),
        a SetClusterVersion to one included."""
        needs = command_since(type(cmd))
        if isinstance(cmd, SetClusterVersion):
            needs = max(needs, cmd.version)
        if needs > self.state_machine_version:
            raise NeedsUpgrade(index, type(cmd).__name__, needs, self.state_machine_version)

    def _run_in_savepoint(self, index: int, cmd: Command) -> ApplyResult[Any]:
        try:
            with self._store.savepoint("entry"):
                return self._run(index, cmd, careful=True)
        except Rejected as rejected:
            return rejected.result(index)
        except sqlite3.IntegrityError as exc:  # a logic bug, the same on every node
            return self._internal_error(index, cmd, exc)
        except sqlite3.Error:
            raise
        except Exception as exc:  # a logic bug, the same on every node
            return self._internal_error(index, cmd, exc)

    def _run(self, index: int, cmd: Command, careful: bool = False) -> ApplyResult[Any]:
        ctx = ApplyContext(self._store, index, cmd.at, careful=careful)
        handled = HANDLERS[type(cmd)](ctx, cmd)
        event_sessions = frozenset(session_id for session_id, _, _ in ctx.events).union(handled.deleted)
        ctx.hand_over_writes()
        return accepted(index, handled.value, noop=handled.noop, event_sessions=event_sessions)

    def _internal_error(self, index: int, cmd: object, exc: Exception) -> ApplyResult[Any]:
        log.exception("engine bug applying entry %d (%s)", index, type(cmd).__name__)
        return Rejected("internal", f"{type(exc).__name__}: {exc}").result(index)

    # ---------------------------------------------------------- consistency check

    def open_state_hash(self) -> Callable[[], str]:
        """Called on the applying thread (e.g. from on_state_check): pins the state as it is
        now in a read transaction of a connection of its own, and returns a function that
        hashes it (state_hash) on any thread, then ends that read. In WAL mode the pinned
        read never blocks the applies that go on meanwhile, and sees none of them, so a
        large state is hashed at exactly this index without stalling the Raft loop."""
        if self.path == ":memory:":  # no second connection can see it: hash here, now
            digest = state_hash(self._conn)
            return lambda: digest
        conn = connect(self.path, durable=True)
        conn.execute("BEGIN")
        conn.execute("SELECT value FROM meta WHERE key = ?", (APPLIED_INDEX,)).fetchone()  # the read starts here

        def hash_pinned_state() -> str:
            try:
                return state_hash(conn)
            finally:
                conn.execute("COMMIT")
                conn.close()

        return hash_pinned_state

    # ---------------------------------------------------------- snapshots

    def snapshot(self) -> bytes:
        """A consistent copy of the database at applied_index() (the Raft snapshot)."""
        return copy_to_bytes(self.snapshot_copier())[1]

    def snapshot_copier(self) -> Callable[[Path], int]:
        """A function that copies the state into the new, empty file at the path it is
        given, safe to run in another thread while this engine goes on applying; it
        returns the applied index of the copy.

        Copying a large database takes seconds, which the Raft node must not spend on its
        event loop (heartbeats would stop). The copy reads through its own connection in
        one read transaction: in WAL mode that sees one committed state and never blocks
        the writer, and the applied index is read from the copy itself. It goes to a file,
        never through memory: a state of gigabytes costs no more memory than a small one.
        """
        if self.path == ":memory:":  # no second connection can see it: copy here, now
            index, data = copy_to_bytes(lambda target: _backup_into(self._conn, target))
            return lambda target: _write_file(target, data, index)
        path = self.path

        def copy(target: Path) -> int:
            source = sqlite3.connect(path)
            try:
                return _backup_into(source, target)
            finally:
                source.close()

        return copy

    def restore(self, data: bytes | memoryview, index: int) -> None:
        """Replace the whole state with a snapshot taken at `index`.

        The copy goes through SQLite's backup API into the open database, so a crash
        during restore leaves either the old state or the new one. A snapshot of an older
        schema (from a node not yet upgraded, or an old backup) is migrated after the copy.
        """
        with tempfile.TemporaryDirectory(prefix="dex-engine-restore-") as tmp, self._write_lock:
            self._history_cache.clear()  # it holds the state being replaced (and only applies read it)
            path = os.path.join(tmp, "restore.db")
            with open(path, "wb") as f:
                f.write(data)
            source = sqlite3.connect(path, isolation_level=None)
            try:
                _check_snapshot(source, index)
                self._check_snapshot_version(source, index)
                # The copy takes the snapshot's page layout, its auto_vacuum setting too: one
                # from a node of an older version is made reclaimable first.
                make_reclaimable(source, "installing a snapshot")
                source.backup(self._conn)
            finally:
                source.close()
            self._conn.execute("PRAGMA journal_mode=WAL")
            init_schema(self._conn)
            self._reclaim_pending = self._free_pages() > 0


class EngineReader(Queries):
    """The engine's queries for a thread other than the one that applies.

    The node applies committed entries on its Raft thread while its HTTP side reads. A
    SQLite connection must not be used by two threads at once, so readers have their own;
    in WAL mode each read transaction sees one committed state and neither side blocks the
    other. Every public query runs in one read transaction, so a query of several
    statements (a session snapshot) never sees half of an apply. Use from one thread only.
    """

    def __init__(self, path: str) -> None:
        self._conn = connect(path, durable=True)
        self._conn.execute("PRAGMA query_only=ON")
        self._store = Store(self._conn)
        self._reading = False

    def close(self) -> None:
        self._conn.close()

    def _in_read_transaction(self, query: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        if self._reading:  # a query that calls another: one transaction for both
            return query(*args, **kwargs)
        self._reading = True
        self._conn.execute("BEGIN")
        try:
            return query(*args, **kwargs)
        finally:
            self._reading = False
            self._conn.execute("COMMIT")


def copy_to_bytes(copy: Callable[[Path], int]) -> tuple[int, bytes]:
    """Run a snapshot copier (`Engine.snapshot_copier`) into a temp file; (its index, its bytes)."""
    with tempfile.TemporaryDirectory(prefix="dex-engine-snap-") as tmp:
        target = Path(tmp) / "snapshot.db"
        index = copy(target)
        return index, target.read_bytes()


def _backup_into(source: sqlite3.Connection, target_path: Path) -> int:
    """Copy the database `source` reads into the file `target_path`; returns the copy's
    applied index.

    One backup step of all pages (pages=-1) holds one read transaction on the source, so
    the copy is one committed state even while another connection writes (WAL mode).
    """
    target = sqlite3.connect(target_path)
    try:
        source.backup(target, pages=-1)
        row = target.execute("SELECT value FROM meta WHERE key = ?", (APPLIED_INDEX,)).fetchone()
        target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
    finally:
        target.close()
    return 0 if row is None else int(row[0])


def _write_file(path: Path, data: bytes, index: int) -> int:
    path.write_bytes(data)
    return index


class _ReplayCarefully(Exception):
    """The fast path cannot answer for an entry: apply the batch again with savepoints."""


def _check_snapshot(source: sqlite3.Connection, index: int) -> None:
    try:
        version = source.execute("PRAGMA user_version").fetchone()[0]
        row = source.execute("SELECT value FROM meta WHERE key = ?", (APPLIED_INDEX,)).fetchone()
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"not an engine snapshot: {exc}") from None
    if version == 0 or not can_migrate(version):
        raise ValueError(f"snapshot has schema {version}, this engine knows {SCHEMA_VERSION}")
    found = 0 if row is None else row[0]
    if found != index:
        raise ValueError(f"snapshot was taken at index {found}, not {index}")
