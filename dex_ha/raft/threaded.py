"""A RaftNode on its own thread and event loop, so that load elsewhere cannot delay it.

Why a thread: a node's HTTP side can be flooded (thousands of connections, a scrape storm).
If ticks, heartbeats and the transport share its event loop, a burst delays heartbeats past
the election timeout and the cluster fails over: the worst answer to load. On its own loop,
the Raft node wakes for its ticks and messages whatever the HTTP loop is doing; Python's
GIL hands it the interpreter within `sys.getswitchinterval()` of its asking, which is small
against the heartbeat interval. (A separate process would isolate it from the GIL too, but
every read of the state and every proposal would then cross a process boundary.)

The HTTP side (the *caller's* loop) talks to the node only through this class:

- `view`: the `RaftView` the node publishes after each change (term, role, leader, lease
  end, commit index). Reading it is one attribute read; no lock, no call into the core.
- `propose`, `change_membership`, `transfer_leadership`, `status`: the request runs on the
  Raft loop, and its answer comes back on the caller's loop.
- `on_leader_change` and `on_fatal` are called on the caller's loop and on the Raft thread
  respectively (a fatal error must end the process even while the caller's loop is busy).

The state machine is applied on the Raft thread; it must allow reads from the caller's
thread meanwhile (the engine reads through its own SQLite connection, see
dex_ha.engine.EngineReader).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from .core import NotLeader
from .loop_thread import LoopThread
from .node import Member, NodeConfig, RaftNode, RaftView, StateMachine
from .status import Status
from .types import ConfChange


class _ReplyToLoop:
    """Carries a proposal's outcome from the Raft thread to a future on the caller's loop.

    Outcomes are buffered and handed over in one `call_soon_threadsafe` per batch: under
    load one Ready settles hundreds of proposals, and one wake-up of the caller's loop per
    batch costs far less than one per proposal.
    """

    __slots__ = ("future", "_outbox")

    def __init__(self, future: asyncio.Future[Any], outbox: _Outbox) -> None:
        self.future = future
        self._outbox = outbox

    def done(self) -> bool:
        return self.future.done()  # a read of the caller's future: at worst stale, never wrong

    def set_result(self, result: Any) -> None:
        self._outbox.put(self.future, result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._outbox.put(self.future, None, exc)


class _Outbox:
    """Outcomes waiting to be set on the caller's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._lock = threading.Lock()

    def put(self, future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
        with self._lock:
            self._items.append((future, result, exc))
            first = len(self._items) == 1
        if first:  # one wake-up per batch: later puts join the batch until it is delivered
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for future, result, exc in items:
            if future.done():  # the caller gave up (its request was cancelled)
                continue
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)


class RaftThread:
    """Runs `RaftNode(config, state_machine)` on a thread of its own (see the module doc)."""

    def __init__(
        self,
        config: NodeConfig,
        state_machine: StateMachine,
        *,
        on_leader_change: Callable[[str], None] | None = None,
        on_fsync: Callable[[float], None] | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._on_leader_change = on_leader_change
        self._on_fatal = on_fatal
        self.node = RaftNode(
            config, state_machine, on_leader_change=self._leader_changed, on_fsync=on_fsync, on_fatal=self._fatal
        )
        self._thread = LoopThread(f"raft-{config.id}")
        self._caller_loop: asyncio.AbstractEventLoop | None = None
        self._outbox: _Outbox | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the thread and the node on it; returns once the node listens."""
        self._caller_loop = asyncio.get_running_loop()
        self._outbox = _Outbox(self._caller_loop)
        await self._thread.start(self.node.start)

    async def stop(self) -> None:
        """Stop the node, then its loop and thread."""
        await self._thread.stop(self.node.stop())

    # ------------------------------------------------------------------ reads

    @property
    def id(self) -> str:
        return self.node.id

    @property
    def view(self) -> RaftView:
        return self.node.view

    @property
    def failure(self) -> BaseException | None:
        return self.node.failure

    def members(self) -> dict[str, Member]:
        return self.node.members()  # a copy, replaced as a whole on the Raft thread

    async def status(self) -> Status:
        """The core's full status (members, progress), read on the Raft loop."""
        return await self._thread.call(self.node.status)

    # ------------------------------------------------------------------ requests

    async def propose(self, data: bytes) -> Any:
        """Replicate `data`, apply it, and return the state machine's result (see RaftNode.propose)."""
        view = self.view
        if not view.is_leader:
            raise NotLeader(view.leader_id)
        loop = self._thread.loop
        assert loop is not None and self._outbox is not None and self._caller_loop is not None
        future: asyncio.Future[Any] = self._caller_loop.create_future()
        loop.call_soon_threadsafe(self.node.enqueue, data, _ReplyToLoop(future, self._outbox))
        return await future

    async def change_membership(self, cc: ConfChange) -> None:
        await self._thread.run(self.node.change_membership(cc))

    async def transfer_leadership(self, to: str) -> None:
        await self._thread.call(self.node.transfer_leadership, to)

    async def entry_term(self, index: int) -> int:
        """The term of the entry at `index`, read on the Raft loop (a backup's header names
        it). ValueError when the log no longer holds it (compacted past it)."""
        return await self._thread.call(lambda: self.node.core.snapshot_meta(index).term)

    # ------------------------------------------------------------------ callbacks from the Raft thread

    def _leader_changed(self, leader_id: str) -> None:
        if self._on_leader_change is not None and self._caller_loop is not None:
            self._caller_loop.call_soon_threadsafe(self._on_leader_change, leader_id)

    def _fatal(self, exc: BaseException) -> None:
        if self._on_fatal is not None:
            self._on_fatal(exc)
