"""The engine as this node's Raft state machine, plus the signals that wake whoever waits
for the state to change: `changed` for everything that watches the whole state (long polls,
the timer and drain loops), `session_waiters` for the SSE streams, each of one session.

Two threads use it. The Raft thread applies committed entries through `apply_batch` (and
restores snapshots) on the engine's own connection. The HTTP side reads through `reads`, an
EngineReader with a connection of its own, and waits on `changed` and `session_waiters`,
which `apply_batch` notifies on the HTTP side's loop.

A commit wakes only the streams of the sessions it added events to (ApplyResult's
`event_sessions`): with a thousand idle streams open, a write to one session costs one
stream's query, not a thousand. When the sessions are not known (a snapshot was installed)
or the node's role changed, every stream wakes and checks for itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dex_ha.engine import (
    AnswerQuestion,
    ApplyResult,
    ClusterVersionSet,
    ConsistencyAlarmSet,
    DecideApproval,
    Engine,
    EngineReader,
    FireTimer,
    TimerFired,
    decode_command,
)
from dex_ha.engine.statuses import TimerPurpose
from dex_ha.failpoints import Failpoints

# Crash-matrix row R18: an entry that ended a wait (approval decided, question answered, a
# sleep or poll timer fired) is committed and applied here, and the leader services have
# not been told yet, so nothing moves the turn on in this process (no hand-out of the
# step the entry queued, no answer to the client).
WAIT_ENDED_FAILPOINT = "server.wait.after-commit"

log = logging.getLogger("dex_ha.server")


class ChangeSignal:
    """A broadcast 'something changed': every waiter wakes on the next `notify()`.

    A waiter reads `version` before it reads the state, then waits for a version above it,
    so a change between its read and its wait is never missed.
    """

    def __init__(self) -> None:
        self.version = 0
        self._event = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` on every change (for loops that also wake on other things)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def notify(self) -> None:
        self.version += 1
        self._event.set()
        self._event = asyncio.Event()
        for listener in self._listeners:
            listener()

    async def wait_past(self, version: int, timeout_s: float | None) -> bool:
        """Wait until the version is above `version`; False when `timeout_s` passed first."""
        if self.version > version:
            return True
        event = self._event
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: see dex_ha.server.leader
                await event.wait()
            return True
        except TimeoutError:
            return self.version > version


class SessionWaiters:
    """The events the SSE streams wait on, by session: `wake(ids)` sets those of the
    sessions `ids` (None: of every session).

    A stream clears its event before it reads the session's events and waits on it after,
    so a commit that lands between its read and its wait sets the event and is never missed.
    """

    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = {}

    def add(self, session_id: str, event: asyncio.Event) -> None:
        self._events.setdefault(session_id, set()).add(event)

    def remove(self, session_id: str, event: asyncio.Event) -> None:
        events = self._events.get(session_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._events[session_id]

    def wake(self, session_ids: Iterable[str] | None) -> None:
        """Set the events of `session_ids`, or of every session when it is None (unknown)."""
        if session_ids is None:
            session_ids = list(self._events)
        for session_id in session_ids:
            for event in self._events.get(session_id, ()):
                event.set()


class Replica:
    """The Raft StateMachine protocol over an Engine, with a change signal.

    `engine` is for the Raft thread only; everything else reads through `reads`.
    """

    def __init__(self, engine: Engine, failpoints: Failpoints | None = None) -> None:
        self.engine = engine
        self._failpoints = failpoints or Failpoints("")
        self.reads: EngineReader = engine.reader()
        self.changed = ChangeSignal()
        self.session_waiters = SessionWaiters()
        self._loop: asyncio.AbstractEventLoop | None = None
        # What the next notify on the loop wakes: the sessions changed since the last one
        # (None: unknown, every stream), and whether that notify is scheduled. The Raft
        # thread adds to them, the loop takes them; the lock keeps the two from racing.
        self._pending_lock = threading.Lock()
        self._pending_sessions: set[str] | None = set()
        self._notify_scheduled = False
        # The consistency check (consistency.py): `on_state_hash(index, sha256)` once this
        # node hashed its state at a CheckStateHash entry, `on_alarms(alarms)` when the
        # replicated alarms change; both called on the notify loop.
        self.on_state_hash: Callable[[int, str], None] | None = None
        self.on_alarms: Callable[[dict[str, int]], None] | None = None
        self._hasher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="state-hash")
        engine.on_state_check = self._hash_state_at
        # The cluster's state-machine version as applied here (versions.py), kept in memory:
        # every proposal checks it. Set on the Raft thread, read anywhere (one int).
        self.cluster_version = engine.cluster_version()
        # Traces (tracing.py): while this node is active and exports traces, called on the
        # loop with the sessions whose events changed (None: not known, every session).
        self.on_sessions_changed: Callable[[Iterable[str] | None], None] | None = None

    def notify_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Changes are signalled on `loop` (the HTTP side's), whichever thread applied them."""
        self._loop = loop

    def apply_batch(self, entries: list[tuple[int, bytes]]) -> list[ApplyResult[Any]]:
        results = self.engine.apply_batch(entries)
        if self._failpoints.armed(WAIT_ENDED_FAILPOINT) and any(map(_ended_a_wait, entries, results)):
            self._failpoints.hit(WAIT_ENDED_FAILPOINT)
        if any(isinstance(result.value, ConsistencyAlarmSet) for result in results):
            self._alarms_changed()
        if any(isinstance(result.value, ClusterVersionSet) for result in results):
            self.cluster_version = self.engine.cluster_version()
        self._signal_change(frozenset().union(*(result.event_sessions for result in results)))
        return results

    def _hash_state_at(self, index: int) -> None:
        """On the Raft thread, right after the CheckStateHash entry at `index` committed:
        pin the state and hash it on the hashing thread (Engine.open_state_hash)."""
        hash_pinned = self.engine.open_state_hash()
        done = self._hasher.submit(hash_pinned)
        done.add_done_callback(lambda f: self._on_loop(self._hashed, index, f))

    def _hashed(self, index: int, done: concurrent.futures.Future[str]) -> None:
        try:
            digest = done.result()
        except Exception:
            log.exception("hashing the state at index %d failed; the next check will try again", index)
            return
        if self.on_state_hash is not None:
            self.on_state_hash(index, digest)

    def _alarms_changed(self) -> None:
        alarms = self.engine.consistency_alarms()
        if self.on_alarms is not None:
            self._on_loop(self.on_alarms, alarms)

    def _on_loop(self, call: Callable[..., None], *args: Any) -> None:
        if self._loop is None:
            call(*args)
        else:
            self._loop.call_soon_threadsafe(call, *args)

    def _signal_change(self, session_ids: frozenset[str] | None) -> None:
        """Wake `changed` and the streams of `session_ids` (None: every stream) on the loop.
        Many applies in a row need only one wake-up: the waiters re-read the state, which by
        then includes all of them; the sessions of all of them are woken."""
        if self._loop is None:
            self._notify(session_ids)
            return
        with self._pending_lock:
            if session_ids is None:
                self._pending_sessions = None
            elif self._pending_sessions is not None:
                self._pending_sessions.update(session_ids)
            if self._notify_scheduled:
                return
            self._notify_scheduled = True
        self._loop.call_soon_threadsafe(self._notify_now)

    def _notify_now(self) -> None:
        with self._pending_lock:  # an apply from now on schedules anew, with its own sessions
            session_ids, self._pending_sessions = self._pending_sessions, set()
            self._notify_scheduled = False
        self._notify(session_ids)

    def _notify(self, session_ids: Iterable[str] | None) -> None:
        self.changed.notify()
        self.session_waiters.wake(session_ids)
        if self.on_sessions_changed is not None:
            self.on_sessions_changed(session_ids)

    def wake_everyone(self) -> None:
        """On the loop: wake every waiter, every stream included, to check again (this
        node's role changed: a stream ends once its node no longer serves)."""
        self._notify(None)

    def applied_index(self) -> int:
        return self.engine.applied_index()

    def snapshot_copier(self) -> Callable[[Path], int]:
        return self.engine.snapshot_copier()

    def restore(self, data: bytes | memoryview, index: int) -> None:
        self.engine.restore(data, index)
        self.cluster_version = self.engine.cluster_version()
        self._alarms_changed()
        self._signal_change(None)  # a whole new state: which sessions changed is not known

    def close(self) -> None:
        self._hasher.shutdown(wait=True)
        self.reads.close()
        self.engine.close()


def _ended_a_wait(entry: tuple[int, bytes], result: ApplyResult[Any]) -> bool:
    if not result.ok or result.noop or not entry[1]:
        return False
    cmd = decode_command(entry[1])
    if isinstance(cmd, FireTimer):
        fired = result.value
        return not (isinstance(fired, TimerFired) and fired.purpose == TimerPurpose.BACKOFF)  # a backoff ends no wait
    return isinstance(cmd, (DecideApproval, AnswerQuestion))
