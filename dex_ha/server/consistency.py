"""The replica check (after etcd's corruption check): do all nodes hold the same state?

Every `consistency_check_interval_ms` the active node proposes a `CheckStateHash` entry.
Each node, when it applies it, hashes its state as of exactly that index: the engine ends
its transaction right after the entry, and a read transaction on a connection of its own
pins that state (WAL mode), which a worker thread then hashes while applies go on (see
Engine.open_state_hash). So the hashes compare like with like, and hashing a large state
never stalls the Raft loop.

Each follower sends its (index, hash) to the leader as a note over the authenticated Raft
transport (the peer link needs no API token). The leader compares the hashes of an index
as they arrive: once one hash is held by a majority of the members, a member whose hash
differs is divergent. The leader then proposes `SetConsistencyAlarm`, so the alarm is in
the replicated state and every node knows it. A member under the alarm is barred from
leading (RaftCore.set_barred): it never campaigns, no leadership is transferred to it, and
if it leads it hands the leadership over. The alarm clears by itself at the first check
where the member's hash agrees with the majority again (once it has been replaced).

The alarm shows in `GET /v1/cluster` (`consistency_alarms`, and per member
`consistency_alarm`), in `dex-ha status`, in the console, as the metric
`dex_consistency_alarm{member}`, and in an ERROR line naming the member, index and hashes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from dex_ha.background import ActiveNodeTimer
from dex_ha.engine import CheckStateHash, Propose, SetConsistencyAlarm
from dex_ha.raft.errors import NotLeader, ProposalDropped

if TYPE_CHECKING:
    from dex_ha.raft.threaded import RaftThread
    from dex_ha.server.metrics import ServerMetrics

log = logging.getLogger("dex_ha.server.consistency")

KEEP_CHECKS = 16  # the recent indexes whose hashes a node keeps
NOTE_KIND = "state_hash"


def encode_note(index: int, digest: str) -> bytes:
    packed: bytes = msgpack.packb([NOTE_KIND, index, digest], use_bin_type=True)
    return packed


def decode_note(data: bytes) -> tuple[int, str] | None:
    """(index, hash) of a state-hash note; None for anything else (a newer kind of note)."""
    try:
        kind, index, digest = msgpack.unpackb(data, raw=False)
    except Exception:
        return None
    if kind != NOTE_KIND or not isinstance(index, int) or not isinstance(digest, str):
        return None
    return index, digest


def divergent_members(hashes: dict[str, str], members: int) -> tuple[str, dict[str, str]] | None:
    """The majority's hash and the members whose hash differs from it, once one hash is
    held by more than half of `members`; None until then (or if no hash ever is)."""
    counts: dict[str, int] = {}
    for digest in hashes.values():
        counts[digest] = counts.get(digest, 0) + 1
    majority = next((d for d, n in counts.items() if n > members // 2), None)
    if majority is None:
        return None
    return majority, {node: digest for node, digest in hashes.items() if digest != majority}


class ConsistencyCheck:
    """One node's part of the replica check (see the module docstring). Runs on the node's
    HTTP loop; the Raft thread reaches it only through the loop (note and hash callbacks)."""

    def __init__(
        self,
        node_id: str,
        raft: RaftThread[Any],
        metrics: ServerMetrics,
        propose: Propose,
        interval_ms: int,
    ) -> None:
        self.node_id = node_id
        self._raft = raft
        self._metrics = metrics
        self._propose = propose
        self._interval_ms = interval_ms
        self.own: OrderedDict[int, str] = OrderedDict()  # index -> this node's hash
        self._reports: OrderedDict[int, dict[str, str]] = OrderedDict()  # on the leader: index -> {member: hash}
        self._handled: set[tuple[int, str]] = set()  # (index, member) verdicts already proposed
        self.alarms: dict[str, int] = {}  # the replicated alarms: member -> index of the check
        self._timer = ActiveNodeTimer("consistency-check", interval_ms / 1000, self._propose_check)
        self._pending: set[asyncio.Task[None]] = set()  # alarm proposals in flight

    # ------------------------------------------------------------------ lifecycle

    def start(self, is_serving: Callable[[], bool]) -> None:
        if self._interval_ms > 0:
            self._timer.start(is_serving)

    async def stop(self) -> None:
        await self._timer.stop()

    async def _propose_check(self) -> None:
        """On the active node, a CheckStateHash entry every interval (a timer, not a wait)."""
        try:
            await self._propose(CheckStateHash(at=int(time.time() * 1000)))
        except (NotLeader, ProposalDropped):
            pass  # the next active node proposes the next one

    # ------------------------------------------------------------------ hashes

    def on_own_hash(self, index: int, digest: str) -> None:
        """This node hashed its state at `index` (a worker thread finished; on the loop)."""
        _remember(self.own, index, digest)
        view = self._raft.view
        if view.is_leader:
            self._on_report(self.node_id, index, digest)
        elif view.leader_id:
            self._raft.send_note(view.leader_id, encode_note(index, digest))

    def on_note(self, sender: str, data: bytes) -> None:
        note = decode_note(data)
        if note is not None and self._raft.view.is_leader:
            self._on_report(sender, *note)

    def _on_report(self, member: str, index: int, digest: str) -> None:
        reports = self._reports.get(index)
        if reports is None:
            reports = {}
            _remember(self._reports, index, reports)
        reports[member] = digest
        verdict = divergent_members(reports, len(self._raft.members()))
        if verdict is None:
            return
        majority, divergent = verdict
        for node, digest_found in divergent.items():
            self._raise(node, index, digest_found, majority, agreeing=sorted(n for n in reports if n not in divergent))
        for node in reports:
            if node not in divergent and node in self.alarms and (index, node) not in self._handled:
                self._handled.add((index, node))
                log.warning(
                    "consistency check at index %d: %s agrees with the majority again; clearing its alarm", index, node
                )
                self._spawn(SetConsistencyAlarm(at=int(time.time() * 1000), node_id=node, index=index, raised=False))

    def _raise(self, node: str, index: int, found: str, expected: str, agreeing: list[str]) -> None:
        if (index, node) in self._handled:
            return
        self._handled.add((index, node))
        self._metrics.consistency_mismatches.inc()
        log.error(
            "consistency check at index %d: member %s's state hash is %s, the majority's (%s) is %s: its "
            "state differs from the others'. It is under the consistency alarm and will not become the "
            'leader; replace it (docs/operations.md, "The consistency alarm")',
            index,
            node,
            found,
            ", ".join(agreeing),
            expected,
        )
        if node not in self.alarms:
            cmd = SetConsistencyAlarm(
                at=int(time.time() * 1000), node_id=node, index=index, raised=True, found=found, expected=expected
            )
            self._spawn(cmd)

    def _spawn(self, cmd: SetConsistencyAlarm) -> None:
        task = asyncio.create_task(self._propose_alarm(cmd), name="consistency-alarm")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _propose_alarm(self, cmd: SetConsistencyAlarm) -> None:
        try:
            await self._propose(cmd)
        except (NotLeader, ProposalDropped) as exc:
            self._handled.discard((cmd.index, cmd.node_id))  # the next check decides again
            log.warning("consistency alarm for %s not recorded (%s); the next check tries again", cmd.node_id, exc)

    # ------------------------------------------------------------------ the replicated alarms

    def on_alarms(self, alarms: dict[str, int]) -> None:
        """The replicated alarms changed (or were read at start): bar those members from leading."""
        if alarms == self.alarms:
            return
        self.alarms = dict(alarms)
        self._raft.set_barred(frozenset(alarms))
        if self.node_id in alarms:
            log.error(
                "node %s is under the consistency alarm (its state differed from the majority's at index %d): "
                'it will not become the leader. Replace it (docs/operations.md, "The consistency alarm")',
                self.node_id,
                alarms[self.node_id],
            )

    def view(self) -> dict[str, Any]:
        """For /v1/cluster: the members under the alarm, and this node's latest hash."""
        latest = next(reversed(self.own.items()), None)
        return {
            "consistency_alarms": {node: {"index": index} for node, index in sorted(self.alarms.items())},
            "state_hash": {"index": latest[0], "sha256": latest[1]} if latest else None,
        }


def _remember(recent: OrderedDict[int, Any], index: int, value: Any) -> None:
    recent[index] = value
    while len(recent) > KEEP_CHECKS:
        recent.popitem(last=False)
