"""One crash cell: its agent, session, worker process, ledger and event stream, and the
failure column it runs in. Scenarios (test_matrix.py) drive it; every wait has a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dex_ha.client import DexClient, SessionEvent
from harness.waiting import eventually
from tests.crash.columns import DEADLINE_S, Column, WorkerProcess
from tests.crash.ledger import JsonLedger, Ledger, Run

# The Worker's heartbeat interval in server-failure cells "before the first heartbeat":
# the failure comes well within it after the tool started, so no heartbeat reached Dex.
SLOW_HEARTBEAT_S = 10.0


class Cell:
    def __init__(self, row: str, column: Column, directory: Path, language: str = "python") -> None:
        """`language`: the Worker's, "python" or "ts" (the TypeScript Worker, whose ledger is
        a file of JSON lines)."""
        self.row, self.column, self.dir, self.language = row, column, directory, language
        self.agent = f"{row.lower()}-{column.name.replace('_', '-')}-{secrets.token_hex(3)}"
        self.ledger = (
            Ledger(directory / "ledger.db") if language == "python" else JsonLedger(directory / "ledger.jsonl")
        )
        self.client = DexClient(column.urls, column.client_token, backoff_max_s=0.2)
        self.worker: WorkerProcess | None = None
        self.sid = ""
        self.events: list[SessionEvent] = []
        self.deaths: list[str] = []  # how each failure happened (SIGKILL or a failpoint's exit)
        self.failed_at: list[float] = []
        self._collectors: list[asyncio.Task[None]] = []
        self.other_events: dict[str, list[SessionEvent]] = {}  # sessions of open_another()
        self.agent_args: list[str] = []  # more arguments of the Worker process, for the agent

    @property
    def worker_kill(self) -> bool:
        return self.column.name == "worker_kill"

    # ---------------------------------------------------------------- processes

    def start_worker(
        self, failpoints: str = "", heartbeat_interval_s: float | None = None, max_concurrency: int | None = None
    ) -> WorkerProcess:
        self.worker = WorkerProcess(
            self.column.urls,
            self.column.worker_token,
            ledger=self.ledger.path,
            row=self.row,
            agent=self.agent,
            column=self.column.name,
            log_path=self.dir / "worker.log",
            failpoints=failpoints,
            heartbeat_interval_s=heartbeat_interval_s,
            max_concurrency=max_concurrency,
            language=self.language,
            agent_args=self.agent_args,
        )
        self.worker.start()
        return self.worker

    async def fail(self) -> None:
        self.failed_at.append(time.time())
        self.deaths.append(await self.column.fail(self.worker))

    async def recover(self, arm: str = "") -> None:
        await self.column.recover(self.worker, arm)

    async def interrupt(self) -> None:
        await self.fail()
        await self.recover()

    # ---------------------------------------------------------------- the session

    async def open(self) -> str:
        self.sid = (await self.client.create_session(self.agent)).session_id
        self._collectors.append(asyncio.create_task(self._collect_events(self.sid, self.events)))
        return self.sid

    async def open_another(self) -> str:
        """One more session of the cell's agent, its events in `other_events[sid]`."""
        sid = (await self.client.create_session(self.agent)).session_id
        self.other_events[sid] = []
        self._collectors.append(asyncio.create_task(self._collect_events(sid, self.other_events[sid])))
        return sid

    async def _collect_events(self, sid: str, into: list[SessionEvent]) -> None:
        async for event in self.client.events(sid):
            into.append(event)

    async def send(self, text: str) -> None:
        await self.client.send_message(self.sid, text)

    async def snapshot(self) -> dict[str, Any]:
        """The session's snapshot as JSON (the cells read it by key)."""
        return (await self.client.get_session(self.sid)).raw

    async def idle(self, sid: str | None = None) -> dict[str, Any]:
        """The idle snapshot of the cell's session (or of another, `sid`), once the event
        stream has also seen the end of the last turn."""
        sid = sid or self.sid
        events = self.events if sid == self.sid else self.other_events[sid]
        snap = (await self.client.wait_until_idle(sid, timeout_s=DEADLINE_S)).raw
        last_turn = snap["turns"][-1]["turn_id"]
        await eventually(
            lambda: any(
                e.type.startswith("turn_") and e.data.get("turn_id") == last_turn and e.type != "turn_started"
                for e in events
            ),
            "the event stream to reach the end of the last turn",
            DEADLINE_S,
        )
        return snap

    async def until(self, check: Callable[[dict[str, Any]], Any], what: str) -> dict[str, Any]:
        """The first snapshot for which `check` is truthy."""

        async def probe() -> dict[str, Any] | None:
            snap = await self.snapshot()
            return snap if check(snap) else None

        return await eventually(probe, what, DEADLINE_S)

    async def until_ledger(self, kind: str, name: str, moment: str = "started", count: int = 1) -> list[Run]:
        return await eventually(
            lambda: (runs := self.ledger.runs(kind, name, moment)) and len(runs) >= count and runs,
            f"{count} ledger {kind} {name} {moment}",
            DEADLINE_S,
        )

    def committed(self, event_type: str, sid: str | None = None) -> list[SessionEvent]:
        """The committed events of `event_type` of the cell's session (or of another, `sid`)."""
        events = self.events if sid is None or sid == self.sid else self.other_events[sid]
        return [e for e in events if e.id is not None and e.type == event_type]

    def step_attempts(self, kind: str, sid: str | None = None) -> list[tuple[str, str | None]]:
        """(status, attempt_progress) of every attempt of the session's steps of `kind`, from the
        committed events (the snapshot of an ended turn no longer lists its steps). Call it
        once the session is idle: an attempt that started and did not fail completed."""
        failed = {
            (e.data["step_id"], e.data["attempt"]): e.data["attempt_progress"]
            for e in self.committed("attempt_failed", sid)
        }
        started = [
            (e.data["step_id"], e.data["attempt"])
            for e in self.committed("attempt_started", sid)
            if e.data["kind"] == kind
        ]
        return [("failed", failed[key]) if key in failed else COMPLETED for key in started]

    async def close(self) -> None:
        for collector in self._collectors:
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await collector
        if self.worker is not None:
            self.worker.kill()
        await self.client.close()
        self.ledger.close()


# ---------------------------------------------------------------- reading a snapshot


def call_of(snap: dict[str, Any], call_id: str) -> dict[str, Any]:
    return next(c for c in snap["tool_calls"] if c["call_id"] == call_id)


def attempts(steps: list[dict[str, Any]], kind: str) -> list[tuple[str, str | None]]:
    """(status, attempt_progress) of every attempt of the steps of `kind`, in order."""
    return [(a["status"], a["attempt_progress"]) for s in steps if s["kind"] == kind for a in s["attempts"]]


def history_types(history: list[dict[str, Any]]) -> list[str]:
    return [item["type"] for item in history]


def results_seen(run: Run) -> dict[str, str]:
    """call_id -> status of the tool results a model call saw."""
    return {item["call_id"]: item["status"] for item in run.data["history"] if item["type"] == "tool_result"}


FAILED = ("failed", "NOT_COMPLETED")
COMPLETED = ("completed", None)
