"""The side-effect ledger of a crash cell: a SQLite file outside the server, written by the
worker processes (old and new) and read by the test.

One row per thing that happened in a Worker: a tool function started or finished, a tool
heartbeat got through, a poll ran, the model was called (with what it saw), a summary was
asked for. The server's snapshot says what Dex recorded; the ledger says what really ran.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    kind     TEXT NOT NULL,     -- tool | poll | model | summary
    name     TEXT NOT NULL,     -- the tool's name (model and summary: the agent's)
    moment   TEXT NOT NULL,     -- started | finished | beat | asked
    call_id  TEXT,
    key      TEXT,              -- the idempotency key the Worker passed to the tool
    attempt  INTEGER,           -- the attempt number (model and summary: the n-th call with this input)
    data     TEXT,              -- JSON: arguments, handle, what the model saw, ...
    pid      INTEGER NOT NULL,
    at       REAL NOT NULL      -- wall clock, seconds
)
"""


# The fields of a record, in the order of the table's columns and of `Run` after `seq`.
RECORD_FIELDS = ("kind", "name", "moment", "call_id", "key", "attempt", "data", "pid", "at")


@dataclass(frozen=True)
class Run:
    seq: int
    kind: str
    name: str
    moment: str
    call_id: str | None
    key: str | None
    attempt: int | None
    data: Any
    pid: int
    at: float


class LedgerFile:
    """What both ledger formats share: a record's fields, and counting runs. A subclass
    appends one record (`_append`) and reads them back (`runs`)."""

    path: Path

    def record(
        self,
        kind: str,
        name: str,
        moment: str,
        *,
        call_id: str | None = None,
        key: str | None = None,
        attempt: int | None = None,
        data: Any = None,
    ) -> None:
        fields = dict(kind=kind, name=name, moment=moment, call_id=call_id, key=key, attempt=attempt, data=data)
        self._append({**fields, "pid": os.getpid(), "at": time.time()})

    def _append(self, fields: dict[str, Any]) -> None:
        raise NotImplementedError

    def runs(self, kind: str | None = None, name: str | None = None, moment: str | None = None) -> list[Run]:
        raise NotImplementedError

    def count(self, kind: str, name: str | None = None, moment: str = "started") -> int:
        return len(self.runs(kind, name, moment))

    def close(self) -> None:
        raise NotImplementedError


class Ledger(LedgerFile):
    """One connection to the ledger file; every write commits at once (autocommit), so a
    SIGKILL loses nothing that was written before it."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)

    def _append(self, fields: dict[str, Any]) -> None:
        self._db.execute(
            f"INSERT INTO runs ({', '.join(RECORD_FIELDS)}) VALUES ({', '.join('?' * len(RECORD_FIELDS))})",
            tuple(json.dumps(fields[f]) if f == "data" else fields[f] for f in RECORD_FIELDS),
        )

    def runs(self, kind: str | None = None, name: str | None = None, moment: str | None = None) -> list[Run]:
        where, params = [], []
        for column, value in (("kind", kind), ("name", name), ("moment", moment)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT * FROM runs" + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY seq"
        return [
            Run(
                row[0],
                *(json.loads(value) if field == "data" else value for field, value in zip(RECORD_FIELDS, row[1:])),
            )
            for row in self._db.execute(sql, params)
        ]

    def close(self) -> None:
        self._db.close()


class JsonLedger(LedgerFile):
    """The same ledger as a file of JSON lines: what the TypeScript Worker writes (Node 20 has
    no SQLite), with the same reads. Each line is one append of the whole line, so a SIGKILL
    leaves at most a half-written last line, which is skipped."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.touch()

    def _append(self, fields: dict[str, Any]) -> None:
        line = json.dumps(fields) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def runs(self, kind: str | None = None, name: str | None = None, moment: str | None = None) -> list[Run]:
        wanted = {"kind": kind, "name": name, "moment": moment}
        runs = []
        for seq, line in enumerate(self.path.read_text().split("\n"), start=1):
            if not line.endswith("}"):
                continue  # the last line of a process that died while writing it
            row = json.loads(line)
            if all(value is None or row[column] == value for column, value in wanted.items()):
                runs.append(Run(seq, *(row[f] for f in RECORD_FIELDS)))
        return runs

    def close(self) -> None:
        """Nothing to close: every write opens the file."""
