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
from typing import Any, Generic, TypeVar, Unpack

from .errors import NotLeader
from .loop_thread import LoopThread
from .node import Member, NodeConfig, NodeHooks, RaftNode, StateMachine
from .status import RaftView, Status
from .types import ConfChange

T = TypeVar("T")
R = TypeVar("R")


class _Handoff(Generic[T]):
    """Items put on one thread, handed to `deliver` on `loop` in batches.

    One `call_soon_threadsafe` (one wake-up of the target loop: a write to its self-pipe)
    per batch, not per item: under load hundreds of items cross between two wake-ups.
    The first put of a batch schedules the delivery; later puts join it until it runs.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[list[T]], None]) -> None:
        self._loop = loop
        self._deliver_batch = deliver
        self._items: list[T] = []
        self._lock = threading.Lock()

    def put(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
            first = len(self._items) == 1
        if first:
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        self._deliver_batch(items)


_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]


def _settle_outcomes(outcomes: list[_Outcome]) -> None:
    """On the caller's loop: set each proposal's outcome on its future."""
    for future, result, exc in outcomes:
        if future.done():  # the caller gave up (its request was cancelled)
            continue
        if exc is None:
            future.set_result(result)
        else:
            future.set_exception(exc)


class _ReplyToLoop:
    """Carries a proposal's outcome from the Raft thread to a future on the caller's loop,
    through the batched hand-off (one Ready settles many proposals at once)."""

    __slots__ = ("future", "_outbox")

    def __init__(self, future: asyncio.Future[Any], outbox: _Handoff[_Outcome]) -> None:
        self.future = future
        self._outbox = outbox

    def done(self) -> bool:
        return self.future.done()  # a read of the caller's future: at worst stale, never wrong

    def set_result(self, result: Any) -> None:
        self._outbox.put((self.future, result, None))

    def set_exception(self, exc: BaseException) -> None:
        self._outbox.put((self.future, None, exc))


class RaftThread(Generic[R]):
    """Runs `RaftNode(config, state_machine)` on a thread of its own (see the module doc);
    `R` is what the state machine answers for an entry, and so what `propose` returns."""

    def __init__(self, config: NodeConfig, state_machine: StateMachine[R], **hooks: Unpack[NodeHooks]) -> None:
        """The hooks are RaftNode's; `on_leader_change` and `on_note(sender, data)` are called
        on the caller's loop (see RaftNode.send_note), `on_fsync` and `on_fatal` on the Raft thread."""
        self._on_leader_change = hooks.get("on_leader_change")
        self._on_fatal = hooks.get("on_fatal")
        self._on_note = hooks.get("on_note")
        self.node: RaftNode[R] = RaftNode(
            config,
            state_machine,
            on_leader_change=self._leader_changed,
            on_fsync=hooks.get("on_fsync"),
            on_fatal=self._fatal,
            on_note=self._note_received,
        )
        self._thread = LoopThread(f"raft-{config.id}")
        self._caller_loop: asyncio.AbstractEventLoop | None = None
        self._outbox: _Handoff[_Outcome] | None = None  # proposal outcomes, to the caller's loop
        self._inbox: _Handoff[tuple[bytes, _ReplyToLoop]] | None = None  # proposals, to the Raft loop

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the thread and the node on it; returns once the node listens."""
        self._caller_loop = asyncio.get_running_loop()
        self._outbox = _Handoff(self._caller_loop, _settle_outcomes)
        await self._thread.start(self.node.start)
        assert self._thread.loop is not None
        self._inbox = _Handoff(self._thread.loop, self._enqueue_proposals)

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

    @property
    def cluster_id(self) -> str:
        """The cluster this node's data belongs to ("" until known; see identity.py)."""
        return self.node.cluster_id

    def members(self) -> dict[str, Member]:
        return self.node.members()  # a copy, replaced as a whole on the Raft thread

    async def status(self) -> Status:
        """The core's full status (members, progress), read on the Raft loop."""
        return await self._thread.call(self.node.status)

    # ------------------------------------------------------------------ requests

    async def propose(self, data: bytes) -> R:
        """Replicate `data`, apply it, and return the state machine's result (see RaftNode.propose)."""
        view = self.view
        if not view.is_leader:
            raise NotLeader(view.leader_id)
        assert self._inbox is not None and self._outbox is not None and self._caller_loop is not None
        future: asyncio.Future[R] = self._caller_loop.create_future()
        self._inbox.put((data, _ReplyToLoop(future, self._outbox)))
        return await future

    def _enqueue_proposals(self, proposals: list[tuple[bytes, _ReplyToLoop]]) -> None:
        """On the Raft loop: queue a batch of proposals for the node's next turn."""
        for data, reply in proposals:
            self.node.enqueue(data, reply)

    async def change_membership(self, cc: ConfChange) -> None:
        await self._thread.run(self.node.change_membership(cc))

    async def transfer_leadership(self, to: str) -> None:
        await self._thread.call(self.node.transfer_leadership, to)

    def send_note(self, to: str, data: bytes) -> None:
        """Send an application note to member `to` (see RaftNode.send_note); from any thread."""
        self._on_raft_loop(lambda: self.node.send_note(to, data))

    def set_barred(self, members: frozenset[str]) -> None:
        """Members that must not become leader (see RaftCore.set_barred); from any thread.
        Before start() it applies at once."""
        self._on_raft_loop(lambda: self.node.set_barred(members))

    def _on_raft_loop(self, call: Callable[[], None]) -> None:
        loop = self._thread.loop
        if loop is None:  # not started yet: nothing else touches the node
            call()
        else:
            loop.call_soon_threadsafe(call)

    async def entry_term(self, index: int) -> int:
        """The term of the entry at `index`, read on the Raft loop (a backup's header names
        it). ValueError when the log no longer holds it (compacted past it)."""
        return await self._thread.call(lambda: self.node.core.snapshot_meta(index).term)

    # ------------------------------------------------------------------ callbacks from the Raft thread

    def _leader_changed(self, leader_id: str) -> None:
        if self._on_leader_change is not None and self._caller_loop is not None:
            self._caller_loop.call_soon_threadsafe(self._on_leader_change, leader_id)

    def _note_received(self, sender: str, data: bytes) -> None:
        if self._on_note is not None and self._caller_loop is not None:
            self._caller_loop.call_soon_threadsafe(self._on_note, sender, data)

    def _fatal(self, exc: BaseException) -> None:
        if self._on_fatal is not None:
            self._on_fatal(exc)
