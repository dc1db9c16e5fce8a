"""The SQLite store: connection setup, transactions, and small row helpers.

Durability: the Raft log is the durable record. After a crash the node replays the log from
the applied index stored in this database, and that index is written in the same
transaction as the change it covers. So the database never has to be more durable than
"consistent": WAL with `synchronous=NORMAL` (durable=True) keeps the file consistent even
on power loss (it may lose the last transactions, which the log replays);
`synchronous=OFF` (durable=False: tests, benchmarks) is safe against a process crash but
not against an OS crash. Neither mode fsyncs per command.

The store holds no Python-side copy of the state but one: the engine's store (not a
reader's) keeps recent histories for building tasks (history_cache.py), bounded in size.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]  # msgpack ships no type hints

from dex_ha.diskspace import is_disk_full
from dex_ha.engine.history_cache import ENTRY_OVERHEAD_CHARS, HistoryCache, SessionHistory
from dex_ha.engine.results import Rejected
from dex_ha.engine.schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION, SESSION_TABLES

log = logging.getLogger("dex_ha.engine")

APPLIED_INDEX = "applied_index"
# The cluster's state-machine version (SetClusterVersion); absent: the first version.
CLUSTER_VERSION = "cluster_state_machine_version"
WAL_SIZE_LIMIT_BYTES = 64 << 20
WAL_RESTART_AFTER_FRAMES = 4096  # 16 MB of 4 KB pages: a few seconds of writes at full load
# A member under the consistency alarm: meta key prefix + node id -> the index of the check.
CONSISTENCY_ALARM_PREFIX = "consistency_alarm/"
FENCED_TERM = "fenced_term"  # highest term of a FailHeldAttempts: older hand-outs are stale
DISK_FULL_LOG_EVERY_ROUNDS = 60  # a checkpoint that finds the disk full is logged once a minute
EVENT_ID_SHIFT = 16  # event id = (log index << 16) + its number within the entry and session


# The columns of a steps row that the engine's logic and the task queries read: the hot
# path reads these rather than every column (usage, error... are for the API's views).
STEP_COLUMNS = (
    "step_id, session_id, turn_id, agent, kind, call_id, status, attempts_used, max_attempts, "
    "start_to_close_ms, first_handout_at, queued_at, params, created_at"
)


def _canonical_encoder() -> Callable[[Any], str]:
    """Canonical JSON (sorted keys, no spaces): the same value gives the same text on every
    node. json.dumps builds a new C encoder on every call; on the hot path we build it once."""
    options = dict(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # no C accelerator: the plain encoder
        return json.JSONEncoder(**options).encode  # type: ignore[arg-type]

    def not_json(value: Any) -> Any:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    encode_chunks = c_make_encoder(None, not_json, json.encoder.encode_basestring, None, ":", ",", True, False, True)
    return lambda value: "".join(encode_chunks(value, 0))


to_json: Callable[[Any], str] = _canonical_encoder()


def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def connect(path: str, durable: bool) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT/SAVEPOINT ourselves.
    # check_same_thread=False: a server may apply from an executor thread; callers
    # serialise access (the Engine is not thread-safe).
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=512)
    conn.row_factory = sqlite3.Row
    # A new database frees the pages of deleted rows on request (Engine.reclaim_space). It
    # must be set before anything is written (WAL mode writes the header); on an existing
    # database it changes nothing (see Engine.__init__ for those made before it).
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'NORMAL' if durable else 'OFF'}")
    conn.execute("PRAGMA temp_store=MEMORY")
    conn.execute("PRAGMA cache_size=-16384")
    # Checkpoint every 8192 pages (32 MB of WAL) rather than 1000: fewer checkpoint
    # fsyncs, and a page changed many times in between is copied back once. (A server's
    # engine turns this off and checkpoints on a thread of its own: WalCheckpointer.)
    conn.execute("PRAGMA wal_autocheckpoint=8192")
    # When the WAL starts over, cut a file that grew past this back to it.
    conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
    conn.execute("PRAGMA foreign_keys=OFF")
    return conn


def state_hash(conn: sqlite3.Connection) -> str:
    """SHA-256 of every replicated row, in an order every node agrees on: tables by name,
    rows by primary key (by every column for a table without one). SQLite's own tables
    (statistics) are left out. Two nodes that applied the same log to the same index get
    the same hash; run it in one read transaction so that it sees one state."""
    digest = hashlib.sha256()
    tables = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchall()
    for (table,) in tables:
        info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
        columns = [row[1] for row in info]
        key = [row[1] for row in sorted(info, key=lambda row: row[5]) if row[5]] or columns
        digest.update(msgpack.packb([table, columns], use_bin_type=True))
        order = ", ".join(f'"{c}"' for c in key)
        for row in conn.execute(f'SELECT * FROM "{table}" ORDER BY {order}'):
            digest.update(msgpack.packb(tuple(row), use_bin_type=True))
    return digest.hexdigest()


class WalCheckpointer:
    """Copies the write-ahead log back into the database file on a thread of its own.

    SQLite's automatic checkpoint runs inside the COMMIT that fills the WAL past its limit,
    on the connection that commits: for the engine, an apply on the Raft thread, which then
    sends no heartbeat and no ack for as long as it takes (40 ms for 32 MB on an idle disk,
    hundreds under load). Here a connection of its own runs a PASSIVE checkpoint every
    `every_s`: it copies what no reader still needs and never blocks the writer or readers.

    A PASSIVE checkpoint alone never lets the WAL start over while entries keep applying:
    SQLite rewinds the WAL only when a write transaction begins with every frame already
    copied back, and under steady writes some frame is always newer than the last
    checkpoint (a loaded node's WAL grew by 600 MB a minute, and a restart must read all of
    it). So once the WAL holds more than `restart_after_frames`, the thread checkpoints once
    more while it holds `write_lock`, the lock every write transaction of the engine takes:
    no frame can come in meanwhile, the copy is short (the frames of the last moments), and
    the next write starts the WAL from its beginning. A reader still on an older state can
    keep that from happening; the next round tries again.
    """

    def __init__(
        self, path: str, durable: bool, every_s: float, write_lock: threading.Lock, restart_after_frames: int
    ) -> None:
        self._conn = connect(path, durable)
        self._every_s = every_s
        self._write_lock = write_lock
        self._restart_after_frames = restart_after_frames
        self._stop = threading.Event()
        self.checkpoints = 0  # completed, for tests and diagnosis
        self._thread = threading.Thread(target=self._run, name="engine-wal-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        disk_full_rounds = 0
        while not self._stop.wait(self._every_s):
            try:
                self._checkpoint_round()
                disk_full_rounds = 0
            except Exception as exc:  # the thread must live on: without it the WAL grows without bound
                if not is_disk_full(exc):
                    log.exception("engine WAL checkpoint failed; trying again in %.1f s", self._every_s)
                    continue
                if disk_full_rounds % DISK_FULL_LOG_EVERY_ROUNDS == 0:  # once, then now and then
                    log.warning("engine WAL checkpoint: the disk is full (%s); trying again", exc)
                disk_full_rounds += 1

    def _checkpoint_round(self) -> None:
        frames = self._checkpoint()
        if frames > self._restart_after_frames:
            with self._write_lock:
                self._checkpoint()

    def _checkpoint(self) -> int:
        """One PASSIVE checkpoint; returns the frames in the WAL."""
        _busy, frames, _copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.checkpoints += 1
        return int(frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


AUTO_VACUUM_INCREMENTAL = 2  # PRAGMA auto_vacuum's value for INCREMENTAL


def make_reclaimable(conn: sqlite3.Connection, what: str) -> bool:
    """Make a database made before deletions existed (auto_vacuum NONE) give the pages of
    deleted rows back to the file system: SQLite changes that setting only by rewriting the
    whole file (VACUUM), once. It changes no row: the state hash stays the same. Returns
    whether it had to."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == AUTO_VACUUM_INCREMENTAL:
        return False
    log.info("%s: rewriting the database once so that deleted sessions free disk space (VACUUM)", what)
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("VACUUM")
    return True


def reclaim_free_pages(conn: sqlite3.Connection, most: int) -> int:
    """Give up to `most` free pages back to the file system (outside a transaction); the
    free pages left. In WAL mode the file shrinks at the next checkpoint."""
    # executescript steps the pragma to its end: one execute() frees a single page.
    conn.executescript(f"PRAGMA incremental_vacuum({int(most)});")
    left: int = conn.execute("PRAGMA freelist_count").fetchone()[0]
    return left


def init_schema(conn: sqlite3.Connection) -> None:
    """Create the schema in a new database, or migrate an older one to SCHEMA_VERSION."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if not can_migrate(version):
        raise RuntimeError(f"engine database has schema {version}, this code knows {SCHEMA_VERSION}")
    if version == 0:
        conn.executescript(f"BEGIN; {SCHEMA} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
        return
    while version < SCHEMA_VERSION:  # one transaction per step: a crash leaves a known version
        conn.executescript(f"BEGIN; {MIGRATIONS[version]} PRAGMA user_version={version + 1}; COMMIT;")
        version += 1


def can_migrate(version: int) -> bool:
    """Whether init_schema can bring a database of schema `version` (0: new) to the current one."""
    return version == 0 or (
        1 <= version <= SCHEMA_VERSION and all(v in MIGRATIONS for v in range(version, SCHEMA_VERSION))
    )


class Store:
    """Row-level access to the state. Every write happens inside `Engine.apply`'s transaction."""

    def __init__(self, conn: sqlite3.Connection, history_cache: HistoryCache | None = None) -> None:
        self.conn = conn
        # Only on the connection that applies: the writes below keep it current.
        self.history_cache = history_cache
        # SQL text per (table, columns) shape; bounded by the few shapes the code uses.
        self._sql: dict[tuple[Any, ...], str] = {}
        # Parsed agent definitions by their JSON text (a pure memo: the text is the key,
        # so a rolled-back or restored change can never serve a stale definition).
        self._definitions: dict[str, dict[str, Any]] = {}
        # Rows that nothing reads while entries apply (session events, counters), kept
        # until the transaction's end and written then in one statement each: see
        # `buffer_entry_writes`. Empty outside a transaction.
        self._event_rows: list[tuple[str, int, int, str]] = []
        self._counts: dict[str, int] = {}
        # Sessions deleted since the engine last asked (take_deleted): their pages are free.
        self._deleted_sessions = 0

    # ------------------------------------------------------------- generic helpers

    def row(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Row | None:
        found: sqlite3.Row | None = self.conn.execute(sql, tuple(params)).fetchone()
        return found

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        return self.conn.execute(sql, tuple(params)).fetchall()

    def scalar(self, sql: str, params: Iterable[Any] = ()) -> Any:
        r = self.conn.execute(sql, tuple(params)).fetchone()
        return None if r is None else r[0]

    def insert(self, table: str, **cols: Any) -> None:
        key = ("insert", table, *cols)
        sql = self._sql.get(key)
        if sql is None:
            sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            self._sql[key] = sql
        self.conn.execute(sql, tuple(cols.values()))

    def update(self, table: str, where: dict[str, Any], **cols: Any) -> None:
        key = ("update", table, *where, "|", *cols)
        sql = self._sql.get(key)
        if sql is None:
            sets = ", ".join(f"{c} = ?" for c in cols)
            conds = " AND ".join(f"{c} = ?" for c in where)
            sql = f"UPDATE {table} SET {sets} WHERE {conds}"
            self._sql[key] = sql
        self.conn.execute(sql, (*cols.values(), *where.values()))

    @contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        """Changes inside are undone if the block raises (nested inside the apply transaction)."""
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            if self.conn.in_transaction:  # not when SQLite rolled it all back (SQLITE_FULL)
                self.conn.execute(f"ROLLBACK TO {name}")
                self.conn.execute(f"RELEASE {name}")
            if self.history_cache is not None:
                self.history_cache.rolled_back()
            raise
        self.conn.execute(f"RELEASE {name}")

    # ------------------------------------------------------------- meta

    def meta(self, key: str, default: int = 0) -> int:
        value = self.scalar("SELECT value FROM meta WHERE key = ?", (key,))
        return default if value is None else int(value)

    def set_meta(self, key: str, value: int) -> None:
        self.conn.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    # ------------------------------------------------------------- buffered writes

    def buffer_entry_writes(
        self, events: list[tuple[str, str, dict[str, Any]]], counts: dict[str, int], at: int, index: int
    ) -> None:
        """Keep an applied entry's events (one row per session it touched, its events in
        order) and counter increments until `write_buffered`, at the end of the transaction.

        No handler reads events or counters, so the rows need not be in the table before
        then; written together they cost one statement per transaction, not one per entry.
        The caller hands over an entry only once it applied (a refused entry's writes are
        never buffered), and `discard_buffered` drops them with a rolled-back transaction.
        """
        by_session: dict[str, list[list[Any]]] = {}
        for session_id, type_, data in events:
            by_session.setdefault(session_id, []).append([type_, data])
        self._event_rows.extend((sid, index, at, to_json(evs)) for sid, evs in by_session.items())
        for name, by in counts.items():
            self._counts[name] = self._counts.get(name, 0) + by

    def write_buffered(self) -> None:
        """Write the buffered events and counter increments (inside the transaction)."""
        rows, self._event_rows = self._event_rows, []
        for chunk in _chunks(rows, _ROWS_PER_INSERT):
            self.conn.execute(
                "INSERT INTO events(session_id, log_index, at, events) VALUES "
                + ", ".join(["(?, ?, ?, ?)"] * len(chunk)),
                [v for row in chunk for v in row],
            )
        counts, self._counts = sorted(self._counts.items()), {}
        for chunk in _chunks(counts, _ROWS_PER_INSERT):
            self.conn.execute(
                "INSERT INTO counters(name, value) VALUES "
                + ", ".join(["(?, ?)"] * len(chunk))
                + " ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                [v for row in chunk for v in row],
            )

    def discard_buffered(self) -> None:
        """Forget what was buffered: the transaction it belonged to is rolled back."""
        self._event_rows, self._counts = [], {}

    # ------------------------------------------------------------- deletion

    def delete_session(self, session_id: str) -> None:
        """Delete every row of the session, in every table (inside an apply), and what this
        store holds of it: its history in the cache, its events not yet written."""
        self.conn.execute(
            "DELETE FROM attempts WHERE step_id IN (SELECT step_id FROM steps WHERE session_id = ?)", (session_id,)
        )
        for table in SESSION_TABLES:
            self.conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
        # Events of earlier entries of this transaction are still buffered: written after
        # this, they would outlive their session (and only on the nodes that batched them so).
        self._event_rows = [row for row in self._event_rows if row[0] != session_id]
        if self.history_cache is not None:
            self.history_cache.deleted(session_id)
        self._deleted_sessions += 1

    def take_deleted(self) -> int:
        """How many sessions were deleted since the last call (the engine then reclaims space)."""
        deleted, self._deleted_sessions = self._deleted_sessions, 0
        return deleted

    # ------------------------------------------------------------- reads by key

    def agent_definition(self, name: str) -> dict[str, Any] | None:
        """The agent's normalised definition (shared: callers must not change it), read
        from the table."""
        return self.parsed_definition(self.scalar("SELECT definition FROM agents WHERE name = ?", (name,)))

    def warm_agent_definition(self, name: str) -> dict[str, Any] | None:
        """`agent_definition`, from the history cache when this store has one (inside an
        apply: `agent_changed` keeps it current)."""
        if self.history_cache is None:
            return self.agent_definition(name)
        known, definition = self.history_cache.definition(name)
        if not known:
            definition = self.agent_definition(name)
            self.history_cache.put_definition(name, definition)
        return definition

    def agent_changed(self, name: str) -> None:
        """The agent's definition was written (inside an apply)."""
        if self.history_cache is not None:
            self.history_cache.agent_changed(name)

    def parsed_definition(self, text: str | None) -> dict[str, Any] | None:
        """A definition's JSON text (None: no such agent) parsed, memoised by the text."""
        if text is None:
            return None
        parsed = self._definitions.get(text)
        if parsed is None:
            if len(self._definitions) >= 64:
                self._definitions.clear()
            parsed = self._definitions[text] = json.loads(text)
        return parsed

    def session(self, session_id: str) -> sqlite3.Row | None:
        return self.row("SELECT * FROM sessions WHERE session_id = ?", (session_id,))

    def session_for_round(self, session_id: str, turn_id: str) -> sqlite3.Row:
        """What a model round needs (turns.schedule_model_round): the session's agent, its
        history and summary counters, the agent's definition text and the turn's status
        (`turn_status`), in one read."""
        return _found(
            self.row(
                "SELECT s.session_id, s.agent, s.history_count, s.history_tokens, s.summary_upto_seq, "
                "s.summary_upto_tokens, a.definition, t.status AS turn_status FROM sessions s "
                "LEFT JOIN agents a ON a.name = s.agent LEFT JOIN turns t ON t.turn_id = ? "
                "WHERE s.session_id = ?",
                (turn_id, session_id),
            ),
            f"unknown session {session_id}",
        )

    def turn(self, turn_id: str) -> sqlite3.Row | None:
        return self.row("SELECT * FROM turns WHERE turn_id = ?", (turn_id,))

    def step(self, step_id: str) -> sqlite3.Row | None:
        """The step's columns that the engine's logic reads (STEP_COLUMNS)."""
        return self.row(f"SELECT {STEP_COLUMNS} FROM steps WHERE step_id = ?", (step_id,))

    def step_and_attempt(self, step_id: str, number: int) -> sqlite3.Row:
        """The step (STEP_COLUMNS) with the term and status of its attempt `number`
        (`attempt_term`, `attempt_status`: NULL when that attempt was never handed out),
        in one read. Rejected(not_found) when there is no such step."""
        prefixed = ", ".join(f"s.{c}" for c in STEP_COLUMNS.split(", "))
        return _found(
            self.row(
                f"SELECT {prefixed}, a.term AS attempt_term, a.status AS attempt_status "
                "FROM steps s LEFT JOIN attempts a ON a.step_id = s.step_id AND a.number = ? "
                "WHERE s.step_id = ?",
                (number, step_id),
            ),
            f"unknown step {step_id}",
        )

    def call(self, session_id: str, call_id: str) -> sqlite3.Row | None:
        return self.row("SELECT * FROM tool_calls WHERE session_id = ? AND call_id = ?", (session_id, call_id))

    # The require_* reads are for commands that name a row: one missing is the command's
    # fault, and the command is rejected (not_found) rather than the None passed on.

    def require_session(self, session_id: str, namespace: str | None = None) -> sqlite3.Row:
        """The session; with `namespace`, one of another namespace is not found either (a
        caller must not learn that it exists)."""
        session = self.session(session_id)
        if namespace is not None and session is not None and session["namespace"] != namespace:
            session = None
        return _found(session, f"unknown session {session_id}")

    def agent_namespace(self, name: str) -> str | None:
        """The namespace that owns agent name `name`: the one it is registered in, else the
        one of the sessions that name it (handlers.create_session keeps them in one); None
        while nothing names it."""
        found: str | None = self.scalar("SELECT namespace FROM agents WHERE name = ?", (name,))
        if found is None:
            found = self.scalar("SELECT namespace FROM sessions WHERE agent = ? LIMIT 1", (name,))
        return found

    def require_turn(self, turn_id: str) -> sqlite3.Row:
        return _found(self.turn(turn_id), f"unknown turn {turn_id}")

    def require_step(self, step_id: str) -> sqlite3.Row:
        return _found(self.step(step_id), f"unknown step {step_id}")

    def require_call(self, session_id: str, call_id: str) -> sqlite3.Row:
        return _found(self.call(session_id, call_id), f"session {session_id} has no tool call {call_id}")

    def require_timer(self, timer_id: str) -> sqlite3.Row:
        return _found(self.timer(timer_id), f"unknown timer {timer_id}")

    def attempt(self, step_id: str, number: int) -> sqlite3.Row | None:
        return self.row("SELECT * FROM attempts WHERE step_id = ? AND number = ?", (step_id, number))

    def timer(self, timer_id: str) -> sqlite3.Row | None:
        return self.row("SELECT * FROM timers WHERE timer_id = ?", (timer_id,))

    def approval(self, session_id: str, call_id: str) -> sqlite3.Row | None:
        return self.row("SELECT * FROM approvals WHERE session_id = ? AND call_id = ?", (session_id, call_id))

    def question(self, question_id: str) -> sqlite3.Row | None:
        return self.row("SELECT * FROM questions WHERE question_id = ?", (question_id,))

    def message(self, session_id: str, message_id: str) -> sqlite3.Row | None:
        return self.row("SELECT * FROM messages WHERE session_id = ? AND message_id = ?", (session_id, message_id))

    # ------------------------------------------------------------- history

    def append_history(
        self, session_id: str, turn_id: str | None, items: dict[str, Any] | list[dict[str, Any]], at: int
    ) -> int:
        """Append history items; returns the seq of the last. Keeps the session's counters current."""
        texts = [to_json(item) for item in (items if isinstance(items, list) else [items])]
        tokens = [estimate_tokens(text) for text in texts]
        # One statement moves the counters and says where the new items go.
        counted = self.row(
            "UPDATE sessions SET history_count = history_count + ?, "
            "history_tokens = history_tokens + ?, updated_at = ? WHERE session_id = ? "
            "RETURNING history_count",
            (len(texts), sum(tokens), at, session_id),
        )
        last: int = _found(counted, f"unknown session {session_id}")["history_count"]
        first = last - len(texts) + 1
        self.conn.executemany(
            "INSERT INTO history(session_id, seq, turn_id, item, tokens, at) VALUES (?, ?, ?, ?, ?, ?)",
            [(session_id, first + i, turn_id, text, n, at) for i, (text, n) in enumerate(zip(texts, tokens))],
        )
        if self.history_cache is not None:
            self.history_cache.appended(session_id, first, texts)
        return last

    def session_created(self, session_id: str) -> None:
        """A session was inserted (inside an apply): no history and no summary yet."""
        if self.history_cache is not None:
            self.history_cache.put(session_id, SessionHistory(summary=None, summary_upto_seq=0, last_seq=0))

    def set_summary(self, session_id: str, summary: str, upto_seq: int, upto_tokens: int, at: int) -> None:
        """The session's one summary now covers its history up to `upto_seq`."""
        self.update(
            "sessions",
            {"session_id": session_id},
            summary=summary,
            summary_upto_seq=upto_seq,
            summary_upto_tokens=upto_tokens,
            summary_at=at,
            updated_at=at,
        )
        if self.history_cache is not None:
            self.history_cache.summarised(session_id, summary, upto_seq)

    def session_history(self, session_id: str) -> SessionHistory:
        """The session's summary and the history items after it, read from the tables."""
        session = _found(
            self.row(
                "SELECT summary, summary_upto_seq, history_count FROM sessions WHERE session_id = ?", (session_id,)
            ),
            f"unknown session {session_id}",
        )
        after = session["summary_upto_seq"]
        text = self._history_array(session_id, after)
        return SessionHistory(
            session["summary"], after, session["history_count"], json.loads(text), ENTRY_OVERHEAD_CHARS + len(text)
        )

    def warm_session_history(self, session_id: str) -> SessionHistory:
        """`session_history`, from the history cache when this store has one (inside an
        apply); a session it does not hold yet is read once and kept."""
        if self.history_cache is None:
            return self.session_history(session_id)
        history = self.history_cache.session(session_id)
        if history is None:
            history = self.session_history(session_id)
            self.history_cache.put(session_id, history)
        return history

    def _history_array(self, session_id: str, after_seq: int) -> str:
        """The session's history items after `after_seq` as one JSON array: one parse of
        it costs much less than one json.loads per item."""
        rows = self.conn.execute(
            "SELECT item FROM history WHERE session_id = ? AND seq > ? ORDER BY seq", (session_id, after_seq)
        ).fetchall()
        return "[" + ",".join(r[0] for r in rows) + "]"


# Rows per multi-row INSERT: 4 values each stays far below SQLite's 32766 bound on values.
_ROWS_PER_INSERT = 500


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def estimate_tokens(text: str) -> int:
    """A deterministic token estimate (about four characters per token)."""
    return len(text) // 4 + 1


def _found(row: sqlite3.Row | None, reason: str) -> sqlite3.Row:
    if row is None:
        raise Rejected("not_found", reason)
    return row
