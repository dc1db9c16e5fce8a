"""The SQLite schema of the engine state (one file; it is also the Raft snapshot).

Ids are text derived from the log index (see `ids.IdGen`), so every node derives the same
ids. Partial indexes keep the leader's hot queries (queued steps per agent, running
attempts, the earliest timer) proportional to live work, not to history.
"""

SCHEMA_VERSION = 4

# Schema 3: history items (notes) that wait for a model response's tool results. A note may
# not stand between an assistant message's tool calls and their results (model APIs refuse
# such an input), so one that comes while calls are running is held here, and goes into the
# history right after those results (see turns.add_note).
HELD_NOTES = """
CREATE TABLE IF NOT EXISTS held_notes (
    session_id TEXT NOT NULL,
    position   INTEGER NOT NULL,        -- IdGen.queue_position(): log order
    item       TEXT NOT NULL,           -- JSON history item
    PRIMARY KEY (session_id, position)
) WITHOUT ROWID;
"""

# Schema 4: namespaces. Every session and agent belongs to one (docs/operations.md,
# "Namespaces and tokens"); rows written before it belong to `default`.
NAMESPACE_COLUMN = "namespace TEXT NOT NULL DEFAULT 'default'"
SESSIONS_BY_NAMESPACE = "CREATE INDEX IF NOT EXISTS sessions_by_namespace ON sessions(namespace, session_id);"

# How a database (or a snapshot) of an older schema becomes the current one: the statements
# that take version v to v + 1. New columns go last, so a migrated table has the same
# columns in the same order as a new one (equal states give equal dumps and snapshots).
MIGRATIONS: dict[int, str] = {
    1: "ALTER TABLE attempts ADD COLUMN token_secret TEXT;",
    2: HELD_NOTES,
    3: f"ALTER TABLE sessions ADD COLUMN {NAMESPACE_COLUMN}; "
    f"ALTER TABLE agents ADD COLUMN {NAMESPACE_COLUMN}; {SESSIONS_BY_NAMESPACE}",
}

# The tables whose rows belong to one session, each by its session_id column: deleting a
# session deletes its rows in every one of them, and its attempts through its steps
# (Store.delete_session). tests/engine/test_delete.py checks that no table is left out.
SESSION_TABLES = (
    "messages",
    "turns",
    "history",
    "held_notes",
    "tool_calls",
    "steps",
    "timers",
    "approvals",
    "questions",
    "events",
    "sessions",
)

SCHEMA = (
    HELD_NOTES
    + """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS agents (
    name       TEXT PRIMARY KEY,
    definition TEXT NOT NULL,           -- normalised JSON (agents.normalize_definition)
    version    INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    """
    + NAMESPACE_COLUMN
    + """
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS sessions (
    session_id          TEXT PRIMARY KEY,
    agent               TEXT NOT NULL,
    status              TEXT NOT NULL,  -- idle | running
    metadata            TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    current_turn_id     TEXT,
    turn_count          INTEGER NOT NULL DEFAULT 0,
    message_count       INTEGER NOT NULL DEFAULT 0,
    history_count       INTEGER NOT NULL DEFAULT 0,  -- seq of the latest history item
    history_tokens      INTEGER NOT NULL DEFAULT 0,  -- estimated tokens of all items
    summary             TEXT,                        -- the one summary of the session
    summary_upto_seq    INTEGER NOT NULL DEFAULT 0,  -- items up to here are summarised
    summary_upto_tokens INTEGER NOT NULL DEFAULT 0,
    summary_at          INTEGER,
    """
    + NAMESPACE_COLUMN
    + """
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_agent ON sessions(agent, session_id);
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions(status, session_id);

CREATE TABLE IF NOT EXISTS messages (
    session_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    text       TEXT NOT NULL,
    mode       TEXT NOT NULL,           -- queue | steer
    status     TEXT NOT NULL,           -- waiting | delivered
    turn_id    TEXT,                    -- the turn that delivered it
    at         INTEGER NOT NULL,
    PRIMARY KEY (session_id, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS messages_waiting ON messages(session_id, seq) WHERE status = 'waiting';

CREATE TABLE IF NOT EXISTS turns (
    turn_id    TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    number     INTEGER NOT NULL,
    status     TEXT NOT NULL,           -- running | completed | failed | cancelled
    message_id TEXT NOT NULL,
    first_seq  INTEGER NOT NULL,        -- history seq of the message that started it
    started_at INTEGER NOT NULL,
    ended_at   INTEGER,
    error      TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS turns_by_session ON turns(session_id, number);

CREATE TABLE IF NOT EXISTS history (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    turn_id    TEXT,
    item       TEXT NOT NULL,           -- JSON {"type": user|assistant|tool_result|note, ...}
    tokens     INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS tool_calls (
    session_id       TEXT NOT NULL,
    call_id          TEXT NOT NULL,
    turn_id          TEXT NOT NULL,
    agent            TEXT NOT NULL,     -- the session's agent (its queue for the call's steps)
    response_step_id TEXT NOT NULL,     -- the RunModel step whose response made the call
    position         INTEGER NOT NULL,  -- order within that response
    name             TEXT NOT NULL,
    arguments        TEXT NOT NULL,
    policy           TEXT NOT NULL,     -- the tool policy in force when the response committed
    effect           TEXT,              -- NULL when no registered agent defines the tool
    step_id          TEXT,              -- the call's current (latest) step
    status           TEXT NOT NULL,     -- pending | succeeded | failed | outcome_unknown
    output           TEXT,
    error            TEXT,
    attempt_progress TEXT,              -- NOT_STARTED | NOT_COMPLETED, when it did not succeed
    ran              INTEGER NOT NULL DEFAULT 0,  -- an attempt reached (may have reached) a Worker
    handle           TEXT,              -- long-running task handle
    poll_after_ms    INTEGER,
    created_at       INTEGER NOT NULL,
    ended_at         INTEGER,
    reconciled_at    INTEGER,
    PRIMARY KEY (session_id, call_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tool_calls_by_response ON tool_calls(response_step_id, position);
CREATE INDEX IF NOT EXISTS tool_calls_by_turn ON tool_calls(turn_id, created_at);

CREATE TABLE IF NOT EXISTS steps (
    step_id           TEXT PRIMARY KEY,
    session_id        TEXT NOT NULL,
    turn_id           TEXT NOT NULL,
    agent             TEXT NOT NULL,
    kind              TEXT NOT NULL,
    call_id           TEXT,
    status            TEXT NOT NULL,    -- queued | running | backoff | waiting | done | failed | cancelled
    queue_seq         INTEGER,          -- FIFO position while queued
    queued_at         INTEGER,          -- when it last became queued (schedule-to-start)
    attempts_used     INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER,
    start_to_close_ms INTEGER,
    first_handout_at  INTEGER,
    params            TEXT,             -- JSON: what the kind needs (answer, handle, cutoff)
    usage             TEXT,             -- JSON usage reported by a RunModel result
    created_at        INTEGER NOT NULL,
    ended_at          INTEGER,
    error             TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS steps_queue ON steps(agent, queue_seq) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS steps_by_turn ON steps(turn_id, created_at);
CREATE INDEX IF NOT EXISTS steps_by_call ON steps(session_id, call_id) WHERE call_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS attempts (
    step_id          TEXT NOT NULL,
    number           INTEGER NOT NULL,
    term             INTEGER NOT NULL,
    worker_id        TEXT NOT NULL,
    idempotency_key  TEXT,              -- "{session_id}:{call_id}" for a tool call's attempts
    status           TEXT NOT NULL,     -- running | completed | failed
    started_at       INTEGER NOT NULL,
    deadline_at      INTEGER,
    ended_at         INTEGER,
    error            TEXT,
    attempt_progress TEXT,              -- set when it failed
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    result_digest    TEXT,              -- to answer a repeated identical completion with ok
    -- The random secret the leader drew for this hand-out: part of the task token, so only
    -- the Worker that was handed the task can name it. NULL for hand-outs committed before
    -- schema 2 (no token matches them). Never shown by a query.
    token_secret     TEXT,
    PRIMARY KEY (step_id, number)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS attempts_running ON attempts(term, step_id) WHERE status = 'running';

CREATE TABLE IF NOT EXISTS timers (
    timer_id   TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    turn_id    TEXT NOT NULL,
    step_id    TEXT NOT NULL,
    purpose    TEXT NOT NULL,           -- backoff | sleep | poll | retry_window
    due_at     INTEGER NOT NULL,
    status     TEXT NOT NULL,           -- pending | fired | cancelled
    fired_at   INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS timers_due ON timers(due_at, timer_id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS timers_by_session ON timers(session_id) WHERE status = 'pending';

CREATE TABLE IF NOT EXISTS approvals (
    session_id   TEXT NOT NULL,
    call_id      TEXT NOT NULL,
    step_id      TEXT NOT NULL,
    status       TEXT NOT NULL,         -- pending | approved | denied | cancelled
    reason       TEXT,
    requested_at INTEGER NOT NULL,
    decided_at   INTEGER,
    PRIMARY KEY (session_id, call_id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS questions (
    question_id TEXT PRIMARY KEY,
    session_id  TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    step_id     TEXT NOT NULL,
    source      TEXT NOT NULL,          -- ask_user (the model asked) | tool (a tool asked)
    question    TEXT NOT NULL,          -- JSON
    status      TEXT NOT NULL,          -- pending | answered | cancelled
    answer      TEXT,
    asked_at    INTEGER NOT NULL,
    answered_at INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS questions_by_session ON questions(session_id, asked_at);

-- The events one log entry made in one session, as one row (one insert per entry, not
-- per event). Event n of the row has the id (log_index << 16) + n: ids increase, and
-- every node derives the same ones (the SSE id, for Last-Event-ID resume).
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    log_index  INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    events     TEXT NOT NULL,           -- JSON [[type, data], ...] in the order they happened
    PRIMARY KEY (session_id, log_index)
) WITHOUT ROWID;

-- Counters that only grow (Prometheus counters read them), kept with the state so they
-- are the same on every node and survive a failover: tool_calls.<outcome> counts each
-- outcome recorded, a reconciled call once as outcome_unknown and once as its settlement.
CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
"""
    + SESSIONS_BY_NAMESPACE
)
